"""neuron_compile: a torch.compile backend, Dynamo -> AOTAutograd -> Torch-MLIR -> StableHLO -> XLA.

``torch.compile(model, backend="neuron")`` works with no import (the backend is
registered through the ``torch_dynamo_backends`` entry point). This package
holds the backend, the lowering from FX to StableHLO and the CLI; ``passes``
holds the StableHLO passes and ``runtime`` the artifact format, the cache and
the XLA executor.

Public API: ``compile_reports()`` (one ``CompileReport`` per compiled graph),
``COUNTERS`` (graphs, compiles, cache hits...), ``reset()``, ``LoweringError``.
"""

from .lowering import LoweringError
from .report import COUNTERS, CompileReport, compile_reports, format_table, reset

__version__ = "0.1.0"

__all__ = ["COUNTERS", "CompileReport", "LoweringError", "compile_reports", "format_table", "reset", "__version__"]
