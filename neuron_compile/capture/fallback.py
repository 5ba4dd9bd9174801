"""Eager fallback: run the nodes that don't lower in PyTorch, compile the rest.

With ``options={"fallback": "eager"}`` (or ``NEURON_COMPILE_FALLBACK=eager``),
``compile_with_fallback`` stands where ``compile_graph`` stands. A graph that
compiles is compiled as usual. A graph that raises ``LoweringError`` is
partitioned around the op it names:

    learn      the failing op (``LoweringError.op``) joins a process-wide set
    partition  ``CapabilityBasedPartitioner``: maximal groups of nodes that
               are not in the set become submodules; the rest stay in the
               parent graph
    compile    each submodule goes through the whole ``compile_graph``; if one
               fails on another op, that op is learned and we partition again;
               a submodule that fails with no op to blame (XLA rejects it)
               runs eagerly as a whole
    run        the parent graph runs eagerly (PyTorch executes the fallen-back
               ATen nodes) and calls the compiled submodules in between

The default (``fallback="error"``) never reaches the partitioner: the
``LoweringError`` propagates, naming the op and the user's line.

Collectives (``_c10d_functional.*``) are known before any lowering, whatever
``fallback`` says (``lowering.functional_collectives.route``): those compiled into the
executable stay in the graph; the others are blocked at once, run on
torch.distributed in the eager parent graph (each issued right after its
input exists and waited on just before its first use, so compiled work in
between overlaps it), with no failed lowering, repro folder or warning.

Reporting: the graph's ``CompileReport.fallback`` maps each fallen-back op to
its node count, ``notes`` name the nodes and their source lines, each compiled
partition records a report of its own (``g0.forward.p0``...), and ``COUNTERS``
count ``fallback_graphs``, ``fallback_nodes``, ``fallback_runs`` (eager
executions at run time) and ``fallback:<op>`` per op.
"""

from __future__ import annotations

import copy
import logging
import operator
import re
import threading

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from ..compiler import Executable, compile_graph
from ..lowering.diagnostics import LoweringError, _matches, user_source_line
from ..report import COUNTERS, CompileReport, record

log = logging.getLogger("neuron_compile")

# ATen ops (as LoweringError names them: "aten.histc", "aten.median.dim") that
# failed to lower in this process; later graphs partition around them at once.
_LEARNED: set[str] = set()
_LEARNED_LOCK = threading.Lock()
_MAX_ROUNDS = 32
_PREFIX = "neuron_part_"


def compile_with_fallback(gm: torch.fx.GraphModule, *, report: CompileReport, options):
    """``compile_graph``, or with ``options.fallback == "eager"`` (or collectives to run eagerly) a partly
    eager executable."""
    eager_collectives = _route_collectives(gm, report, options)
    if eager_collectives:
        return _compile_partitioned(_copy(gm), report, options, eager_collectives)
    if options.fallback != "eager":
        return compile_graph(gm, report=report, options=options)
    from neuron_compile.runtime.executor import XlaCompileError

    original = _copy(gm)
    if not _blocked_nodes(original, _learned()):
        try:
            return compile_graph(gm, report=report, options=options)
        except LoweringError as exc:
            if not _learn(exc, original):
                return _whole_graph_eager(original, report, f"{exc.op or 'an op'} does not lower ({exc.stage})")
            log.info("%s: %s does not lower; partitioning for eager fallback", report.graph, exc.op)
        except (XlaCompileError, NotImplementedError) as exc:
            return _whole_graph_eager(original, report, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return _compile_partitioned(original, report, options)


def _whole_graph_eager(gm: torch.fx.GraphModule, report: CompileReport, why: str) -> "FallbackExecutable":
    """No op to blame: the whole graph runs eagerly (reported like a partition that fell back)."""
    _record_fallback(report, [], [(gm, why)], gm)
    return FallbackExecutable(gm, {})


def learned_ops() -> set[str]:
    """The ops this process has learned not to lower (what fallback partitions around)."""
    return _learned()


def forget() -> None:
    """Forget the learned ops (tests)."""
    with _LEARNED_LOCK:
        _LEARNED.clear()


def _learned() -> set[str]:
    with _LEARNED_LOCK:
        return set(_LEARNED)


_HIGHER_ORDER = re.compile(r"Higher-order operation '(\w+)' not implemented")


def _learn(exc: LoweringError, gm: torch.fx.GraphModule) -> bool:
    """Add the ops a LoweringError names, if they name nodes of ``gm`` (else nothing is learned)."""
    ops = [op.strip() for op in (exc.op or "").split(",") if op.strip()]
    # The importer rejects some higher-order ops (with_effects around linalg's error checks)
    ops += [f"higher_order.{name}" for name in _HIGHER_ORDER.findall(str(exc))]
    if not ops and exc.stage == "import":
        # the importer names no op: its usual refusal is a higher-order op
        ops = [_op_name(n) for n in gm.graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]
    ops = [op for op in ops if _blocked_nodes(gm, {op})]
    with _LEARNED_LOCK:
        new = [op for op in ops if op not in _LEARNED]
        _LEARNED.update(new)
    return bool(new)


def _blocked_nodes(gm: torch.fx.GraphModule, ops: set[str]) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and any(_is(n, op) for op in ops)]


