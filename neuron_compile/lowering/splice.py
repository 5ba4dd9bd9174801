"""Ops Torch-MLIR cannot lower, lowered by JAX and spliced into the same StableHLO module.

Torch-MLIR lowers no complex type and no iterative LAPACK routine, so FFTs,
SVD, eigendecompositions and a few special functions stop a graph at the
``torch-backend`` stage. JAX (a dependency already: jaxlib runs our
executables) has StableHLO lowerings for all of them: ``stablehlo.fft``,
LAPACK custom calls that jaxlib registers with the very XLA CPU client we
compile on, and ``stablehlo.while`` loops. So a graph holding such nodes is
lowered in pieces and the pieces are joined into one module:

    select     nodes whose op is in ``ALWAYS`` (Torch-MLIR has no lowering),
               and nodes with a complex operand or result whose op has a rule
    partition  ``CapabilityBasedPartitioner`` twice: maximal groups of JAX
               nodes, then maximal groups of the other nodes, each fused into
               a submodule; the parent graph only calls them in order
    lower      a Torch-MLIR group goes through ``lower_mlir`` (Torch-MLIR's stages
               in ``fx_to_stablehlo``) as any graph would; a JAX group is interpreted node by node with the
               rules below inside ``jax.jit(...).lower`` (64-bit types on,
               unused arguments kept, no Shardy attributes)
    splice     each group's functions are renamed with its prefix (``m0_``,
               ``j1_``) and made private; a new ``@main`` calls them in the
               parent graph's order; MLIR's inliner then flattens the module

The result is an ordinary StableHLO module: our passes, the cache key (over
the spliced text), the artifact and the XLA compile treat it like any other.
A node with no rule still fails in Torch-MLIR with the usual ``LoweringError``
naming it. A rule is written against the ATen signature and gets the node's
fake output (``out``) first; its results are checked against that output's
shapes, and cast to its dtypes, so a rule cannot silently change a type.
The rules and their registry (``RULES``, ``ALWAYS``) are in ``jax_rules``;
``LoweringError`` and the MLIR context come from ``diagnostics``.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.node import map_arg

from .functional_collectives import is_collective, lower_group, world_size
from . import runtime_offsets  # noqa: F401 - registers the rule of the device's run-time offset slices
from .jax_rules import _ELEMENT_NAME, ALWAYS, RULES, _np_dtype


# --------------------------------------------------------------------------- select


def _packet(node: torch.fx.Node):
    """The key of the node's rule: its op's packet, or the overload itself where that has a rule."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target not in RULES:
        return target.overloadpacket
    return target


def _tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The fake tensors a node produces and reads."""
    values = [node.meta.get("val")]
    map_arg((node.args, node.kwargs), lambda n: values.append(n.meta.get("val")))
    flat = [v for value in values for v in (value if isinstance(value, (tuple, list)) else [value])]
    return [v for v in flat if isinstance(v, torch.Tensor)]


def jax_nodes(gm: torch.fx.GraphModule, kernel_rule=None) -> set[torch.fx.Node]:
    """The nodes of ``gm`` that lower through JAX (getitems reading them included): those our rules
    take, and those ``kernel_rule(node)`` gives a rule for (custom ops served by a registered kernel)."""
    chosen: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            if node.args[0] in chosen:
                chosen.add(node)
            continue
        if kernel_rule is not None and kernel_rule(node) is not None:
            chosen.add(node)
            continue
        packet, tensors = _packet(node), _tensors(node)
        if any(t.dtype not in _ELEMENT_NAME for t in tensors):
            continue  # complex32: JAX has no such type; Torch-MLIR names the op as usual
        if packet in ALWAYS or (packet in RULES and any(t.is_complex() or t.dtype in _NOT_IMPORTED for t in tensors)):
            chosen.add(node)
    return chosen


# element types Torch-MLIR's importer has no type for (a ``view(torch.uint16)``): through JAX, as complex
_NOT_IMPORTED = (torch.uint16, torch.uint64)


# --------------------------------------------------------------------------- partition and splice

_JAX, _MLIR, _COLL = "neuron_jax_", "neuron_mlir_", "neuron_coll_"


class _Support:
    """OperatorSupport for CapabilityBasedPartitioner: a fixed set of nodes."""

    def __init__(self, accept):
        self.accept = accept

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and self.accept(node)


def split(gm: torch.fx.GraphModule, chosen: set[torch.fx.Node]) -> torch.fx.GraphModule:
    """``gm`` as a parent graph calling fused submodules: ``neuron_coll_*`` (collectives),
    ``neuron_jax_*`` (the chosen nodes) and ``neuron_mlir_*`` (the rest); the parent keeps only
    placeholders, calls, getitems and the output."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    def fuse(graph_module, accept, prefix):
        partitioner = CapabilityBasedPartitioner(graph_module, _Support(accept), allows_single_node_partition=True)
        partitions = [p.nodes for p in partitioner.propose_partitions()]
        return fuse_by_partitions(graph_module, partitions, prefix=prefix, always_return_tuple=True)

    _scalar_constants_as_ops(gm)
    parent = fuse(gm, is_collective, _COLL) if any(is_collective(n) for n in gm.graph.nodes) else gm
    parent = fuse(parent, lambda n: n in chosen and not is_collective(n), _JAX)

    def structural(node):  # a getitem reading a submodule's tuple stays in the parent
        return node.target is operator.getitem and node.args[0].op == "call_module"

    return fuse(parent, lambda n: not structural(n), _MLIR)


