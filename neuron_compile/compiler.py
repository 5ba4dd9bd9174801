"""The compile path for one static FX graph, as one straight function.

``compile_graph`` reads top to bottom as the pipeline:

    plan      which graph inputs and outputs actually cross into XLA
    key       FX graph + input signature + pipeline + toolchain (graph_keys.fx_cache_key)
    cache     memory, then disk: a hit skips everything below  (runtime.cache)
    lower     FX -> Torch-MLIR -> StableHLO            (neuron_compile.lowering)
    key       StableHLO without locations: another FX graph may have built it
    passes    StableHLO -> StableHLO, pass by pass     (passes/)
    compile   StableHLO -> XLA executable              (runtime/)
    store     artifact (manifest + portable StableHLO + executable + SHA-256)

and returns an ``Executable``: a callable on the graph's boxed argument list.
Every stage is timed into the ``CompileReport`` under its own name. Dynamic
graphs reach this function once per concrete signature, already specialized
by ``specialize`` (a re-trace of the symbolic graph on concrete sizes).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

import torch
import torch.fx

from neuron_compile.runtime.artifact import Artifact, portable_stablehlo
from neuron_compile.runtime.cache import ArtifactCache
from neuron_compile.runtime.compile_cache import CacheResult, CompileCache, MemoryCache
from neuron_compile.runtime.cache_key import CacheKey
from neuron_compile.runtime.executor import (DistributedBridge, PersistentBuffers, XlaExecutable, input_converter,
                              platform_description, replicas_of, result_converter)

from .graph_keys import fx_cache_key, input_signature, output_signature, stablehlo_cache_key
from .dump import GraphDump, pass_file_name
from .decompositions.associative_scan import expand_associative_scans
from .decompositions.graph_rewrites import fold_one_hot_sums, one_device, zero_size_values_to_constants
from .index_bounds import add_checks, check_results
from .index_bounds import enabled as index_checks_enabled
from .output_views import find_output_views, make_view
from .lowering import drop_error_checks, lower_to_stablehlo
from .lowering.functional_collectives import collective_names, key_parts
from . import _profiler_hooks, structured_trace
from .report import COUNTERS, CompileReport

log = logging.getLogger("neuron_compile")

# Where each graph output comes from at run time.
FROM_XLA, FROM_ARG, CONSTANT, EMPTY, VIEW = 0, 1, 2, 3, 4


@dataclass
class GraphPlan:
    """How a graph's boxed arguments map to XLA parameters, and XLA results to graph outputs.

    * ``tensor_args``: positions of the arguments that become XLA parameters
      (unused arguments and Python scalars are dropped: a specialized graph
      has its scalars baked in).
    * ``outputs``: per graph output, ``(FROM_XLA, k)``, ``(FROM_ARG, i)`` (an
      input returned as is: AOTAutograd saves inputs for backward that way,
      and handing back the very tensor costs no copy), ``(CONSTANT, v)``
      (None gradients, sizes baked by specialization), or ``(EMPTY, (shape,
      dtype, device))``: a zero-size tensor holds nothing to compute, and is made
      fresh per call (batch norm's ``reserve``, an empty uint8 literal that
      Torch-MLIR does not lower), or ``(VIEW, OutputView)``: a view of an
      input or of another output, made from that base per call
      (``output_views``: AOTAutograd regenerates aliased outputs from the
      metadata of the tensor we return).
    * ``device``: where the executable runs: the device (a registered one,
      ``runtime.executor.DEVICE_ADAPTERS``) any value of the graph lives on,
      else ``"cpu"``; ``xla_devices``: the device type of each XLA result (a
      graph over neuron tensors may build a tensor on the host, or return one
      there with ``.cpu()``; a graph with no input at all may build its
      tensors on the device).
    """

    tensor_args: tuple[int, ...]
    outputs: tuple[tuple[int, object], ...]
    num_xla_outputs: int
    has_views: bool = False  # any (VIEW, ...) output: decided once, read per call
    device: str = "cpu"
    xla_devices: tuple[str, ...] = ()
    # index_bounds.add_checks: what the XLA result at ``checks_at`` (no graph output) says about each index
    checks: tuple = ()
    checks_at: int = -1


def plan_graph(gm: torch.fx.GraphModule) -> GraphPlan:
    """Rewrite ``gm`` in place so that its placeholders and outputs are exactly XLA's."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {node: i for i, node in enumerate(placeholders)}
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    flat_outputs = output_node.args[0]
    if not isinstance(flat_outputs, (tuple, list)):
        flat_outputs = (flat_outputs,)

    views = find_output_views(gm)
    xla_nodes: list[torch.fx.Node] = []
    index_of: dict[torch.fx.Node, int] = {}
    outputs = []
    for value, view in zip(flat_outputs, views):
        if isinstance(value, torch.fx.Node):
            if value.op == "placeholder":
                outputs.append((FROM_ARG, position[value]))
                continue
            val = value.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise NotImplementedError(f"graph output {value.name} is not a tensor: {val!r}")
            if view is not None and not view.symbols():
                outputs.append((VIEW, view))
                continue
            numel = val.numel()
            if isinstance(numel, int) and numel == 0:  # never guard on a data-dependent size
                outputs.append((EMPTY, (tuple(val.shape), val.dtype, val.device.type)))
                continue
            if value not in index_of:
                index_of[value] = len(xla_nodes)
                xla_nodes.append(value)
            outputs.append((FROM_XLA, index_of[value]))
        else:
            outputs.append((CONSTANT, value))
    output_node.args = (tuple(xla_nodes),)

    tensor_args = []
    for node in placeholders:
        if not node.users:
            graph.erase_node(node)
        elif isinstance(node.meta.get("val"), torch.Tensor):
            tensor_args.append(position[node])
        else:
            raise NotImplementedError(
                f"graph input {node.name} is a {type(node.meta.get('val')).__name__} used by the graph; "
                "symbolic graphs must be specialized before planning"
            )
    graph.eliminate_dead_code()
    gm.recompile()
    return GraphPlan(tuple(tensor_args), tuple(outputs), len(xla_nodes), any(k == VIEW for k, _ in outputs),
                     device=_graph_device(graph), xla_devices=tuple(n.meta["val"].device.type for n in xla_nodes))


