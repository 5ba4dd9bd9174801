"""FX graph -> Torch-MLIR -> StableHLO, with a reproducer on failure.

The graph that reaches ``lower_to_stablehlo`` is static (every size known),
functional and decomposed (AOTAutograd already applied our table), and its
placeholders are exactly the executable's arguments (parameters included:
weights stay function arguments, never constants).

Three named stages, each timed into the compile report:

* ``import``: torch-mlir's ``FxImporter`` turns the FX graph into the torch
  dialect; node stack traces become MLIR locations.
* ``torch-backend``: ``torchdynamo-export-to-torch-backend-pipeline`` (shape and
  dtype refinement, decompositions inside torch-mlir).
* ``stablehlo``: ``torch-backend-to-stablehlo-backend-pipeline`` then
  StableHLO's ``aggressive-simplification`` and ``canonicalize`` (they fold the
  ``arith.constant`` ops the lowering leaves behind).

A graph holding ops Torch-MLIR cannot lower (FFT, complex values, SVD...)
takes a fourth stage, ``jax``: ``splice.lower_spliced`` lowers those ops
with JAX (the rules are in ``jax_rules``), the rest through the three stages
above, and splices the parts into one module.

When a stage fails, ``LoweringError`` (``diagnostics``) names the ATen op that
did not lower, the line of the user's code it came from (the FX node's stack
trace), the files where the FX graph and the failing IR were saved, and the
command that reproduces the failure (``neuron-compile repro DIR``): this
module finds the op in Torch-MLIR's diagnostics and writes the folder.
"""

from __future__ import annotations

import operator
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .diagnostics import (LoweringError, _matches, _PipelineFailed, new_context, run_pipeline, shared_context,
                          user_source_line)

TORCH_BACKEND_PIPELINE = (
    "builtin.module(func.func(torch-match-quantized-custom-ops),"
    "torchdynamo-export-to-torch-backend-pipeline{ extra-library=})"
)
STABLEHLO_PIPELINE = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"
CLEANUP_PIPELINE = "builtin.module(func.func(stablehlo-aggressive-simplification),canonicalize)"

STAGE_PIPELINES = {"torch-backend": TORCH_BACKEND_PIPELINE, "stablehlo": STABLEHLO_PIPELINE, "cleanup": CLEANUP_PIPELINE}


@dataclass
class Lowered:
    """The output of lowering: the StableHLO module and the torch-dialect text for dumps."""

    module: object  # torch_mlir.ir.Module holding StableHLO
    torch_mlir: str | None  # torch-backend IR text when keep_torch_ir, else None


def lower_to_stablehlo(gm: torch.fx.GraphModule, *, report=None, graph_name: str = "graph",
                       keep_torch_ir: bool = False, kernel_rule=None, direct: bool = False) -> Lowered:
    """Lower a static, decomposed FX graph to a StableHLO module (parameters as arguments).
    ``kernel_rule(node)``: the JAX rule of a registered kernel serving that node, or None. ``direct``: a
    graph whose every op has a rule in ``direct`` is written as StableHLO there (stage ``direct``),
    with no Torch-MLIR; any other graph takes the path below."""
    drop_error_checks(gm)
    _refuse_data_dependent_shapes(gm, graph_name)
    from .functional_collectives import has_collectives
    from .splice import jax_nodes, lower_spliced

    if direct and (kernel_rule is None or not any(kernel_rule(n) for n in gm.graph.nodes if n.op == "call_function")):
        with _stage(report, "direct"):
            module = _direct(gm)
        if module is not None:
            return Lowered(module, "// written directly as StableHLO: no Torch-MLIR stage\n" if keep_torch_ir else None)
    chosen = jax_nodes(gm, kernel_rule)
    if chosen or has_collectives(gm):
        # collectives lower to StableHLO collectives of their own (``collectives``)
        # ops Torch-MLIR has no lowering for: JAX lowers them, Torch-MLIR the rest, one module
        def lower_part(sub, name):
            return _lower_torch_mlir(sub, report, name, keep_torch_ir=False).module

        module = lower_spliced(gm, chosen, lower_part, graph_name=graph_name, stage=lambda: _stage(report, "jax"),
                               kernel_rule=kernel_rule)
        return Lowered(module, "// spliced graph: see the Torch-MLIR parts' dumps\n" if keep_torch_ir else None)
    return _lower_torch_mlir(gm, report, graph_name, keep_torch_ir=keep_torch_ir)


def _direct(gm):
    """``direct.lower``'s text parsed into a module of this thread's context, or None (no rule for an op)."""
    from torch_mlir import ir

    from .direct import lower

    text = lower(gm)
    if text is None:
        return None
    ctx = shared_context()
    with ctx:
        return ir.Module.parse(text)


