"""The capture stage: what Dynamo and AOTAutograd hand us, up to a static FX graph per call.

* ``backend``: the ``neuron`` Dynamo backend (``neuron_backend``, the
  ``torch_dynamo_backends`` entry point), AOTAutograd with our decomposition
  table and partitioner, and ``CompiledGraph``, the callable AOTAutograd gets
  for each graph (static, bucketed or specialized per exact shape);
* ``precompile``: what makes Dynamo's precompile package safe to save and to
  load (the tag, the guards PyTorch cannot save or load, the vouched rewrites);
* ``bucketing``: the analysis that proves a symbolic graph exact at bucket
  sizes; ``bucket_padding``: rounding sizes up, the re-trace at the bucket,
  padding inputs and slicing outputs, per call;
* ``fallback``: ``fallback=eager``, ops that don't lower run eagerly between
  compiled parts;
* ``graph_rewrites``: FX rewrites of AOTAutograd's graphs (CSE before the
  partitioner, the one-hot sum fold before planning);
* ``associative_scan``: a generic-mode ``associative_scan`` traced as PyTorch's
  op for our backend (Mamba's selective scan), expanded at concrete sizes;
* ``options``: the backend's options and their environment variables.

Each static graph goes to ``neuron_compile.compiler``. This ``__init__``
imports nothing, so ``compiler`` can read ``options``, ``graph_rewrites`` and
``associative_scan`` (leaf modules) without loading the backend.
"""
