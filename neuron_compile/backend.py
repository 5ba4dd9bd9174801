"""The ``neuron`` Dynamo backend: Dynamo -> AOTAutograd -> our compile path.

``torch.compile(model, backend="neuron")`` finds ``neuron_backend`` through the
``torch_dynamo_backends`` entry point (pyproject.toml), so users import
nothing. For each graph Dynamo captures, AOTAutograd (with our decomposition
table and the min-cut rematerialization partitioner) produces an inference
graph, or a forward and a backward graph, and hands each to ``_graph_compiler``,
which wraps a ``CompiledGraph``.

Static and symbolic graphs
--------------------------
A static graph is compiled at once. A graph with symbolic sizes (Dynamo's
automatic dynamic shapes after a second shape, ``dynamic=True``,
``mark_dynamic``) is compiled lazily:

* bucketed (the default, ``bucketing.py``): sizes round up to a bucket, the
  symbolic graph is re-traced at the bucket's sizes with the padding made
  exact, and one executable serves every size in the bucket;
* per exact shape (``buckets=0``, or when the bucketing analysis can't prove a
  graph exact): the symbolic graph is re-traced with ``make_fx`` on the call's
  concrete sizes, which bakes every SymInt into a constant.

Either way node metadata (the user's source lines) is preserved and the static
result goes through the same ``compile_graph``. We never switch Dynamo's
dynamic shapes off.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from .bucketing import (BucketAnalysis, BucketInterpreter, SymOutput, analyze, pad_to_bucket, round_up,
                        slice_from_bucket, sym_to_value)
from .compiler import Executable
from .fallback import compile_with_fallback  # compile_graph, or partly eager with fallback=eager
from .decompositions import decompose_before_autograd, decomposition_table
from .options import Options
from .report import COUNTERS, CompileReport, record

log = logging.getLogger("neuron_compile")

_GRAPH_IDS = itertools.count()


def _is_symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    return False


def _describe(args, positions) -> str:
    parts = []
    for i in positions:
        a = args[i]
        if isinstance(a, torch.Tensor):
            parts.append(f"{i}:{list(a.shape)}")
        else:
            parts.append(f"{i}={a}")
    return " ".join(parts)


class CompiledGraph:
    """What AOTAutograd calls for one graph: a boxed callable over XLA executables."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, *, name: str, kind: str, options: Options,
                 aot_seconds: float = 0.0, boundary_layouts: dict | None = None):
        self.name = name
        self.kind = kind
        self.options = options
        self.gm = gm
        self._lock = threading.Lock()
        # Positions whose value or shape can change between calls.
        self.dynamic_positions = tuple(i for i, a in enumerate(example_inputs) if _is_symbolic(a))
        self.specializations: dict[tuple, Executable] = {}
        self.static: Executable | None = None
        self._aot_seconds = aot_seconds
        self.bucketing: BucketAnalysis | None = None
        if not self.dynamic_positions:
            report = self._new_report("")
            self.static = compile_with_fallback(gm, report=report, options=options)
            record(report)
        elif options.buckets:
            # one executable per bucket when the analysis proves it exact, else per exact shape
            self.bucketing = analyze(gm, boundary_layouts)
            if self.bucketing.ok:
                if boundary_layouts is not None and kind == "forward":
                    boundary_layouts.update({name: lay for name, lay in zip(self.bucketing.output_names,
                                                                           self.bucketing.output_layouts)
                                             if isinstance(lay, tuple)})
                COUNTERS["bucketed_graphs"] += 1
            else:
                COUNTERS["bucketing_fallbacks"] += 1
                log.info("neuron_compile: %s compiles per exact shape: %s", name, self.bucketing.reason)

    def _new_report(self, signature: str) -> CompileReport:
        report = CompileReport(graph=self.name, kind=self.kind, signature=signature)
        if self._aot_seconds:
            report.stages["aot-autograd"] = self._aot_seconds
            self._aot_seconds = 0.0
        return report

    def _key(self, args) -> tuple:
        key = []
        for i in self.dynamic_positions:
            a = args[i]
            key.append(tuple(a.shape) if isinstance(a, torch.Tensor) else a)
        return tuple(key)

    def __call__(self, args: list) -> list:
        if self.static is not None:
            return self.static(args)
        if self.bucketing is not None and self.bucketing.ok:
            return self._call_bucketed(args)
        key = self._key(args)
        executable = self.specializations.get(key)
        if executable is None:
            executable = self._specialize(key, args)
        return executable(args)

    def _specialize(self, key, args) -> Executable:
        return self._compile_once(key, _describe(args, self.dynamic_positions), lambda: specialize(self.gm, args))

    def _compile_once(self, key, signature: str, trace, counter: str | None = None) -> Executable:
        """Compile the static graph ``trace()`` returns, once per key, threads waiting on one compile."""
        with self._lock:
            if key in self.specializations:
                return self.specializations[key]
            report = self._new_report(signature)
            with report.stage("specialize"):
                static_gm = trace()
            executable = compile_with_fallback(static_gm, report=report, options=self.options)
            record(report)
            COUNTERS["specializations"] += 1
            if counter:
                COUNTERS[counter] += 1
            self.specializations[key] = executable
            return executable

    # -- bucketed path: pad to the bucket, run the bucket's executable, slice back ------------

    def _call_bucketed(self, args: list) -> list:
        analysis = self.bucketing
        true_env = {}
        for symbol, (pos, dim) in analysis.bindings.items():
            true_env[symbol] = int(args[pos].shape[dim]) if dim is not None else int(args[pos])
        bucket_env = dict(true_env)
        for symbol in analysis.symbols:
            bucket_env[symbol] = round_up(true_env[symbol], self.options.buckets)
        key = tuple(bucket_env[s] for s in analysis.symbols) + tuple(true_env[s] for s in analysis.value_symbols)
        padded = list(args)
        for pos, layout in analysis.input_layouts.items():
            padded[pos] = pad_to_bucket(args[pos], layout, bucket_env, true_env)
        for pos, expr in analysis.sym_inputs.items():
            padded[pos] = sym_to_value(expr, bucket_env)
        true_sizes = torch.tensor([true_env[s] for s in analysis.symbols], dtype=torch.int64)
        executable = self.specializations.get(key)
        if executable is None:
            executable = self._specialize_bucket(key, padded, true_sizes, bucket_env)
        outs = executable(padded + [true_sizes])
        result = []
        for out, layout in zip(outs, analysis.output_layouts):
            if isinstance(layout, SymOutput):
                result.append(sym_to_value(layout.expr, true_env))
            elif isinstance(layout, tuple) and isinstance(out, torch.Tensor):
                result.append(slice_from_bucket(out, layout, bucket_env, true_env))
            else:
                result.append(out)
        return result

    def _specialize_bucket(self, key, padded, true_sizes, bucket_env) -> Executable:
        def trace():
            interpreter = BucketInterpreter(self.gm, self.bucketing, bucket_env)

            def run(*flat):
                return interpreter.run_with_true_sizes(flat[-1], *flat[:-1])

            with fx_traceback.preserve_node_meta():
                return make_fx(run, tracing_mode="fake")(*padded, true_sizes)

        buckets = ", ".join(f"{s}->{bucket_env[s]}" for s in self.bucketing.symbols)
        return self._compile_once(key, f"bucket {buckets}", trace, counter="buckets")