def _graph_device(graph: torch.fx.Graph) -> str:
    """The device (not the host) any tensor value of the graph lives on, else ``"cpu"``."""
    for node in graph.nodes:
        val = node.meta.get("val")
        for value in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta"):
                return value.device.type
    return "cpu"


@dataclass
class Executable:
    """A compiled graph: its plan plus the XLA executable (None when nothing is computed)."""

    plan: GraphPlan
    xla: XlaExecutable | None
    report: CompileReport = field(repr=False, default=None)
    buffers: PersistentBuffers = field(repr=False, default_factory=PersistentBuffers)
    # the FX-level cache key and input signature it was found under (None without a cache):
    # enough to find it again with no FX graph at hand (``cached_executable``)
    front: CacheKey | None = field(repr=False, default=None)
    signature: list | None = field(repr=False, default=None)

    def __post_init__(self):
        if self.xla is not None and self.xla.target is not None and self.plan.device != "cpu":
            # collectives over a device's tensors: their buffers cross to the distributed client and back
            bridge = DistributedBridge(self.xla.target, self.plan.device)
            self.buffers = PersistentBuffers(bridge.to_buffer)
            self._results = tuple(bridge.result(where) for where in self.plan.xla_devices)
            return
        if self.xla is not None and self.xla.target is not None:
            # an executable with collectives: its buffers live on the distributed client
            self.buffers = PersistentBuffers(self.xla.to_buffer)
        elif self.plan.device != "cpu":
            # on a device: a CPU input crosses by a transfer, kept while it is provably the same
            self.buffers = PersistentBuffers(input_converter(self.plan.device), keep_host_inputs=True)
        # how each XLA result becomes a tensor on the device the graph gives it
        self._results = tuple(result_converter(self.plan.device, where) for where in self.plan.xla_devices)

    def __call__(self, args: list) -> list:
        plan = self.plan
        passed = [args[value] for kind, value in plan.outputs if kind == FROM_ARG]
        if plan.has_views:
            bases = {value.base: args[value.base] for kind, value in plan.outputs
                     if kind == VIEW and value.base_is_input}
        if self.xla is not None:
            get = self.buffers.get
            buffers = [get(i, args[i]) for i in plan.tensor_args]
            # AOTAutograd's boxed convention lets a compiled graph steal its argument list:
            # dropping it lets saved activations die as soon as XLA is done with them
            args.clear()
            raw = self.xla.run_buffers(buffers)
            del buffers
            if plan.checks:  # an index out of range raises CPU's error (index_bounds)
                check_results(raw[plan.checks_at], plan.checks)
            results = [convert(a) for convert, a in zip(self._results, raw)]
        else:
            results = []
        passed.reverse()
        outs = [results[value] if kind == FROM_XLA else passed.pop() if kind == FROM_ARG
                else torch.empty(value[0], dtype=value[1], device=value[2]) if kind == EMPTY else value
                for kind, value in plan.outputs]
        if plan.has_views:
            for index, (kind, value) in enumerate(plan.outputs):
                if kind == VIEW:
                    outs[index] = make_view(bases[value.base] if value.base_is_input else outs[value.base], value)
        return outs