def _is(node: torch.fx.Node, op: str) -> bool:
    if isinstance(node.target, torch._ops.HigherOrderOperator):
        return op == f"higher_order.{node.target.name()}"
    return not op.startswith("higher_order.") and _matches(node, op)


class _Lowerable(OperatorSupportBase):
    """Every call_function node except the blocked ones and getitems reading them."""

    def __init__(self, blocked: set[torch.fx.Node]):
        self.blocked = blocked

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node in self.blocked:
            return False
        if node.target is operator.getitem and node.args[0] in self.blocked:
            self.blocked.add(node)  # a piece of an eager op's tuple stays eager
            return False
        return True


def _route_collectives(gm: torch.fx.GraphModule, report: CompileReport, options) -> set[str]:
    """Route the graph's collectives (notes and counts in the report); the names of the eager ones."""
    from ..lowering import functional_collectives as collectives

    if not collectives.has_collectives(gm):
        return set()
    eager = set()
    for node, why in collectives.route(gm, options.collectives).items():
        name = collectives.op_name(node)
        path = "compiled" if why is None else "eager"
        report.collectives[path] = report.collectives.get(path, 0) + 1
        COUNTERS[f"collectives_{path}"] += 1
        if why is None:
            report.notes.append(f"collective: {name} (node {node.name}) is compiled into the executable")
        else:
            eager.add(node.name)
            report.notes.append(f"collective: {name} (node {node.name}) runs eagerly on torch.distributed: {why}")
    return eager


def _compile_partitioned(gm: torch.fx.GraphModule, report: CompileReport, options,
                         eager_collectives: frozenset = frozenset()) -> "FallbackExecutable":
    for _ in range(_MAX_ROUNDS):
        with report.stage("partition"):
            parent, eager_nodes = _partition(_copy(gm), _learned(), eager_collectives)
        try:
            parts, whole_eager = _compile_parts(parent, report, options)
        except _Relearn:
            continue
        eager_nodes = [n for n in eager_nodes if n.name not in eager_collectives]
        if eager_nodes or whole_eager:
            _record_fallback(report, eager_nodes, whole_eager, gm)
        return FallbackExecutable(parent, parts)
    raise RuntimeError(f"{report.graph}: eager fallback did not converge after {_MAX_ROUNDS} partitionings")


class _Relearn(Exception):
    pass


def _partition(gm: torch.fx.GraphModule, learned: set[str], eager_collectives=frozenset()):
    blocked = set(_blocked_nodes(gm, learned)) | {n for n in gm.graph.nodes if n.name in eager_collectives}
    support = _Lowerable(blocked)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    eager_nodes = [n for n in gm.graph.nodes if n in support.blocked]
    parent = fuse_by_partitions(gm, [p.nodes for p in partitions], prefix=_PREFIX, always_return_tuple=True)
    if eager_collectives:
        _overlap(parent, eager_collectives)
    return parent, eager_nodes