def specialize(gm: torch.fx.GraphModule, args: list) -> torch.fx.GraphModule:
    """Re-trace a symbolic graph on concrete arguments: every size becomes a constant."""

    def run(*flat):
        return torch.fx.Interpreter(gm).run(*flat)

    with fx_traceback.preserve_node_meta():
        return make_fx(run, tracing_mode="fake")(*args)


def _graph_compiler(kind: str, graph_id: int, options: Options, started: float, boundary: dict):
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        aot = time.perf_counter() - started if kind != "backward" else 0.0
        COUNTERS["graphs"] += 1
        graph = CompiledGraph(gm, example_inputs, name=f"g{graph_id}.{kind}", kind=kind, options=options,
                              aot_seconds=aot, boundary_layouts=boundary)

        # A plain function, not the object: AOTAutograd wraps backward compilers in
        # torch._dynamo.disable, which keeps a function's attributes (_boxed_call).
        # A static graph calls its executable straight away (one Python frame per call).
        if graph.static is not None:
            executable = graph.static

            def run(args):
                return executable(args)
        else:
            def run(args):
                return graph(args)

        run._boxed_call = True
        run.compiled_graph = graph
        return run

    return compile_fn


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Dynamo backend entry point (``torch.compile(..., backend="neuron", options={...})``)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    if kwargs.get("mode") not in (None, "default"):
        log.info("neuron backend ignores mode=%r", kwargs["mode"])
    opts = Options.resolve(options)
    graph_id = next(_GRAPH_IDS)
    started = time.perf_counter()
    decompose_before_autograd(gm)
    boundary: dict = {}  # padded layouts of forward outputs, read back by the backward
    backend = aot_autograd(
        fw_compiler=_graph_compiler("forward", graph_id, opts, started, boundary),
        bw_compiler=_graph_compiler("backward", graph_id, opts, started, boundary),
        inference_compiler=_graph_compiler("inference", graph_id, opts, started, boundary),
        decompositions=decomposition_table(),
        # Inductor's partitioner: recomputes cheap ops in the backward instead of saving
        # them, so the forward hands fewer, smaller activations to the backward
        partition_fn=min_cut_rematerialization_partition,
    )
    return backend(gm, example_inputs)
