"""StableHLO-to-StableHLO passes: a pipeline of named, configurable passes.

    from neuron_compile.passes import parse_pipeline
    pipeline = parse_pipeline("canonicalize,pad-to-multiple{multiple=128},fuse")
    stats = pipeline.run(module)            # torch_mlir.ir.Module, mutated in place
    text, stats = pipeline.run_on_text(mlir_text)

Passes: ``canonicalize`` (fold importer leftovers), ``pad-to-multiple``
(pad dot_general / convolution dims to multiples of 128, slice back), ``fuse``
(outline fusion regions as ``stablehlo.composite "neuron.<kind>"``).
This package imports nothing of ``neuron_compile`` but itself, nor ``neuron_compile.runtime``.
"""
from .pass_result import PassResult
from .pipeline import DEFAULT_PIPELINE, PROFILES, PassStat, Pipeline, parse_pipeline
from .pass_registry import PASSES, PipelineError

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "PROFILES",
    "PassResult",
    "PassStat",
    "Pipeline",
    "PipelineError",
    "parse_pipeline",
]
