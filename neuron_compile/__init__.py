"""neuron_compile: a torch.compile backend, Dynamo -> AOTAutograd -> Torch-MLIR -> StableHLO -> XLA.

``torch.compile(model, backend="neuron")`` works with no import (the backend is
registered through the ``torch_dynamo_backends`` entry point); installed, it also
makes ``neuron`` a PyTorch device (``device``). This package is laid out by the
pipeline's stages, imports going one way, top down (``tests/test_layout.py``'s
``LAYERS``, ``docs/architecture.md``):

* ``cli``: the ``neuron-compile`` command line, bench, model specs;
* ``device``: the ``neuron`` device, its eager ops, queue and collectives;
* ``capture``: the Dynamo backend (``capture.backend.neuron_backend``),
  AOTAutograd, precompile, the eager fallback;
* ``bucketing``: shape bucketing, for the backend and the device;
* the spine: ``compiler`` (one static FX graph through every stage),
  ``graph_keys``, ``dump``, ``output_views``, ``index_bounds``;
* ``kernels``: hand-written kernels swapped in by name;
* ``lowering``: FX -> Torch-MLIR -> StableHLO, and the ops JAX lowers;
  ``decompositions``: the decomposition table and FX rewrites;
* leaves: ``options``, ``report``, ``traced``;
* ``passes`` (the StableHLO passes) and ``runtime`` (the artifact format, the
  cache, the XLA executor), kept at the repository's top and installed as
  ``neuron_compile.passes`` and ``neuron_compile.runtime``: neither imports
  the rest of this package.

Public API: ``compile_reports()`` (one ``CompileReport`` per compiled graph),
``COUNTERS`` (graphs, compiles, cache hits...), ``cache_stats()`` (memory and
disk hits, misses, compiles, bytes, compile time saved, the disk cache's
state), ``reset()``, ``LoweringError``.
"""

from ._version import __version__  # graph_keys puts it in every key

# torch first: its import runs our device's entry point, which loads this package's profiling hooks; were
# torch imported from inside report (through _profiler_hooks), that entry point would meet them half made
import torch  # noqa: F401,E402

from . import report as _report
from .report import COUNTERS, CompileReport, compile_reports, format_table


def __getattr__(name):
    # ``import torch`` imports this package (the neuron device's entry point): the lowering loads
    # only when asked for
    if name == "LoweringError":
        from .lowering import LoweringError

        return LoweringError
    raise AttributeError(f"module 'neuron_compile' has no attribute {name!r}")


def reset() -> None:
    """Forget reports, zero the counters and empty the in-memory executable cache (not the disk), the
    device's sightings of growing lengths with their bucketed kernels, and its fused runs of eager ops (the
    device's builds under way are waited for first, so none is counted after the zeroing)."""
    import sys

    from .compiler import MEMORY

    queue = sys.modules.get("neuron_compile.device.op_queue")
    if queue is not None:  # the device's queue runs; its runs' sightings and fused executables go (first: the
        queue.reset()  # builds under way are waited for, so that their compiles are counted before the zeroing)
    _report.reset()
    MEMORY.clear()
    lengths = sys.modules.get("neuron_compile.device.lengths")
    if lengths is not None:  # loaded with the device's first op, not before
        lengths.forget()


def cache_stats(options=None) -> dict:
    """Cache counters of this process (``process``) and the disk cache's entries, bytes, cap and totals (``disk``)."""
    from .compiler import cache_stats as stats

    return stats(options)


__all__ = ["COUNTERS", "CompileReport", "LoweringError", "cache_stats", "compile_reports", "format_table", "reset",
           "__version__"]
