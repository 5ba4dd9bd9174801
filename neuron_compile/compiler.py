"""The compile path for one static FX graph, as one straight function.

``compile_graph`` reads top to bottom as the pipeline:

    plan      which graph inputs and outputs actually cross into XLA
    lower     FX -> Torch-MLIR -> StableHLO            (neuron_compile.lowering)
    passes    StableHLO -> StableHLO, pass by pass     (passes/)
    compile   StableHLO -> XLA executable              (runtime/)

and returns an ``Executable``: a callable on the graph's boxed argument list.
Every stage is timed into the ``CompileReport`` under its own name. Dynamic
graphs reach this function once per concrete signature, already specialized
by ``specialize`` (a re-trace of the symbolic graph on concrete sizes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.fx

from runtime.executor import XlaExecutable, to_buffer, to_tensor

from .dump import GraphDump, pass_file_name
from .lowering import lower_to_stablehlo
from .report import COUNTERS, CompileReport

log = logging.getLogger("neuron_compile")

# Where each graph output comes from at run time.
FROM_XLA, FROM_ARG, CONSTANT = 0, 1, 2


@dataclass
class GraphPlan:
    """How a graph's boxed arguments map to XLA parameters, and XLA results to graph outputs.

    * ``tensor_args``: positions of the arguments that become XLA parameters
      (unused arguments and Python scalars are dropped: a specialized graph
      has its scalars baked in).
    * ``outputs``: per graph output, ``(FROM_XLA, k)``, ``(FROM_ARG, i)`` (an
      input returned as is: AOTAutograd saves inputs for backward that way,
      and handing back the very tensor costs no copy), or ``(CONSTANT, v)``
      (None gradients, sizes baked by specialization).
    """

    tensor_args: tuple[int, ...]
    outputs: tuple[tuple[int, object], ...]
    num_xla_outputs: int


def plan_graph(gm: torch.fx.GraphModule) -> GraphPlan:
    """Rewrite ``gm`` in place so that its placeholders and outputs are exactly XLA's."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {node: i for i, node in enumerate(placeholders)}
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    flat_outputs = output_node.args[0]
    if not isinstance(flat_outputs, (tuple, list)):
        flat_outputs = (flat_outputs,)

    xla_nodes: list[torch.fx.Node] = []
    index_of: dict[torch.fx.Node, int] = {}
    outputs = []
    for value in flat_outputs:
        if isinstance(value, torch.fx.Node):
            if value.op == "placeholder":
                outputs.append((FROM_ARG, position[value]))
                continue
            if not isinstance(value.meta.get("val"), torch.Tensor):
                raise NotImplementedError(f"graph output {value.name} is not a tensor: {value.meta.get('val')!r}")
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
    return GraphPlan(tuple(tensor_args), tuple(outputs), len(xla_nodes))


@dataclass
class Executable:
    """A compiled graph: its plan plus the XLA executable (None when nothing is computed)."""

    plan: GraphPlan
    xla: XlaExecutable | None
    report: CompileReport = field(repr=False, default=None)

    def __call__(self, args: list) -> list:
        plan = self.plan
        if self.xla is not None:
            arrays = self.xla.run_buffers([to_buffer(args[i]) for i in plan.tensor_args])
            results = [to_tensor(a) for a in arrays]
        else:
            results = []
        out = []
        for kind, value in plan.outputs:
            if kind == FROM_XLA:
                out.append(results[value])
            elif kind == FROM_ARG:
                out.append(args[value])
            else:
                out.append(value)
        return out


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name] = counts.get(name, 0) + 1
    return counts


def compile_graph(gm: torch.fx.GraphModule, *, report: CompileReport, options) -> Executable:
    """Compile one static, decomposed FX graph into an ``Executable``."""
    dump = GraphDump(options.dump_dir, report.graph) if options.dump_dir else None
    # plan: drop what XLA never sees (scalars, unused inputs, passthrough outputs)
    plan = plan_graph(gm)
    report.nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    report.ops = op_counts(gm)
    if dump:
        dump.write("00-fx-graph.py", gm.print_readable(print_output=False, include_stride=True))
    if plan.num_xla_outputs == 0:
        return Executable(plan, None, report)
    # lower: FX -> Torch-MLIR -> StableHLO, weights stay arguments
    lowered = lower_to_stablehlo(gm, report=report, graph_name=report.graph, keep_torch_ir=dump is not None)
    if dump:
        dump.write("01-torch.mlir", lowered.torch_mlir)
        dump.write("02-stablehlo.mlir", str(lowered.module))
    # passes: our StableHLO -> StableHLO pipeline, pass by pass
    with report.stage("passes"):
        report.passes = run_passes(lowered.module, options, dump)
    text = lowered.module.operation.get_asm(enable_debug_info=False)
    if dump:
        dump.write("04-final.mlir", text)
    # compile: StableHLO -> XLA executable
    with report.stage("xla-compile"):
        xla = XlaExecutable.compile(text)
    COUNTERS["xla_compiles"] += 1
    if dump:
        dump.write_json("report.json", report.as_dict())
    return Executable(plan, xla, report)


def resolve_pipeline(options):
    """The pass pipeline the options ask for (a pipeline string or a profile name)."""
    from passes import parse_pipeline

    return parse_pipeline(options.passes if options.passes is not None else "default")


def run_passes(module, options, dump=None) -> list:
    """Run the configured pass pipeline on a StableHLO module in place, one pass at a time."""
    from passes.pipeline import Pipeline

    stats = []
    for index, one in enumerate(resolve_pipeline(options).passes):
        stats += Pipeline((one,)).run(module, verify_each=options.verify)
        if dump:
            dump.write(pass_file_name(index, one.name), str(module))
    return stats
