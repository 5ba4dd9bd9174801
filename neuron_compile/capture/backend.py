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

* bucketed (the default; ``bucketing.analysis`` proves it exact, ``bucketing.padding``
  applies it): sizes round up to a bucket, the symbolic graph is re-traced at
  the bucket's sizes with the padding made exact, and one executable serves
  every size in the bucket;
* per exact shape (``buckets=0``, or when the bucketing analysis can't prove a
  graph exact): the symbolic graph is re-traced with ``make_fx`` on the call's
  concrete sizes, which bakes every SymInt into a constant.

Either way node metadata (the user's source lines) is preserved and the static
result goes through the same ``compile_graph``. We never switch Dynamo's
dynamic shapes off.

Precompile
----------
``NeuronOutputCode`` is what AOTAutograd holds for each graph and what
PyTorch's caching precompile pickles into Dynamo's package: the graph, never
machine code. What decides whether a frame's package is safe to save and to
load (the tag, the guards PyTorch 2.13 cannot save or load, the rewrites
vouched for to AOTAutogradCache) is in ``precompile``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch._inductor.output_code import OutputCode
from torch.fx.experimental.proxy_tensor import make_fx

from ..compiler import Executable, cached_executable
from ..dynamo_skips import hide_compile_stack_from_dynamo as _hide_compile_stack_from_dynamo
from ..output_views import _storage, find_output_views, make_view
from .. import _profiler_hooks, structured_trace
from ..report import COUNTERS, CompileReport, record
from ..decompositions.associative_scan import install as _install_associative_scan, mark_backend
from ..options import Options, _env_flag
from .partition import partition
from .precompile import (_bypass_reason, _cacheable_rewrites, _precompile_tag, _refused_unloadable_package,
                         _save_precompiled, _skip_unsaveable_frame, _summarize_dropped_guards, _user_options,
                         precompile_enabled)

# Imported where first used, not here: bucketing (symbolic graphs), fallback
# (the compile path) and decompositions (tracing). A process that loads a precompiled package needs none
# of them, and their imports were 24 ms of its 1 s warm start.

log = logging.getLogger("neuron_compile")

_GRAPH_IDS = itertools.count()


def _is_symbolic(value) -> bool:
    """Whether an example input can differ between calls of one graph: a SymInt/SymFloat/SymBool,
    or a tensor with a symbolic size, stride or storage offset."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return (any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))
                or isinstance(value.storage_offset(), torch.SymInt))
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    return False


_STORAGE_READERS = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default,
                    torch.ops.aten.as_strided_scatter.default)


def _storage_offset_readers(gm: torch.fx.GraphModule) -> set[int]:
    """Positions of the inputs an ``as_strided`` reads through (itself or a view of it): its
    storage offset is absolute, so what it reads depends on where the input starts in its storage,
    which Dynamo's guards do not check. Such an input's offset selects the executable."""
    def storage(node):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        return _storage(val) if isinstance(val, torch.Tensor) and val.layout == torch.strided else None

    read = {storage(n.args[0]) for n in gm.graph.nodes if n.op == "call_function" and n.target in _STORAGE_READERS}
    read.discard(None)
    if not read:
        return set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i for i, n in enumerate(placeholders) if storage(n) in read}


def _signature_part(value):
    """What a specialization bakes in from one dynamic input: a tensor's size, stride and storage
    offset, or a scalar's type and exact value (repr: ``-0.0`` and ``0.0`` compare equal as floats
    but are different constants; ``True`` and ``1`` as well)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return (tuple(value.shape),)
        return (tuple(value.shape), value.stride(), value.storage_offset())
    return (type(value).__name__, repr(value))


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
                 aot_seconds: float = 0.0, boundary_layouts: dict | None = None,
                 dynamic_positions: tuple | None = None, stage: str = "aot-autograd"):
        self.name = name
        self.kind = kind
        self.options = options
        self.gm = gm
        self._lock = threading.Lock()
        # Positions whose value or shape can change between calls, and inputs whose storage offset
        # the graph reads (Dynamo does not guard offsets; as_strided is relative to the storage).
        if dynamic_positions is None:
            reads_offset = _storage_offset_readers(gm)
            dynamic_positions = tuple(i for i, a in enumerate(example_inputs) if _is_symbolic(a) or i in reads_offset)
        self.dynamic_positions = dynamic_positions
        self.specializations: dict[tuple, Executable] = {}
        self.static: Executable | None = None
        self._aot_seconds = aot_seconds
        self._aot_stage = stage
        self.bucketing = None  # a bucketing.BucketAnalysis
        self._bucket_views: list = []  # per output: an OutputView at the true sizes, or None
        # the frame's compile id: a graph compiled later (a backward, a new size) logs under it (TORCH_TRACE)
        self._compile_id = _profiler_hooks.current_compile_id()
        if not self.dynamic_positions:
            # A backward compiles at its first call: a forward run with grad enabled and no
            # backward (inference without no_grad) must not pay for it.
            if kind != "backward":
                self.static = self._compile_once((), "")
        elif options.buckets:
            # one executable per bucket when the analysis proves it exact, else per exact shape
            from ..bucketing.layouts import shape_key
            from ..bucketing.analysis import OUTPUTS, SPECIALIZED, analyze

            self.bucketing = analyze(gm, boundary_layouts, options.buckets)
            structured_trace.bucketing(name, kind, self.bucketing, options.buckets)
            if self.bucketing.ok:
                self._bucket_views = self._views_at_true_sizes(gm)
            if self.bucketing.ok:
                if boundary_layouts is not None and kind == "forward":
                    boundary_layouts.update({name: lay for name, lay in zip(self.bucketing.output_names,
                                                                           self.bucketing.output_layouts)
                                             if isinstance(lay, tuple)})
                    # what is known of their values (an index's interval, a sort's positions)
                    boundary_layouts.update({("fact", name): fact for name, fact in zip(
                        self.bucketing.output_names, self.bucketing.output_facts) if fact is not None})
                    boundary_layouts[SPECIALIZED] = self.bucketing.specialized  # the backward's sizes too
                    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
                    boundary_layouts[OUTPUTS] = [(shape_key(n.meta["val"]), lay) for n, lay in zip(
                        outs, self.bucketing.output_layouts) if isinstance(lay, tuple)]
                COUNTERS["bucketed_graphs"] += 1
            elif self.bucketing.one_size:  # a graph for one size (Dynamo recompiles for others)
                log.debug("neuron_compile: %s runs at one size: %s", name, self.bucketing.reason)
            else:
                COUNTERS["bucketing_fallbacks"] += 1
                log.debug("neuron_compile: %s compiles per exact shape: %s", name, self.bucketing.reason)

    def _views_at_true_sizes(self, gm) -> list:
        """Outputs that are views of an input or of another output (``output_views``), made at the
        true sizes after a bucketed call; a view whose sizes need a symbol no input gives keeps the
        graph at exact shapes."""
        views = find_output_views(gm)
        for view in views:
            missing = view.symbols() - set(self.bucketing.bindings) if view is not None else ()
            if missing:
                self.bucketing.ok = False
                self.bucketing.reason = (f"an output is a view whose size, stride or offset needs {sorted(map(str, missing))}, "
                                         "which no input gives")
        return views

    def _stop_bucketing(self, exc: BaseException) -> None:
        """A bucketed trace, compile or call failed: this graph compiles per exact shape from now on."""
        with self._lock:
            if self.bucketing is None or not self.bucketing.ok:
                return
            self.bucketing.ok = False
            self.bucketing.reason = f"the bucketed compile failed ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
            self.specializations.clear()
        COUNTERS["bucketing_fallbacks"] += 1
        log.debug("neuron_compile: %s compiles per exact shape: %s", self.name, self.bucketing.reason)

    def _new_report(self, signature: str) -> CompileReport:
        report = CompileReport(graph=self.name, kind=self.kind, signature=signature, compile_id=self._compile_id)
        if self._aot_seconds:
            report.stages[self._aot_stage] = self._aot_seconds
            self._aot_seconds = 0.0
        return report

    def _key(self, args) -> tuple:
        """What selects a specialization: every value of the call that re-tracing bakes into the
        static graph (``_signature_part`` of each dynamic input; the other inputs are static, and
        Dynamo's guards hold them fixed)."""
        return tuple(_signature_part(args[i]) for i in self.dynamic_positions)

    def __call__(self, args: list) -> list:
        if self.static is not None:
            return self.static(args)
        if not self.dynamic_positions:  # a static backward, at its first call
            self.static = self._compile_once((), "")
            return self.static(args)
        if self.bucketing is not None and self.bucketing.ok:
            # anything that fails on the bucketed path (the padding analysis missed a case, a rule
            # lowers only at exact shapes) must not reach the user: exact shapes are always right
            try:
                return self._call_bucketed(list(args))
            except Exception as exc:  # noqa: BLE001 - kept as the reason, then compiled exactly
                self._stop_bucketing(exc)
        key = self._key(args)
        executable = self.specializations.get(key)
        if executable is None:
            executable = self._specialize(key, args)
        return executable(args)

    def _specialize(self, key, args) -> Executable:
        return self._compile_once(key, _describe(args, self.dynamic_positions), lambda: specialize(self.gm, args))

    def _compile_once(self, key, signature: str, trace=None, counter: str | None = None,
                      padded: bool = False) -> Executable:
        """Compile once per key, threads waiting on one compile: the static graph ``trace()``
        returns (a specialization, or a bucket's graph: ``padded``), or with no ``trace`` the graph itself
        (a static graph)."""
        with self._lock:
            if key in self.specializations:
                return self.specializations[key]
            report = self._new_report(signature)
            report.padded = padded
            if trace is None:
                static_gm = self.gm
            else:
                with report.stage("specialize"):
                    static_gm = trace()
            from .fallback import compile_with_fallback  # compile_graph, or partly eager with fallback=eager

            executable = compile_with_fallback(static_gm, report=report, options=self.options)
            record(report)
            if trace is not None:
                COUNTERS["specializations"] += 1
            if counter:
                COUNTERS[counter] += 1
            self.specializations[key] = executable
            return executable

    # -- bucketed path: pad to the bucket, run the bucket's executable, slice back ------------

    def _call_bucketed(self, args: list) -> list:
        from ..bucketing.sizes import buckets_within, sym_to_value
        from ..bucketing.padding import check_sizes, pad_to_bucket, slice_from_bucket
        from ..bucketing.analysis import SymOutput

        analysis = self.bucketing
        true_env = {}
        for symbol, (pos, dim) in analysis.bindings.items():
            true_env[symbol] = int(args[pos].shape[dim]) if dim is not None else int(args[pos])
        bucket_env = dict(true_env)
        bucket_env.update(buckets_within(true_env, analysis.symbols, self.options.buckets, analysis.admits,
                                         analysis.multiples))
        key = tuple(bucket_env[s] for s in analysis.symbols) + tuple(true_env[s] for s in analysis.value_symbols)
        check_sizes(analysis.checks, true_env, bucket_env)
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
        # views of inputs and outputs, rebuilt at the true sizes from the true tensors: the padded
        # executable's were views of padded buffers (output_views says why they must be views)
        for index, view in enumerate(self._bucket_views):
            if view is None:
                continue
            if view.base_is_input:
                base = args[view.base]
            else:
                base = result[view.base] = result[view.base].contiguous()
            result[index] = make_view(base, view.concrete(lambda e: e if isinstance(e, int) else
                                                          sym_to_value(e, true_env)))
        return result

    def _specialize_bucket(self, key, padded, true_sizes, bucket_env) -> Executable:
        from ..bucketing.padding import BucketInterpreter

        def trace():
            interpreter = BucketInterpreter(self.gm, self.bucketing, bucket_env)

            def run(*flat):
                return interpreter.run_with_true_sizes(flat[-1], *flat[:-1])

            with fx_traceback.preserve_node_meta():
                return make_fx(run, tracing_mode="fake")(*padded, true_sizes)

        buckets = ", ".join(f"{s}->{bucket_env[s]}" for s in self.bucketing.symbols)
        return self._compile_once(key, f"bucket {buckets}", trace, counter="buckets", padded=True)