def _scalar_constants_as_ops(gm: torch.fx.GraphModule) -> None:
    """A one-element tensor constant (``torch.tensor(-inf)`` in traced code, a ``get_attr``; FlexAttention's
    dense kernel has one) becomes an ``aten.full`` node, which a group then owns: the partitioner fuses
    only calls, so a ``get_attr`` stayed in the parent graph, which has no way to say it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily  # AOTAutograd compiles under its fake mode

    for node in list(gm.graph.nodes):
        value = operator.attrgetter(node.target)(gm) if node.op == "get_attr" else None
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex():
            continue
        with unset_fake_temporarily():
            number = value.item()
        with gm.graph.inserting_before(node):
            full = gm.graph.call_function(torch.ops.aten.full.default, (list(value.shape), number),
                                          {"dtype": value.dtype})
        full.meta.update(node.meta)
        full.meta.setdefault("val", value)
        node.replace_all_uses_with(full)
        gm.graph.erase_node(node)


def lower_spliced(gm: torch.fx.GraphModule, chosen: set[torch.fx.Node], lower_mlir, *, graph_name: str, stage,
                  kernel_rule=None):
    """One StableHLO module for ``gm``: Torch-MLIR groups lowered by ``lower_mlir(sub, name)`` (it
    returns a torch-mlir ``Module``), JAX groups by their rules, spliced under a new ``@main``.
    ``stage()`` times the JAX lowerings and the splice (the Torch-MLIR groups time their own stages);
    ``kernel_rule``: as for ``jax_nodes``."""
    from torch_mlir import ir

    from .diagnostics import LoweringError, run_pipeline, shared_context

    # a module with collectives runs as one replica per rank (the executor reads this attribute)
    replicas = world_size(gm)  # before the split, which fuses gm's nodes in place
    with stage():
        parent = split(gm, chosen)
        ctx = shared_context()
    parts: dict[str, tuple[str, list, list]] = {}  # submodule -> (function, argument types, result types)
    functions = []
    for node in parent.graph.nodes:
        if node.op != "call_module":
            continue
        sub = getattr(parent, node.target)
        kind = "c" if node.target.startswith(_COLL) else "j" if node.target.startswith(_JAX) else "m"
        prefix = kind + str(len(parts)) + "_"
        inputs = [tensor_type(n.meta["val"]) for n in sub.graph.nodes if n.op == "placeholder"]
        results = [tensor_type(n.meta["val"]) for n in _outputs(sub)]
        if kind == "c":
            with stage():
                module = ir.Module.parse(lower_group(sub, tensor_type), ctx)
        elif kind == "j":
            with stage():
                module = ir.Module.parse(lower_jax(sub, graph_name=f"{graph_name}.{prefix[:-1]}",
                                                   kernel_rule=kernel_rule), ctx)
        else:
            module = ir.Module.parse(str(lower_mlir(sub, f"{graph_name}.{prefix[:-1]}").operation), ctx)
        functions += _renamed(module, prefix)
        parts[node.target] = (f"{prefix}main", inputs, results)

    header = f"module attributes {{mhlo.num_replicas = {replicas} : i32}} {{\n" if replicas > 1 else "module {\n"
    with stage():
        try:
            main = ir.Module.parse(header + _main_text(parent, parts) + "\n".join(functions) + "\n}", ctx)
            run_pipeline(main, "builtin.module(inline,symbol-dce)")
        except Exception as exc:  # noqa: BLE001 - a splice that does not verify is our bug: say where
            raise LoweringError(f"neuron_compile could not splice the JAX-lowered ops of graph {graph_name}: {exc}",
                                op=None, source=None, repro_dir=None, stage="jax") from None
    return main


def _renamed(module, prefix: str) -> list:
    """The module's functions as text, private, renamed ``prefix + name`` (calls and composites follow)."""
    from torch_mlir import ir

    with module.context:
        functions = [op for op in module.body.operations if op.operation.name == "func.func"]
        names = {op.attributes["sym_name"].value for op in functions}

        def visit(op):  # the references to one of the functions: a call's callee, a composite's decomposition
            for name in ("callee", "decomposition"):
                if name in op.attributes:
                    value = op.attributes[name]
                    if isinstance(value, ir.FlatSymbolRefAttr) and value.value in names:
                        op.attributes[name] = ir.FlatSymbolRefAttr.get(prefix + value.value)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for op in functions:
            op.attributes["sym_name"] = ir.StringAttr.get(prefix + op.attributes["sym_name"].value)
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
            for attr in ("arg_attrs", "res_attrs"):  # jax.result_info, layout modes: not ours
                if attr in op.attributes:
                    del op.attributes[attr]
        return [op.operation.get_asm(enable_debug_info=True) for op in functions]