def prepare_graph(gm: torch.fx.GraphModule, index_checks: bool = False) -> GraphPlan:
    """Rewrite AOTAutograd's graph in place for XLA and plan it: expand ``associative_scan`` ops at
    the graph's sizes, drop what XLA never sees (linalg error checks, scalars, unused inputs,
    passthrough outputs, devices: ``one_device``), fold one-hot sums and make zero-size values constants.
    ``index_checks``: the graph also computes the extremes of its index tensors (``index_bounds``), an XLA
    result the plan keeps apart from the graph's outputs."""
    expand_associative_scans(gm)
    drop_error_checks(gm)
    one_device(gm)
    fold_one_hot_sums(gm)
    zero_size_values_to_constants(gm)
    checks = add_checks(gm) if index_checks else ()
    plan = plan_graph(gm)
    if checks:
        plan.checks, plan.checks_at = checks, plan.outputs[-1][1]
        plan.outputs = plan.outputs[:-1]
    return plan


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name] = counts.get(name, 0) + 1
    return counts


def xla_aliases(plan: GraphPlan, donate: dict | None) -> tuple:
    """``donate`` (graph input -> the graph output that overwrites it) as (XLA parameter, XLA result) pairs:
    what ``LoweredGraph`` marks ``tf.aliasing_output``, so XLA may write the result into the input's buffer
    (donated: the input buffer is gone after the call)."""
    pairs = []
    for graph_input, graph_output in sorted((donate or {}).items()):
        kind, value = plan.outputs[graph_output]
        if graph_input in plan.tensor_args and kind == FROM_XLA:
            pairs.append((plan.tensor_args.index(graph_input), value))
    return tuple(pairs)


def compile_graph(gm: torch.fx.GraphModule, *, report: CompileReport, options, donate: dict | None = None) -> Executable:
    """Compile one static, decomposed FX graph into an ``Executable``. ``donate``: graph input -> graph
    output of the same shape and dtype that overwrites it (``xla_aliases``), part of the cache keys.
    Under ``torch.profiler`` it is one ``neuron::compile`` event; under ``TORCH_TRACE`` a graph of
    ``torch.compile`` logs its report and any lowering error (``structured_trace``)."""
    try:
        if _profiler_hooks.STATE._is_profiler_enabled:
            with _profiler_hooks.event("neuron::compile", None, {"graph": report.graph, "kind": report.kind}):
                executable = _compile_graph(gm, report=report, options=options, donate=donate)
        else:
            executable = _compile_graph(gm, report=report, options=options, donate=donate)
    except Exception as exc:
        if type(exc).__name__ in ("LoweringError", "KernelLoweringError", "PassError"):
            structured_trace.lowering_error(report, exc)
        raise
    structured_trace.compile_report(report)
    return executable