def specialize(gm: torch.fx.GraphModule, args: list) -> torch.fx.GraphModule:
    """Re-trace a symbolic graph on concrete arguments: every size becomes a constant."""

    from ..bucketing.padding import RetraceInterpreter

    def run(*flat):
        return RetraceInterpreter(gm).run(*flat)

    with fx_traceback.preserve_node_meta():
        return make_fx(run, tracing_mode="fake")(*args)


class NeuronOutputCode(OutputCode):
    """One compiled graph as AOTAutograd holds it, and as PyTorch's precompile stores it.

    Under precompile (``NEURON_COMPILE_PRECOMPILE=1``, or PyTorch's own
    ``TORCH_CACHING_PRECOMPILE=1``) our graph compilers are
    ``SerializableAOTDispatchCompiler``s, so AOTAutograd bundles this object
    into the package Dynamo saves: a new process that runs the same function
    loads Dynamo's guards and bytecode and AOTAutograd's graphs and runtime
    metadata, and does no Dynamo tracing and no AOTAutograd tracing.

    What is pickled is the graph, never machine code: the kind, name and
    options, our tag (version + source fingerprint + options), the FX graph
    with its node metadata (``GraphPickler``: value types and the user's source
    lines), and for a static graph its plan, FX cache key and input signature.
    A load whose tag differs is refused (Dynamo then traces afresh). The first
    call after a load finds the executable in our artifact cache by that key,
    without unpickling the FX graph; only if the artifact is gone is the graph
    unpickled and compiled again.
    """

    def __init__(self, graph: CompiledGraph, boundary: dict, *, pickled_gm: bytes | None = None,
                 on_first_call=None):
        super().__init__()
        self._boxed_call = True  # an instance attribute: torch._dynamo.disable keeps it on the backward
        self.graph = graph
        self.boundary = boundary
        self._pickled_gm = pickled_gm
        self._state = None
        self._target = graph.static if graph.static is not None else graph
        self._run = self._target
        self._name = graph.name
        if on_first_call is not None:
            def first(args):
                self._run = self._target
                on_first_call()
                return self._target(args)

            self._run = first

    def __call__(self, args: list) -> list:
        if _profiler_hooks.STATE._is_profiler_enabled:  # torch.profiler records: a neuron::graph <id> event
            with _profiler_hooks.event(f"neuron::graph {self._name}", [a for a in args if isinstance(a, torch.Tensor)],
                                       {"graph": self._name}):
                return self._run(args)
        return self._run(args)

    def prepare_for_serialization(self) -> None:
        if self._state is not None:
            return
        if self._pickled_gm is None:
            raise RuntimeError(f"{self.graph.name} was compiled without precompile: nothing to serialize")
        graph = self.graph
        static = graph.static if graph.static is not None else graph.specializations.get(())
        fast = None
        if isinstance(static, Executable) and static.front is not None:
            fast = (static.plan, static.front, static.signature)
        self._state = {"kind": graph.kind, "name": graph.name, "user_options": _user_options(graph.options),
                       "tag": _precompile_tag(graph.options), "positions": graph.dynamic_positions,
                       "gm": self._pickled_gm, "fast": fast}

    def __getstate__(self):
        self.prepare_for_serialization()
        return {"_state": self._state, "boundary": self.boundary, "_boxed_call": True}

    def __setstate__(self, state):
        # Checked while Dynamo reads the package: an exception here makes Dynamo drop the package
        # with a warning and trace afresh (one raised later, while it installs, would be fatal).
        saved = state["_state"]
        options = dataclasses.replace(Options.resolve(None), **saved["user_options"])
        if saved["tag"] != _precompile_tag(options):
            COUNTERS["precompile_stale"] += 1
            raise RuntimeError(f"neuron_compile: precompiled graph {saved['name']} was saved by other sources or "
                               f"options ({saved['tag']!r}, now {_precompile_tag(options)!r}); tracing afresh")
        self.__dict__.update(state)
        self._options = options
        self._name = saved["name"]
        self.graph = self._target = self._run = self._pickled_gm = None
        self._lock = threading.Lock()

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """On a load from a precompiled package: the first call finds the executable."""
        if self._run is None:
            self._run = self._load_and_run
            COUNTERS["precompile_loads"] += 1

    def _load_and_run(self, args: list) -> list:
        with self._lock:
            if self._target is None:
                self._target = self._load()
            self._run = self._target
        return self._target(args)

    def _load(self):
        state, options = self._state, self._options
        report = CompileReport(graph=state["name"], kind=state["kind"], signature="precompiled")
        if state["fast"] is not None:
            plan, front, signature = state["fast"]
            executable = cached_executable(front, plan, signature, self._unpickle_gm, report=report, options=options)
            record(report)
            return executable
        started = time.perf_counter()
        gm = self._unpickle_gm()
        self.graph = CompiledGraph(gm, None, name=state["name"], kind=state["kind"], options=options,
                                   aot_seconds=time.perf_counter() - started, boundary_layouts=self.boundary,
                                   dynamic_positions=state["positions"], stage="precompile-load")
        return self.graph.static if self.graph.static is not None else self.graph

    def _unpickle_gm(self) -> torch.fx.GraphModule:
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        gm = GraphPickler.loads(self._state["gm"], FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()))
        gm.recompile()
        return gm

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