def _overlap(parent: torch.fx.GraphModule, collectives: set[str]) -> None:
    """Issue each eager collective as soon as its input exists and wait on it just before its first use."""
    nodes = list(parent.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        if node.name not in collectives:
            continue
        if node.target is torch.ops._c10d_functional.wait_tensor.default:
            first_user = min(node.users, key=order.__getitem__, default=None)
            if first_user is not None:
                first_user.prepend(node)
        else:
            last = max(node.all_input_nodes, key=order.__getitem__, default=None)
            if last is not None and last.op != "placeholder":
                last.append(node)
            elif last is not None:
                first = next(n for n in parent.graph.nodes if n.op != "placeholder")
                first.prepend(node)
        order = {n: i for i, n in enumerate(parent.graph.nodes)}
    parent.graph.lint()
    parent.recompile()


def _compile_parts(parent: torch.fx.GraphModule, report: CompileReport, options):
    """Compile every fused submodule in place of itself; returns their executables and the ones left eager.
    Without ``fallback="eager"`` (a graph partitioned only around eager collectives) a part that does not
    lower raises, as the whole graph would have."""
    parts, whole_eager = {}, []
    for node in parent.graph.nodes:
        if node.op != "call_module" or not node.target.startswith(_PREFIX):
            continue
        sub = getattr(parent, node.target)
        part_report = CompileReport(graph=f"{report.graph}.p{len(parts) + len(whole_eager)}", kind=report.kind,
                                    signature=report.signature, padded=report.padded)
        try:
            executable = compile_graph(_copy(sub), report=part_report, options=options)
        except LoweringError as exc:
            if options.fallback != "eager":
                raise
            if _learn(exc, sub):
                raise _Relearn() from exc
            whole_eager.append((sub, f"{exc.op or 'an op'} does not lower ({exc.stage})"))
            continue
        except Exception as exc:  # noqa: BLE001 - XLA rejecting a partition: run that partition eagerly
            from neuron_compile.runtime.executor import XlaCompileError

            if not isinstance(exc, (XlaCompileError, NotImplementedError)) or options.fallback != "eager":
                raise
            whole_eager.append((sub, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            continue
        record(part_report)
        parts[node.target] = executable
        setattr(parent, node.target, _CompiledPart(executable))
    return parts, whole_eager


class _CompiledPart(torch.nn.Module):
    """A compiled submodule, called by the eager parent graph like the module it replaces."""

    def __init__(self, executable: Executable):
        super().__init__()
        self.executable = executable

    def forward(self, *args):
        return tuple(self.executable(list(args)))


class FallbackExecutable:
    """The eager parent graph: PyTorch runs the fallen-back nodes, XLA the compiled parts."""

    def __init__(self, parent: torch.fx.GraphModule, parts: dict):
        self.parent = parent
        self.parts = parts

    def __call__(self, args: list) -> list:
        COUNTERS["fallback_runs"] += 1
        with torch.no_grad():
            return list(self.parent(*args))


def _record_fallback(report: CompileReport, eager_nodes, whole_eager, gm: torch.fx.GraphModule) -> None:
    from ..compiler import op_counts

    report.nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    report.ops = op_counts(gm)
    fallback: dict[str, int] = {}
    for node in eager_nodes:
        if node.target is operator.getitem:
            continue
        name = _op_name(node)
        fallback[name] = fallback.get(name, 0) + 1
        source = user_source_line(node)
        report.notes.append(f"fallback: {name} (node {node.name}) runs eagerly" + (f", from {source}" if source else ""))
    for sub, why in whole_eager:
        for node in sub.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem:
                name = _op_name(node)
                fallback[name] = fallback.get(name, 0) + 1
        report.notes.append(f"fallback: a partition of {sum(1 for n in sub.graph.nodes if n.op == 'call_function')} "
                            f"nodes runs eagerly: {why}")
    report.fallback = fallback
    COUNTERS["fallback_graphs"] += 1
    for name, count in fallback.items():
        COUNTERS["fallback_nodes"] += count
        COUNTERS[f"fallback:{name}"] += count
    log.warning("neuron_compile: %s runs %s eagerly (fallback=eager)", report.graph,
                ", ".join(f"{k} x{v}" for k, v in fallback.items()))


def _op_name(node: torch.fx.Node) -> str:
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)  # aten.histc.default
    if isinstance(node.target, torch._ops.HigherOrderOperator):
        return f"higher_order.{node.target.name()}"
    return getattr(node.target, "__name__", str(node.target))


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of the graph (compile_graph rewrites its graph in place)."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