def _compile_graph(gm: torch.fx.GraphModule, *, report: CompileReport, options, donate: dict | None = None) -> Executable:
    dump = GraphDump(options.dump_dir, report.graph) if options.dump_dir else None
    # eager ops check their indices on the host (device/bounds.py); a padded graph's padding holds anything
    plan = prepare_graph(gm, index_checks=report.kind != "eager" and not report.padded and index_checks_enabled())
    aliases = xla_aliases(plan, donate)
    report.nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    report.ops = op_counts(gm)
    if dump:
        dump.write("00-fx-graph.py", gm.print_readable(print_output=False, include_stride=True))
    if plan.num_xla_outputs == 0:
        return Executable(plan, None, report)
    collectives = collective_names(gm)  # lowering fuses the graph's nodes in place: read them first
    cache = compile_cache(options)
    if cache is None:
        # lower, passes, compile: no key, no artifact
        xla = LoweredGraph(gm, report, options, dump, front=None, aliases=aliases).compile()[1]
        front = signature = None
    else:
        # xla-client: start the PJRT client (first graph of a process; the platform is a key part)
        with report.stage("xla-client"):
            platform_description()
        # key: the FX graph and its input signature, known without lowering
        with report.stage("cache-key"):
            front = fx_cache_key(gm, options.passes or "default", lowering=options.lowering, donated=aliases)
        signature = input_signature(gm)
        xla = _from_cache(cache, front, lambda: LoweredGraph(gm, report, options, dump, front=front, plan=plan,
                                                             aliases=aliases),
                          _fits(signature, plan), report, dump)
    if dump:
        dump.write_json("report.json", report.as_dict())
    if xla.target is not None:
        xla.what = f"graph {report.graph} ({', '.join(collectives)})"
    return Executable(plan, xla, report, front=front, signature=signature)


def cached_executable(front: CacheKey, plan: GraphPlan, signature: list, rebuild, *, report: CompileReport,
                      options, aliases: tuple = ()) -> Executable:
    """A compiled graph found by its FX key, with no FX graph at hand: how a precompiled package loads.

    ``rebuild()`` returns the unplanned FX graph; it is only called when the
    cache misses (the artifact was evicted or the cache cleared), and the graph
    is then lowered and compiled as ``compile_graph`` would.
    """
    def lower():
        gm = rebuild()
        if prepare_graph(gm) != plan:
            raise RuntimeError(f"{report.graph}: the rebuilt graph plans differently from the one saved")
        return LoweredGraph(gm, report, options, None, front=front, plan=plan, aliases=tuple(map(tuple, aliases)))

    with report.stage("xla-client"):
        platform_description()
    xla = _from_cache(compile_cache(options), front, lower, _fits(signature, plan), report, None)
    return Executable(plan, xla, report, front=front, signature=signature)


def _from_cache(cache: CompileCache, front: CacheKey, lower, check, report: CompileReport, dump) -> XlaExecutable:
    # cache: memory, then disk; a miss lowers, keys the StableHLO, compiles, stores
    # cache-io: lookups, reads, checksums, deserializing, storing (the stages a miss ran are apart)
    with report.remainder("cache-io"):
        result = cache.get(front, lower, check=check)
    _count(result, report, dump)
    structured_trace.cache(report, front, result)
    return result.loaded.executable