def _main_text(parent: torch.fx.GraphModule, parts: dict) -> str:
    names: dict[torch.fx.Node, str] = {}
    types: dict[torch.fx.Node, str] = {}
    args, body, counter = [], [], 0
    for node in parent.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"%arg{len(args)}"
            types[node] = tensor_type(node.meta["val"])
            args.append(f"{names[node]}: {types[node]}")
        elif node.op == "call_module":
            function, inputs, results = parts[node.target]
            operands = [names[a] for a in node.args]
            result = f"%{counter}"
            counter += 1
            names[node] = result
            types[node] = results
            count = f":{len(results)}" if len(results) > 1 else ""
            body.append(f"    {result}{count} = func.call @{function}({', '.join(operands)}) : "
                        f"({', '.join(inputs)}) -> ({', '.join(results)})")
        elif node.op == "call_function" and node.target is operator.getitem:
            source, index = node.args
            results = types[source]
            names[node] = f"{names[source]}#{index}" if len(results) > 1 else names[source]
            types[node] = results[index]
        elif node.op == "output":
            values = list(node.args[0]) if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            body.append(f"    return {', '.join(names[v] for v in values)} : {', '.join(types[v] for v in values)}")
            result_types = [types[v] for v in values]
        else:
            raise NotImplementedError(f"unexpected node {node.format_node()} in a spliced graph")
    return (f"func.func @main({', '.join(args)}) -> ({', '.join(result_types)}) {{\n"
            + "\n".join(body) + "\n}\n")


def _outputs(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    values = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


_ELEMENT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "ui8",
    torch.uint64: "ui64", torch.uint32: "ui32", torch.uint16: "ui16", torch.bool: "i1",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
}


def tensor_type(value) -> str:
    """The MLIR type of a tensor (or fake tensor): ``tensor<2x3xf32>``."""
    if not isinstance(value, torch.Tensor) or value.dtype not in _ELEMENT:
        raise NotImplementedError(f"a spliced graph passes a {value!r} between its parts; only tensors can")
    return f"tensor<{''.join(f'{d}x' for d in value.shape)}{_ELEMENT[value.dtype]}>"


# --------------------------------------------------------------------------- JAX groups