def _graph_compiler(kind: str, graph_id: int, options: Options, started: float, boundary: dict, precompile: bool):
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        aot = time.perf_counter() - started if kind != "backward" else 0.0
        COUNTERS["graphs"] += 1
        pickled = None
        if precompile:  # before compiling: planning rewrites the graph in place
            from torch.fx._graph_pickler import GraphPickler, Options as PickleOptions

            pickled = GraphPickler.dumps(gm, PickleOptions(ops_filter=None))
        graph = CompiledGraph(gm, example_inputs, name=f"g{graph_id}.{kind}", kind=kind, options=options,
                              aot_seconds=aot, boundary_layouts=boundary)
        return NeuronOutputCode(graph, boundary, pickled_gm=pickled,
                                on_first_call=_save_precompiled if precompile and kind != "backward" else None)

    if not precompile:
        return compile_fn
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    return SerializableAOTDispatchCompiler(NeuronOutputCode, compile_fn)


@mark_backend
def neuron_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Dynamo backend entry point (``torch.compile(..., backend="neuron", options={...})``)."""
    from torch._dynamo.backends.common import aot_autograd

    from ..decompositions import decomposition_table
    from ..decompositions.pre_autograd import decompose_before_autograd

    if kwargs.get("mode") not in (None, "default"):
        log.info("neuron backend ignores mode=%r", kwargs["mode"])
    opts = Options.resolve(options)
    _skip_log_once_from_env()  # for the frames Dynamo traces after this one
    graph_id = next(_GRAPH_IDS)
    started = time.perf_counter()
    decompose_before_autograd(gm)
    boundary: dict = {}  # padded layouts of forward outputs, read back by the backward
    # A frame whose package could not be loaded is kept out of it before AOTAutograd runs, and then
    # compiled as without precompile: AOTAutogradCache's key alone costs ~1 s in every process
    if precompile_enabled():
        _summarize_dropped_guards()  # Dynamo drops identity guards whether or not this frame is saved
        _skip_unsaveable_frame(graph_id)
    precompile = precompile_enabled() and opts.cache and not _refused_unloadable_package(graph_id)
    backend = aot_autograd(
        fw_compiler=_graph_compiler("forward", graph_id, opts, started, boundary, precompile),
        bw_compiler=_graph_compiler("backward", graph_id, opts, started, boundary, precompile),
        inference_compiler=_graph_compiler("inference", graph_id, opts, started, boundary, precompile),
        decompositions=decomposition_table(),
        partition_fn=partition,
    )
    if not precompile:
        return backend(gm, example_inputs)
    # Precompile: AOTAutograd bundles our NeuronOutputCode (not an Inductor FX-cache key) into the
    # artifact Dynamo's package refers to, under a key that includes our tag. The backward is
    # partitioned now rather than at the first backward call, so the bundle is complete when this
    # returns; our CompiledGraph still defers the backward's XLA compile to its first call.
    from torch._dynamo.utils import counters

    bypasses = counters["aot_autograd"]["autograd_cache_bypass"]
    tag = _precompile_tag(opts)
    # AOTAutogradCache saves only graphs whose calls it knows; our SDPA rewrite (decompositions.
    # pre_autograd._sdpa_math) is vouched for under our tag, which already holds the fingerprint of our sources
    vouched = {f"{fn.__module__}.{fn.__name__}": tag for fn in _cacheable_rewrites()}
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            torch.compiler.config.patch(cache_key_tag=tag), \
            torch._inductor.config.patch(unsafe_marked_cacheable_functions=vouched):
        result = backend(gm, example_inputs)
    if counters["aot_autograd"]["autograd_cache_bypass"] > bypasses:
        # nothing of this graph goes into the package: say so, with PyTorch's reason
        COUNTERS["precompile_bypasses"] += 1
        log.warning("neuron_compile: precompile cannot save graph g%d, so a new process will trace it again: "
                    "AOTAutogradCache refused it (%s)", graph_id, _bypass_reason(gm))
    return result


def skip_log_once_calls(enabled: bool = True) -> list:
    """Let Dynamo skip Hugging Face's once-only log calls instead of breaking the graph on them.

    transformers adds ``warning_once`` and ``info_once`` to ``logging.Logger``; Dynamo cannot
    trace a logger method, so each such call inside a model breaks the graph and makes Dynamo
    trace the frame again. GPT2LMHeadModel's ``loss_function`` property warns that way on every
    training step with labels: the step then compiles as two graphs after a second trace
    (measured, GPT-2 4 layers: first step 8.5 s against 6.0 s, steady step 0.149 s against
    0.132 s). Listing the methods in ``torch._dynamo.config.ignore_logging_functions`` makes
    them no-ops inside compiled code (the message is not printed there) and keeps one graph.

    Called when torch.compile first looks the backend up (a script has imported transformers
    by then: it built the model) and again at every graph, so a transformers imported later
    is covered from the next graph Dynamo traces. ``NEURON_COMPILE_SKIP_LOG_ONCE=0`` keeps
    Dynamo's default. Returns the methods now skipped.
    """
    ignored = torch._dynamo.config.ignore_logging_functions
    methods = [m for m in (getattr(logging.Logger, name, None) for name in _LOG_ONCE_METHODS) if m is not None]
    for method in methods:
        if enabled:
            ignored.add(method)
        else:
            ignored.discard(method)
    return methods if enabled else []


_LOG_ONCE_METHODS = ("warning_once", "info_once")


def _skip_log_once_from_env() -> None:
    if _env_flag("NEURON_COMPILE_SKIP_LOG_ONCE", True):
        skip_log_once_calls()


_skip_log_once_from_env()

if os.environ.get("NEURON_COMPILE_PRECOMPILE", "").strip().lower() in ("1", "true", "yes", "on"):
    # Read when torch.compile first looks the backend up, which is before Dynamo decides whether
    # the function gets a precompile package (and loads a saved one).
    torch._dynamo.config.caching_precompile = True


_install_associative_scan()  # before Dynamo traces a frame for this backend
_hide_compile_stack_from_dynamo()  # before Dynamo runs a compiled function, whose eager parts reach our kernels