class LoweredGraph:
    """A graph lowered to StableHLO, keyed, waiting for passes and the XLA compile (``runtime.compile_cache.Pending``)."""

    def __init__(self, gm: torch.fx.GraphModule, report: CompileReport, options, dump, *, front, plan=None,
                 aliases: tuple = ()):
        self.gm, self.report, self.options, self.dump, self.front, self.plan = gm, report, options, dump, front, plan
        self.aliases = aliases
        self._stages_before = set(report.stages)
        distributed = key_parts(gm)  # before lowering, which fuses the graph's nodes in place
        # mlir-setup: load torch-mlir and the passes (first graph of a process; a cache hit never does)
        with report.stage("mlir-setup"):
            from . import passes  # noqa: F401
            import torch_mlir.dialects.torch  # noqa: F401
            import torch_mlir.extras.fx_importer  # noqa: F401
        # lower: FX -> Torch-MLIR -> StableHLO, weights stay arguments; custom ops a kernel serves through it
        from .kernels.lowering import kernel_rule, kernels_in_graph

        self.kernels = [{"site": node, "kind": "custom op", "kernel": k.name, "origin": k.origin}
                        for node, k in kernels_in_graph(gm).items()]
        # lowering-setup: what lowering does beside its timed stages (the graph's checks, the splice's
        # analysis, the importer's Python)
        with report.remainder("lowering-setup"):
            lowered = lower_to_stablehlo(gm, report=report, graph_name=report.graph,
                                         keep_torch_ir=dump is not None, kernel_rule=kernel_rule,
                                         direct=report.kind == "eager" and options.lowering == "direct")
        COUNTERS["lowerings"] += 1
        if dump:
            dump.write("01-torch.mlir", lowered.torch_mlir)
            dump.write("02-stablehlo.mlir", str(lowered.module))
        structured_trace.stablehlo(report, "lowered", lowered.module)
        self.module = lowered.module
        self.pipeline = resolve_pipeline(options)
        self.key = None
        if front is not None:
            # key: the StableHLO without debug locations, so other FX graphs and source lines share it
            with report.stage("cache-key"):
                text = self.module.operation.get_asm(enable_debug_info=False)
                self.key = stablehlo_cache_key(text, input_signature(gm), self.pipeline.spec,
                                               {**distributed, "donated": [list(pair) for pair in aliases]} if aliases
                                               else distributed)

    def compile(self) -> tuple[Artifact | None, XlaExecutable]:
        report, dump = self.report, self.dump
        # passes: our StableHLO -> StableHLO pipeline, pass by pass
        with report.stage("passes"):
            report.passes = run_passes(self.module, self.options, dump, graph=report.graph)
        structured_trace.passes(report)
        # kernels: registered kernels swapped in for the fuse pass's composites, by name
        self.kernels += swap_kernels(self.module, report)
        report.kernels = self.kernels
        if self.aliases:
            mark_donated(self.module, self.aliases)
        # mlir-print: the module as the text XLA is given
        with report.stage("mlir-print"):
            text = self.module.operation.get_asm(enable_debug_info=False)
        if dump:
            dump.write("04-final.mlir", text)
        structured_trace.stablehlo(report, "final", text)
        # compile: StableHLO -> XLA executable (raises on failure: nothing is stored)
        with report.stage("xla-compile"):
            xla = XlaExecutable.compile(text)
        COUNTERS["xla_compiles"] += 1
        if self.key is None:
            return None, xla
        # serialize: the artifact the cache stores
        with report.stage("serialize"):
            stablehlo, encoding = portable_stablehlo(text)
            executable = xla.serialize()
        return Artifact(self._manifest(encoding, text), stablehlo, executable), xla

    def _manifest(self, encoding: dict, text: str) -> dict:
        import datetime

        from neuron_compile.runtime.cache_key import tool_versions, xla_compile_options

        from ._version import __version__

        report = self.report
        return {
            "format": "neuron_compile artifact", "format_version": 1,
            "key": self.key.digest, "key_parts": self.key.as_manifest(),
            "fx_key": self.front.digest, "fx_key_parts": self.front.as_manifest(),
            "graph": report.graph, "kind": report.kind,
            "inputs": [_tensor_info(n) for n in self.gm.graph.nodes if n.op == "placeholder"],
            "input_signature": input_signature(self.gm),
            "outputs": [_tensor_info(n) for n in _output_nodes(self.gm)],
            "output_signature": output_signature(self.gm),
            "aliases": _aliases(self.plan),
            "pipeline": self.pipeline.spec,
            "passes": [p.as_dict() if hasattr(p, "as_dict") else dict(p.__dict__) for p in report.passes],
            "versions": {"neuron_compile": __version__, **tool_versions()},
            "platform": platform_description(),
            "replicas": replicas_of(text),
            "xla_compile_options": xla_compile_options(),
            "stages": {k: round(v, 6) for k, v in report.stages.items() if k not in self._stages_before},
            "stablehlo": encoding,
            "kernels": self.kernels,
            "donated": [list(pair) for pair in self.aliases],
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }


