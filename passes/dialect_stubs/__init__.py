"""Empty Python modules for the dialects torch-mlir ships without Python op classes.

Every time the MLIR bindings hand out an op (``block.operations``, ``value.owner``,
``use.owner``, a ``walk`` callback) they look for the Python module of the op's
dialect under each search prefix (``torch_mlir.dialects.<namespace>``) and
remember only the ones that import. ``stablehlo`` and ``chlo`` have none, so
each such op cost a failed import, about 30 us: 63k failed imports were 90% of
the passes' time on a 32-layer GPT. ``stablehlo_ops`` appends this package as
a last search prefix, so those lookups find an empty module once and are
cached; the ops stay generic ``OpView``s, as before. Dialects that do ship
modules are still found first under ``torch_mlir.dialects``.
"""