def _refuse_data_dependent_shapes(gm, graph_name: str) -> None:
    """A node whose shape depends on tensor values (an unbacked size such as nonzero's, or a boolean
    index's in index_put's backward) cannot become a static XLA shape. Torch-MLIR lowers some of
    them to dynamic shapes that XLA then ran with wrong results: refuse the graph, naming the op."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        val = node.meta.get("val")
        for value in val if isinstance(val, (tuple, list)) else [val]:
            symbols = free_unbacked_symbols(value) if isinstance(value, torch.Tensor) else None
            if symbols:
                message = (f"error: the result of {node.target} has the shape {tuple(value.shape)}, which depends on "
                           f"tensor values ({', '.join(sorted(map(str, symbols)))}): XLA compiles static shapes only")
                raise _error(gm, None, "import", message, [], graph_name, op=str(node.target).replace("::", "."),
                             who="neuron_compile")


def _stage(report, name):
    return report.stage(name) if report is not None else _null_stage()


def _lower_torch_mlir(gm, report, graph_name, *, keep_torch_ir) -> Lowered:
    def stage(name):
        return _stage(report, name)

    ctx = shared_context()
    keep_nan_self_compares(gm)
    with stage("import"):
        try:
            module = _import(gm, ctx)
        except Exception as exc:
            # the importer names the op it refused in its message ("aten.as_strided.default indexes
            # outside the base tensor")
            named = re.search(r"\b(aten\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)\b", str(exc))
            raise _error(gm, None, "import", str(exc), [], graph_name, op=named.group(1) if named else None,
                         who="Torch-MLIR's importer") from None
    torch_ir = None
    for index, name in enumerate(_STAGES):
        if name == "stablehlo" and keep_torch_ir:
            torch_ir = str(module.operation)
        with stage("stablehlo" if name == "cleanup" else name):
            try:
                run_pipeline(module, STAGE_PIPELINES[name])
            except _PipelineFailed as failed:
                before = _replay(gm, _STAGES[:index])
                raise _error(gm, before, name, str(failed), failed.diagnostics, graph_name,
                             timed_out=failed.timed_out) from None
    with stage("stablehlo"):
        fix_unsigned_compares(module)
    return Lowered(module, torch_ir)


def drop_error_checks(gm: torch.fx.GraphModule) -> int:
    """Remove linalg's ``_linalg_check_errors`` (wrapped in ``with_effects``) from the graph.

    torch.linalg.inv/solve/cholesky/lu_factor call it on LAPACK's ``info`` to
    raise on singular input; functionalization wraps it in the ``with_effects``
    higher-order op, which the FX importer rejects. A compiled graph cannot
    raise on a value: the check goes, its effect token passes through, and a
    singular input gives inf/NaN as on other XLA frontends. Returns how many
    checks were removed.
    """
    with_effects = getattr(torch.ops.higher_order, "with_effects", None)
    removed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not with_effects or len(node.args) < 2 \
                or node.args[1] is not torch.ops.aten._linalg_check_errors.default:
            continue
        token = node.args[0]
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(token)
                gm.graph.erase_node(user)
        if not node.users:
            gm.graph.erase_node(node)
            removed += 1
    if removed:
        gm.recompile()
    return removed


def keep_nan_self_compares(gm: torch.fx.GraphModule) -> int:
    """Write ``eq.Tensor(x, x)`` of a floating ``x`` as ``logical_not(ne.Tensor(x, x))``.

    Torch-MLIR's canonicalizer folds ``aten.eq.Tensor`` of one operand with itself to a literal
    ``true``, which is wrong at a NaN; ``ne`` it leaves alone. ATen's ``isfinite`` is
    ``(x == x) * (abs(x) != inf)`` (CompositeImplicitAutograd), so in a compiled graph ``isfinite(nan)``
    was True, and ``where(isfinite(g), g, 0)`` kept the NaN. Returns how many compares were rewritten.
    """
    eq, ne, logical_not = torch.ops.aten.eq.Tensor, torch.ops.aten.ne.Tensor, torch.ops.aten.logical_not.default
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not eq or len(node.args) != 2 or node.kwargs \
                or node.args[0] is not node.args[1] or not isinstance(node.args[0], torch.fx.Node):
            continue
        val = node.args[0].meta.get("val")
        if not isinstance(val, torch.Tensor) or not (val.dtype.is_floating_point or val.dtype.is_complex):
            continue
        with gm.graph.inserting_before(node):
            differ = gm.graph.call_function(ne, node.args)
            same = gm.graph.call_function(logical_not, (differ,))
        if "val" in node.meta:
            differ.meta["val"] = same.meta["val"] = node.meta["val"]
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in node.meta:
                differ.meta[key] = same.meta[key] = node.meta[key]
        node.replace_all_uses_with(same)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def fix_unsigned_compares(module) -> int:
    """Give ``stablehlo.compare`` on unsigned and boolean operands the UNSIGNED type.

    torch-mlir emits ``compare ... SIGNED`` for every integer type; XLA's HLO
    verifier rejects that for ``ui8`` and ``i1`` ("Expected comparison type
    UNSIGNED"). Returns how many compares were fixed.
    """
    from torch_mlir import ir

    fixed = 0
    with module.context:
        unsigned = ir.Attribute.parse("#stablehlo<comparison_type UNSIGNED>")

        def visit(op):
            nonlocal fixed
            if op.name == "stablehlo.compare" and "compare_type" in op.attributes:
                element = op.operands[0].type.element_type
                if isinstance(element, ir.IntegerType):
                    int_type = element
                    if (int_type.is_unsigned or int_type.width == 1) and "SIGNED" in str(op.attributes["compare_type"]) \
                            and "UNSIGNED" not in str(op.attributes["compare_type"]):
                        op.attributes["compare_type"] = unsigned
                        fixed += 1
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    return fixed


_STAGES = ("torch-backend", "stablehlo", "cleanup")


def _import(gm, ctx):
    from torch_mlir.extras.fx_importer import FxImporter

    importer = FxImporter(context=ctx, hooks=_dense_literals())
    importer.import_stateless_graph(gm.graph, func_name="main")
    return importer.module


def _dense_literals():
    """Importer hooks that inline tensor constants as dense elements, never ``dense_resource``.

    The FX importer turns a constant tensor of more than one element (group
    norm's, as_strided's index tables...) into a ``dense_resource`` blob, which
    XLA rejects ("Only dense elements attr are supported"). Graph constants are
    small (weights stay arguments), so dense elements cost nothing.
    """
    import numpy as np
    from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_MLIR_TYPE, TORCH_DTYPE_TO_NPY_TYPE, FxImporterHooks
    from torch_mlir.ir import DenseElementsAttr, Operation

    class DenseLiterals(FxImporterHooks):
        def resolve_literal(self, gni, literal, info):
            if not isinstance(literal, torch.Tensor) or literal.numel() <= 1 or literal.is_complex():
                return None
            npy = TORCH_DTYPE_TO_NPY_TYPE.get(literal.dtype)
            if npy is None:
                return None
            array = np.ascontiguousarray(np.array(literal.tolist()).astype(npy))
            if literal.dtype in (torch.bfloat16, torch.float16):
                array = array.view(np.uint16)  # the buffer protocol knows no bfloat16: pass the bits
            attr = DenseElementsAttr.get(array, type=TORCH_DTYPE_TO_MLIR_TYPE[literal.dtype](),
                                         shape=list(literal.shape))
            return Operation.create(name="torch.vtensor.literal", results=[gni._cc.tensor_to_vtensor_type(literal)],
                                    attributes={"value": attr}).result

    return DenseLiterals()


def _replay(gm, stages) -> str | None:
    """Rebuild the IR that entered a failed stage (only on the error path: no cost when lowering works)."""
    try:
        module = _import(gm, new_context())
        for name in stages:
            run_pipeline(module, STAGE_PIPELINES[name])
        return module.operation.get_asm(enable_debug_info=True)
    except Exception:
        return None


class _null_stage:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_ILLEGAL_OP = re.compile(r"failed to legalize operation '([\w.]+)'")
_OPERATOR_NAME = re.compile(r'name = "torch\.([\w.]+)"')
_ATEN_IN_TEXT = re.compile(r"torch\.(aten|prims|torchvision)\.([\w.]+)")


def _failing_op(diagnostics: list[str], message: str) -> str | None:
    """The ATen op named by the first 'failed to legalize' diagnostic, as aten.x.y.

    Returns None when the illegal op is torch-mlir glue (``torch.constant.int``,
    ``torch.prim.ListConstruct``): those are left behind by an ATen op that did
    not lower, which ``_nodes_at`` then finds by source location.
    """
    for text in diagnostics + [message]:
        m = _ILLEGAL_OP.search(text)
        if not m:
            continue
        name = m.group(1)
        if name == "torch.operator":
            named = _OPERATOR_NAME.search(text)
            if named:  # an op torch-mlir has no definition for at all (custom ops included)
                return named.group(1)
        if name.startswith(("torch.aten.", "torch.prims.", "torch.torchvision.")):
            return name[len("torch."):]
        return None
    return None


_LOCATION = re.compile(r'"([^"]+)":(\d+):\d+')


def _nodes_at(gm, diagnostics: list[str]) -> list[torch.fx.Node]:
    """FX nodes whose innermost stack frame is the first location a diagnostic names."""
    for text in diagnostics:
        m = _LOCATION.search(text)
        if not m:
            continue
        path, line = m.group(1), m.group(2)
        found = []
        for node in gm.graph.nodes:
            frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
            if node.op == "call_function" and frames and frames[-1] == (path, line):
                found.append(node)
        return found
    return []


def repro_root() -> Path:
    root = os.environ.get("NEURON_COMPILE_REPRO_DIR")
    return Path(root) if root else Path(tempfile.gettempdir()) / "neuron_compile_repro"


def save_repro(prefix: str, files: dict[str, str]) -> Path | None:
    """A new folder under ``repro_root()`` holding ``files`` (name -> text); None if it can't be written."""
    try:
        root = repro_root()
        root.mkdir(parents=True, exist_ok=True)
        repro = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        for name, text in files.items():
            (repro / name).write_text(text)
        return repro
    except OSError:
        return None


_CURRENT_OP = re.compile(r'see current operation: [^"]*"torch\.((?:aten|prims)\.[A-Za-z0-9_.]+)"')


def _error(gm, ir_text, stage, message, diagnostics, graph_name, *, op=None, who="Torch-MLIR",
           timed_out=False) -> LoweringError:
    op = op or _failing_op(diagnostics, message)
    if op is None and timed_out:  # the op a looping pass kept failing on
        op = next((m.group(1) for d in diagnostics for m in [_CURRENT_OP.search(d)] if m), None)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and op and _matches(n, op)]
    if not nodes:
        nodes = [n for n in _nodes_at(gm, diagnostics + [message]) if isinstance(n.target, torch._ops.OpOverload)]
        if nodes and not op:
            # glue left by an ATen op that did not lower: name the ATen ops on that line
            op = ", ".join(dict.fromkeys(str(n.target).replace("aten::", "aten.") for n in nodes))
    node_name = nodes[0].name if nodes else None
    source = next((user_source_line(n) for n in nodes if user_source_line(n)), None)
    files = {"graph.py": gm.print_readable(print_output=False, include_stride=True, include_device=True)}
    if ir_text is not None:
        files["input.mlir"] = ir_text
    files["pipeline.txt"] = STAGE_PIPELINES.get(stage, "") + "\n"
    files["diagnostics.txt"] = "\n".join(diagnostics) + "\n" + message + "\n"
    repro = save_repro(f"{graph_name.replace('/', '_')}-", files)
    what = f"the ATen op `{op}`" if op else "an op"
    where = f" (FX node `{node_name}`)" if node_name else ""
    lines = [f"neuron_compile could not lower {what}{where} to StableHLO in graph {graph_name}, stage '{stage}'."]
    if source:
        lines.append(f"It comes from your code at {source}")
    first_diag = next((d for d in diagnostics + message.splitlines() if "error" in d.lower() or "failed to" in d.lower()),
                      None) or next((line for line in message.splitlines() if line.strip()), None)
    if timed_out:
        lines.append(f"{who}: {message}.")
        if first_diag and first_diag.strip() != message.strip():
            lines.append(f"Meanwhile it said: {first_diag.strip()[:500]}")
    elif first_diag:
        lines.append(f"{who} said: {first_diag.strip()[:500]}")
    if repro:
        lines.append(f"The FX graph and the failing IR are saved in {repro}; reproduce with: neuron-compile repro {repro}")
    lines.append(
        "What to do: rewrite that line with ops that lower, or run it eagerly with "
        "options={'fallback': 'eager'} / NEURON_COMPILE_FALLBACK=eager, "
        "or wrap it in torch.compiler.disable."
        + (" If the graph is only very large, give the pipeline more time: NEURON_COMPILE_PIPELINE_TIMEOUT "
           "(seconds; 0: no bound)." if timed_out else "")
    )
    return LoweringError("\n".join(lines), op=op, source=source, repro_dir=str(repro) if repro else None, stage=stage)


def strip_locations(text: str) -> str:
    """StableHLO text without debug locations (for keys and readable dumps)."""
    return re.sub(r"\s*loc\([^\n]*?\)(?=\s*$)", "", text, flags=re.MULTILINE)


def now() -> float:
    return time.perf_counter()