def mark_donated(module, aliases: tuple) -> None:
    """Mark ``@main``'s parameters ``tf.aliasing_output = result``: XLA may write that result into the
    parameter's buffer (PJRT donates it; one with a DLPack export alive is copied instead)."""
    from torch_mlir import ir

    with module.context:
        main = next(op.operation for op in module.body.operations
                    if op.operation.name == "func.func"
                    and ir.StringAttr(op.operation.attributes["sym_name"]).value == "main")
        signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        count = len(signature.inputs)
        old = main.attributes["arg_attrs"] if "arg_attrs" in main.attributes else None
        attrs = [{named.name: named.attr for named in ir.DictAttr(old[i])} if old is not None else {}
                 for i in range(count)]
        for parameter, result in aliases:
            if signature.inputs[parameter] != signature.results[result]:
                raise ValueError(f"cannot donate parameter {parameter} to result {result}: "
                                 f"{signature.inputs[parameter]} is not {signature.results[result]}")
            attrs[parameter]["tf.aliasing_output"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), result)
        main.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(a) for a in attrs])


def _aliases(plan: GraphPlan | None) -> list[dict]:
    """Graph outputs XLA does not compute: inputs handed back as they are, and constants."""
    out = []
    for position, (kind, value) in enumerate(plan.outputs if plan else ()):
        if kind == FROM_ARG:
            out.append({"output": position, "input": value})
        elif kind == EMPTY:
            out.append({"output": position, "empty": [list(value[0]), str(value[1]).removeprefix("torch.")]})
        elif kind == CONSTANT:
            out.append({"output": position, "constant": repr(value)})
        elif kind == VIEW:
            out.append({"output": position, "view_of": {"input" if value.base_is_input else "output": value.base},
                        "size": list(value.size), "stride": list(value.stride), "offset": value.offset})
    return out


def _output_nodes(gm: torch.fx.GraphModule) -> list:
    return list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])


def _tensor_info(node: torch.fx.Node) -> dict:
    val = node.meta.get("val")
    return {"shape": list(val.shape), "dtype": str(val.dtype).removeprefix("torch.")}


def _fits(signature: list, plan: GraphPlan):
    """A cached manifest must describe exactly the XLA parameters and results this plan expects."""
    def check(manifest: dict) -> str | None:
        if manifest.get("input_signature") != signature:
            return "its input signature is not this graph's"
        if len(manifest.get("outputs", ())) != plan.num_xla_outputs:
            return "its output count is not this graph's"
        return None

    return check


# The memory level is one per process; disk levels one per (folder, cap).
MEMORY = MemoryCache()
_DISKS: dict[tuple[str, int], CompileCache] = {}
_DISKS_LOCK = threading.Lock()


def compile_cache(options) -> CompileCache | None:
    """The two-level cache the options ask for (None when NEURON_COMPILE_CACHE=0)."""
    if not options.cache:
        return None
    key = (os.path.abspath(options.cache_dir), options.cache_max_bytes)
    with _DISKS_LOCK:
        if key not in _DISKS:
            _DISKS[key] = CompileCache(MEMORY, ArtifactCache(key[0], max_bytes=key[1]))
        return _DISKS[key]