def lower_jax(sub: torch.fx.GraphModule, *, graph_name: str, kernel_rule=None) -> str:
    """StableHLO text of a group of JAX nodes: its placeholders in, its output tuple out."""
    import jax

    from .diagnostics import LoweringError, user_source_line

    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]

    def function(*values):
        env = dict(zip(placeholders, values))
        for node in sub.graph.nodes:
            if node.op == "call_function":
                env[node] = _run(node, env, kernel_rule)
        return tuple(env[n] for n in _outputs(sub))

    avals = [jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), _np_dtype(n.meta["val"].dtype)) for n in placeholders]
    try:
        return jax_to_stablehlo(function, avals)
    except _RuleFailed as failed:
        node, exc = failed.args
        if isinstance(exc, LoweringError):  # a kernel's own error names the kernel and says what to do
            raise exc from exc.__cause__
        source = user_source_line(node)
        raise LoweringError(
            f"neuron_compile could not lower the ATen op `{node.target}` (FX node `{node.name}`) through JAX in "
            f"graph {graph_name}: {type(exc).__name__}: {exc}"
            + (f"\nIt comes from your code at {source}" if source else ""),
            op=str(node.target).replace("::", "."), source=source, repro_dir=None, stage="jax") from exc


def jax_to_stablehlo(function, avals) -> str:
    """StableHLO text of ``jax.jit(function).lower(*avals)``, as our MLIR context parses it: every
    argument kept, int64 kept (jax narrows it to int32 otherwise), GSPMD-era attributes only (Shardy's
    #sdy attributes it does not know), CHLO expanded."""
    import jax

    from neuron_compile.runtime.xla_logs import quiet_runtime_logs

    quiet_runtime_logs()  # lowering may start JAX's own CPU client first: its INFO lines stay off the terminal
    with jax.enable_x64(True), _no_shardy():
        module = jax.jit(function, keep_unused=True).lower(*avals).compiler_ir("stablehlo")
    return _without_chlo(module)


def _without_chlo(module) -> str:
    """JAX's module as text, its CHLO ops (lgamma, zeta, igamma...) expanded to StableHLO in JAX's own
    MLIR context: torch-mlir's bindings do not register the CHLO dialect, and our passes and the
    portable artifact want StableHLO only."""
    from jaxlib.mlir import passmanager
    from jaxlib.mlir._mlir_libs import _stablehlo

    global _CHLO_PASSES
    if not _CHLO_PASSES:
        _stablehlo.register_stablehlo_passes()
        _CHLO_PASSES = True
    with module.context:
        passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))").run(module.operation)
    return module.operation.get_asm(enable_debug_info=False)


_CHLO_PASSES = False


def _no_shardy():
    from jax._src import config as jax_config  # the flag's context manager has no public name

    return jax_config.use_shardy_partitioner(False)


class _RuleFailed(Exception):
    pass


def _run(node: torch.fx.Node, env: dict, kernel_rule=None):
    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    args, kwargs = map_arg((node.args, node.kwargs), lambda n: env[n])
    out = node.meta.get("val")
    try:
        rule = kernel_rule(node) if kernel_rule is not None else None
        result = (rule or RULES[_packet(node)])(out, *args, **kwargs)
        return _conform(result, out)
    except Exception as exc:  # noqa: BLE001 - name the node that failed, whatever the rule raised
        raise _RuleFailed(node, exc) from exc


def _conform(result, out):
    """Check a rule's result against the node's fake output: same shapes; dtypes cast to torch's."""
    if isinstance(out, (tuple, list)):
        if not isinstance(result, (tuple, list)) or len(result) != len(out):
            raise TypeError(f"the rule returned {type(result).__name__}, the op returns {len(out)} values")
        return tuple(_conform(r, o) for r, o in zip(result, out))
    if not isinstance(out, torch.Tensor):
        return result
    import jax.numpy as jnp

    result = jnp.asarray(result)
    if tuple(result.shape) != tuple(out.shape):
        raise TypeError(f"the rule's result has shape {tuple(result.shape)}, the op's {tuple(out.shape)}")
    dtype = _np_dtype(out.dtype)
    return result if result.dtype == dtype else result.astype(dtype)