def _count(result: CacheResult, report: CompileReport, dump) -> None:
    report.cache = result.source
    report.kernels = report.kernels or list(result.loaded.manifest.get("kernels", ()))  # a hit lowered nothing
    COUNTERS["memory_hits" if result.source == "memory" else "disk_hits" if result.source == "disk" else "misses"] += 1
    COUNTERS["bytes_written"] += result.bytes_written
    COUNTERS["bytes_read"] += result.bytes_read
    COUNTERS["compile_seconds_saved"] += result.seconds_saved
    if dump:
        dump.write_json("manifest.json", result.loaded.manifest)


def cache_stats(options=None) -> dict:
    """This process's cache counters and the disk cache's state (``neuron_compile.cache_stats()``)."""
    from .options import Options

    options = options or Options.resolve()
    counters = {name: COUNTERS[name] for name in (
        "memory_hits", "disk_hits", "misses", "xla_compiles", "lowerings", "bytes_written", "bytes_read",
        "compile_seconds_saved", "precompile_loads", "precompile_saves", "precompile_stale", "precompile_bypasses",
        "precompile_dropped_guards", "precompile_skipped_frames")}
    counters["compiles"] = counters["xla_compiles"]
    disk = ArtifactCache(options.cache_dir, max_bytes=options.cache_max_bytes).stats() if options.cache else None
    return {"process": counters, "disk": disk, "memory_entries": len(MEMORY)}


def resolve_pipeline(options):
    """The pass pipeline the options ask for (a pipeline string or a profile name)."""
    from neuron_compile.passes import parse_pipeline

    return parse_pipeline(options.passes if options.passes is not None else "default")


def run_passes(module, options, dump=None, graph: str = "") -> list:
    """Run the configured pass pipeline on a StableHLO module in place, one pass at a time.

    A pass that raises is a ``PassError`` naming the pass and the graph, with the
    module the pipeline got saved (``input.mlir``) and the command that reruns it.
    """
    from neuron_compile.passes.pipeline import Pipeline

    pipeline = resolve_pipeline(options)
    before = module.operation.clone()  # a pass that fails may leave the module half rewritten
    stats = []
    for index, one in enumerate(pipeline.passes):
        try:
            stats += Pipeline((one,)).run(module, verify_each=options.verify)
        except Exception as exc:
            raise pass_error(one.name, graph, pipeline.spec, before, exc) from exc
        if dump:
            dump.write(pass_file_name(index, one.name), str(module))
    return stats


def swap_kernels(module, report: CompileReport) -> list[dict]:
    """Put registered kernels in as the decompositions of the composites they serve (``passes.swap``)."""
    from .kernels.lowering import has_composite_kernels, swap_composite_kernels

    if not has_composite_kernels():
        return []
    with report.stage("kernels"):
        return swap_composite_kernels(module)


class PassError(RuntimeError):
    """One of our StableHLO passes failed; ``repro_dir`` holds its input."""

    def __init__(self, message: str, *, pass_name: str, repro_dir: str | None):
        super().__init__(message)
        self.pass_name = pass_name
        self.repro_dir = repro_dir


def pass_error(name: str, graph: str, spec: str, before, exc: Exception) -> PassError:
    from .lowering.fx_to_stablehlo import save_repro

    repro = save_repro(f"{(graph or 'graph').replace('/', '_')}-pass-{name}-", {
        "input.mlir": str(before), "pipeline.txt": spec + "\n", "error.txt": f"{type(exc).__name__}: {exc}\n"})
    lines = [f"neuron_compile's StableHLO pass '{name}' failed on graph {graph or '?'}: {type(exc).__name__}: {exc}"]
    if repro:
        lines.append(f"The module the pipeline got is saved at {repro / 'input.mlir'}; rerun the pipeline on it with "
                     f"`python -m neuron_compile.passes --pipeline '{spec}' {repro / 'input.mlir'}`.")
    lines.append("To compile without our passes meanwhile: NEURON_COMPILE_PASSES=none (or options={'passes': 'none'}). "
                 "This is a bug in neuron_compile: please report it with that folder.")
    return PassError("\n".join(lines), pass_name=name, repro_dir=str(repro) if repro else None)
