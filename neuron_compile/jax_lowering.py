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
    lower      a Torch-MLIR group goes through ``lower_to_stablehlo`` as any
               graph would; a JAX group is interpreted node by node with the
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
"""

from __future__ import annotations

import math
import operator
from typing import Callable

import torch
import torch.fx
from torch.fx.node import map_arg

aten = torch.ops.aten

# packet -> rule(out, *args, **kwargs)
RULES: dict[object, Callable] = {}
# packets Torch-MLIR never lowers: always through JAX
ALWAYS: set[object] = set()


def rule(*packets, always: bool = True):
    """Register a JAX rule for ATen op packets (``always``: Torch-MLIR has no lowering for them)."""
    def register(fn):
        for packet in packets:
            RULES[packet] = fn
            if always:
                ALWAYS.add(packet)
        return fn

    return register


def _packet(node: torch.fx.Node):
    target = node.target
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target


def _tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The fake tensors a node produces and reads."""
    values = [node.meta.get("val")]
    map_arg((node.args, node.kwargs), lambda n: values.append(n.meta.get("val")))
    flat = [v for value in values for v in (value if isinstance(value, (tuple, list)) else [value])]
    return [v for v in flat if isinstance(v, torch.Tensor)]


def jax_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes of ``gm`` that lower through JAX (getitems reading them included)."""
    chosen: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            if node.args[0] in chosen:
                chosen.add(node)
            continue
        packet, tensors = _packet(node), _tensors(node)
        if any(t.dtype not in _ELEMENT_NAME for t in tensors):
            continue  # complex32: JAX has no such type; Torch-MLIR names the op as usual
        if packet in ALWAYS or (packet in RULES and any(t.is_complex() for t in tensors)):
            chosen.add(node)
    return chosen


# --------------------------------------------------------------------------- partition and splice

_JAX, _MLIR = "neuron_jax_", "neuron_mlir_"


class _Support:
    """OperatorSupport for CapabilityBasedPartitioner: a fixed set of nodes."""

    def __init__(self, accept):
        self.accept = accept

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and self.accept(node)


def split(gm: torch.fx.GraphModule, chosen: set[torch.fx.Node]) -> torch.fx.GraphModule:
    """``gm`` as a parent graph calling fused submodules: ``neuron_jax_*`` (the chosen nodes) and
    ``neuron_mlir_*`` (the rest); the parent keeps only placeholders, calls, getitems and the output."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    def fuse(graph_module, accept, prefix):
        partitioner = CapabilityBasedPartitioner(graph_module, _Support(accept), allows_single_node_partition=True)
        partitions = [p.nodes for p in partitioner.propose_partitions()]
        return fuse_by_partitions(graph_module, partitions, prefix=prefix, always_return_tuple=True)

    parent = fuse(gm, lambda n: n in chosen, _JAX)

    def structural(node):  # a getitem reading a submodule's tuple stays in the parent
        return node.target is operator.getitem and node.args[0].op == "call_module"

    return fuse(parent, lambda n: not structural(n), _MLIR)


def lower_spliced(gm: torch.fx.GraphModule, chosen: set[torch.fx.Node], lower_mlir, *, graph_name: str, stage):
    """One StableHLO module for ``gm``: Torch-MLIR groups lowered by ``lower_mlir(sub, name)`` (it
    returns a torch-mlir ``Module``), JAX groups by their rules, spliced under a new ``@main``.
    ``stage()`` times the JAX lowerings and the splice (the Torch-MLIR groups time their own stages)."""
    from torch_mlir import ir

    from .lowering import LoweringError, new_context, run_pipeline

    with stage():
        parent = split(gm, chosen)
        ctx = new_context()
    parts: dict[str, tuple[str, list, list]] = {}  # submodule -> (function, argument types, result types)
    functions = []
    for node in parent.graph.nodes:
        if node.op != "call_module":
            continue
        sub = getattr(parent, node.target)
        prefix = ("j" if node.target.startswith(_JAX) else "m") + str(len(parts)) + "_"
        inputs = [_tensor_type(n.meta["val"]) for n in sub.graph.nodes if n.op == "placeholder"]
        results = [_tensor_type(n.meta["val"]) for n in _outputs(sub)]
        if node.target.startswith(_JAX):
            with stage():
                module = ir.Module.parse(lower_jax(sub, graph_name=f"{graph_name}.{prefix[:-1]}"), ctx)
        else:
            module = ir.Module.parse(str(lower_mlir(sub, f"{graph_name}.{prefix[:-1]}").operation), ctx)
        functions += _renamed(module, prefix)
        parts[node.target] = (f"{prefix}main", inputs, results)

    with stage():
        try:
            main = ir.Module.parse("module {\n" + _main_text(parent, parts) + "\n".join(functions) + "\n}", ctx)
            run_pipeline(main, "builtin.module(inline,symbol-dce)")
        except Exception as exc:  # noqa: BLE001 - a splice that does not verify is our bug: say where
            raise LoweringError(f"neuron_compile could not splice the JAX-lowered ops of graph {graph_name}: {exc}",
                                op=None, source=None, repro_dir=None, stage="jax") from None
    return main


def _renamed(module, prefix: str) -> list:
    """The module's functions as text, private, renamed ``prefix + name`` (calls follow)."""
    from torch_mlir import ir

    with module.context:
        functions = [op for op in module.body.operations if op.operation.name == "func.func"]
        names = {op.attributes["sym_name"].value for op in functions}

        def visit(op):
            if op.name == "func.call" and op.attributes["callee"].value in names:
                op.attributes["callee"] = ir.FlatSymbolRefAttr.get(prefix + op.attributes["callee"].value)
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
            types[node] = _tensor_type(node.meta["val"])
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
    torch.uint64: "ui64", torch.uint32: "ui32", torch.bool: "i1",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
}


def _tensor_type(value) -> str:
    if not isinstance(value, torch.Tensor) or value.dtype not in _ELEMENT:
        raise NotImplementedError(f"a spliced graph passes a {value!r} between its parts; only tensors can")
    return f"tensor<{''.join(f'{d}x' for d in value.shape)}{_ELEMENT[value.dtype]}>"


# --------------------------------------------------------------------------- JAX groups


def _np_dtype(dtype: torch.dtype):
    import jax.numpy as jnp

    return jnp.dtype(_ELEMENT_NAME[dtype])


_ELEMENT_NAME = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.uint64: "uint64", torch.uint32: "uint32", torch.bool: "bool",
    torch.complex64: "complex64", torch.complex128: "complex128",
}


def lower_jax(sub: torch.fx.GraphModule, *, graph_name: str) -> str:
    """StableHLO text of a group of JAX nodes: its placeholders in, its output tuple out."""
    import jax

    from .lowering import LoweringError, user_source_line

    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]

    def function(*values):
        env = dict(zip(placeholders, values))
        for node in sub.graph.nodes:
            if node.op == "call_function":
                env[node] = _run(node, env)
        return tuple(env[n] for n in _outputs(sub))

    avals = [jax.ShapeDtypeStruct(tuple(n.meta["val"].shape), _np_dtype(n.meta["val"].dtype)) for n in placeholders]
    try:
        # int64 stays int64 (jax narrows it to int32 otherwise); GSPMD-era attributes only, which
        # our MLIR context parses (Shardy's #sdy attributes it does not know)
        with jax.enable_x64(True), _no_shardy():
            module = jax.jit(function, keep_unused=True).lower(*avals).compiler_ir("stablehlo")
        return _without_chlo(module)
    except _RuleFailed as failed:
        node, exc = failed.args
        source = user_source_line(node)
        raise LoweringError(
            f"neuron_compile could not lower the ATen op `{node.target}` (FX node `{node.name}`) through JAX in "
            f"graph {graph_name}: {type(exc).__name__}: {exc}"
            + (f"\nIt comes from your code at {source}" if source else ""),
            op=str(node.target).replace("::", "."), source=source, repro_dir=None, stage="jax") from exc


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


def _run(node: torch.fx.Node, env: dict):
    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    args, kwargs = map_arg((node.args, node.kwargs), lambda n: env[n])
    out = node.meta.get("val")
    try:
        result = RULES[_packet(node)](out, *args, **kwargs)
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


def _dims(dim, ndim: int) -> list[int]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % ndim for d in dims] if ndim else dims


# --------------------------------------------------------------------------- rules: FFT

# torch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n, whatever the direction.
# numpy's norm names say which direction is scaled.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@rule(aten._fft_r2c)
def _fft_r2c(out, x, dim, normalization, onesided):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    if onesided:
        return jnp.fft.rfftn(x, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.fftn(x, axes=axes, norm=_FORWARD_NORM[normalization])


@rule(aten._fft_c2c)
def _fft_c2c(out, x, dim, normalization, forward):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    if forward:
        return jnp.fft.fftn(x, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(x, axes=axes, norm=_INVERSE_NORM[normalization])


@rule(aten._fft_c2r)
def _fft_c2r(out, x, dim, normalization, last_dim_size):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(x, s=sizes, axes=axes, norm=_INVERSE_NORM[normalization])


# --------------------------------------------------------------------------- rules: complex numbers


@rule(aten._conj, aten.conj_physical, aten._conj_physical, aten.conj)
def _conj(out, x):
    import jax.numpy as jnp

    return jnp.conj(x)


@rule(aten.complex)
def _complex(out, real, imag):
    import jax.lax as lax

    import jax.numpy as jnp

    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@rule(aten.polar)
def _polar(out, magnitude, angle):
    import jax.lax as lax

    import jax.numpy as jnp

    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@rule(aten.view_as_complex)
def _view_as_complex(out, x):
    import jax.lax as lax

    return lax.complex(x[..., 0], x[..., 1])


# Ops that Torch-MLIR lowers, except on complex tensors: these rules only take nodes that touch one.


def _register_complex_rules():
    def binary(fn):
        def apply(out, a, b, alpha=1):
            return fn(a, b if alpha == 1 else b * alpha)
        return apply

    def unary(name):
        def apply(out, x):
            import jax.numpy as jnp

            return getattr(jnp, name)(x)
        return apply

    for packet, fn in ((aten.add, operator.add), (aten.sub, operator.sub), (aten.mul, operator.mul),
                       (aten.div, operator.truediv)):
        RULES[packet] = binary(fn)
    for name in ("negative", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "reciprocal", "sign", "angle",
                 "square"):
        RULES[getattr(aten, {"negative": "neg", "sign": "sgn"}.get(name, name))] = unary(name)


@rule(aten.clone, aten.alias, aten.lift_fresh_copy, always=False)
def _identity(out, x, **kwargs):
    return x


@rule(aten._to_copy, always=False)
def _to_copy(out, x, **kwargs):
    import jax.numpy as jnp

    return jnp.asarray(x).astype(_np_dtype(out.dtype))


@rule(torch.ops.prims.convert_element_type, always=False)
def _convert(out, x, dtype):
    return x.astype(_np_dtype(dtype))


@rule(aten.view, aten._unsafe_view, aten.reshape, always=False)
def _reshape(out, x, shape):
    return x.reshape(tuple(out.shape))


@rule(aten.permute, always=False)
def _permute(out, x, dims):
    return x.transpose(_dims(dims, x.ndim))


@rule(aten.t, always=False)
def _t(out, x):
    return x.T


@rule(aten.transpose, always=False)
def _transpose(out, x, a, b):
    import jax.numpy as jnp

    return jnp.swapaxes(x, a, b)


@rule(aten.expand, always=False)
def _expand(out, x, size, **kwargs):
    import jax.numpy as jnp

    return jnp.broadcast_to(x, tuple(out.shape))


@rule(aten.unsqueeze, aten.squeeze, always=False)
def _to_shape(out, x, *args):
    return x.reshape(tuple(out.shape))


@rule(aten.slice, always=False)
def _slice(out, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, min(end, x.shape[dim]) if end is not None else None, step)
    return x[tuple(index)]


@rule(aten.select, always=False)
def _select(out, x, dim, index):
    import jax.numpy as jnp

    return jnp.take(x, index, axis=dim)


@rule(aten.cat, always=False)
def _cat(out, tensors, dim=0):
    import jax.numpy as jnp

    return jnp.concatenate([t for t in tensors if t.size or t.ndim != 1], axis=dim)


@rule(aten.roll, always=False)
def _roll(out, x, shifts, dims=()):
    import jax.numpy as jnp

    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@rule(aten.flip, always=False)
def _flip(out, x, dims):
    import jax.numpy as jnp

    return jnp.flip(x, axis=tuple(dims))


@rule(aten.where, always=False)
def _where(out, condition, a, b):
    import jax.numpy as jnp

    return jnp.where(condition, a, b)


@rule(aten.sum, always=False)
def _sum(out, x, dim=None, keepdim=False, dtype=None):
    return x.sum(axis=None if dim is None else tuple(_dims(dim, x.ndim)), keepdims=keepdim)


@rule(aten.mm, aten.bmm, aten.matmul, always=False)
def _matmul(out, a, b):
    import jax.numpy as jnp

    return jnp.matmul(a, b)


_register_complex_rules()


@rule(aten.view_as_real, always=False)
def _view_as_real(out, x):
    import jax.numpy as jnp

    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@rule(aten.real, always=False)
def _real(out, x):
    import jax.numpy as jnp

    return jnp.real(x)


@rule(aten.imag, always=False)
def _imag(out, x):
    import jax.numpy as jnp

    return jnp.imag(x)


# --------------------------------------------------------------------------- rules: linear algebra
# LAPACK through jaxlib's custom calls (gesdd, syevd, geev), registered with the XLA CPU client we run on;
# LDL (sytrf/sytrs, which jaxlib lacks) written out in jax_ldl.py.


def _empty_like(out):
    import jax.numpy as jnp

    return jnp.zeros(tuple(out.shape), _np_dtype(out.dtype))


@rule(aten._linalg_svd)
def _linalg_svd(out, a, full_matrices=False, compute_uv=True, driver=None):
    import jax.numpy as jnp

    if not compute_uv:
        return _empty_like(out[0]), jnp.linalg.svd(a, compute_uv=False), _empty_like(out[2])
    return tuple(jnp.linalg.svd(a, full_matrices=full_matrices))


@rule(aten._linalg_eigh)
def _linalg_eigh(out, a, UPLO="L", compute_v=True):
    import jax.numpy as jnp

    # torch reads one triangle only: no symmetrizing
    values, vectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else _empty_like(out[1]))


@rule(aten.linalg_eig)
def _linalg_eig(out, a):
    import jax.numpy as jnp

    return tuple(jnp.linalg.eig(a))


@rule(aten.linalg_pinv)
def _linalg_pinv(out, a, *args, **kwargs):
    """ATen's linalg_pinv (LinearAlgebra.cpp) for its four overloads: SVD (or eigh when hermitian),
    singular values under max(atol, rtol * largest) dropped."""
    import jax.numpy as jnp

    hermitian = kwargs.pop("hermitian", False)
    if args and isinstance(args[-1], bool):
        *args, hermitian = args
    if "rcond" in kwargs or (len(args) == 1 and "atol" not in kwargs and "rtol" not in kwargs):
        atol, rtol = 0.0, kwargs.get("rcond", args[0] if args else None)  # (rcond, hermitian) overloads
        given_atol = True
    else:
        atol = kwargs.get("atol", args[0] if args else None)
        rtol = kwargs.get("rtol", args[1] if len(args) > 1 else None)
        given_atol = atol is not None
        atol = 0.0 if atol is None else atol
    real = jnp.finfo(a.dtype).dtype
    atol = jnp.asarray(atol, real)
    if rtol is None:
        default = jnp.asarray(jnp.finfo(real).eps * max(a.shape[-1], a.shape[-2]), real)
        rtol = jnp.where(atol > 0, jnp.zeros((), real), default) if given_atol else default
    rtol = jnp.asarray(rtol, real)
    if a.size == 0:
        return _empty_like(out)
    if not hermitian:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        largest = s[..., :1]
        tol = jnp.maximum(atol[..., None], rtol[..., None] * largest)
        inverse = jnp.where(s > tol, 1 / s, 0).astype(a.dtype)
        return jnp.matmul(jnp.conj(jnp.swapaxes(vh, -1, -2)) * inverse[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))
    s, u = jnp.linalg.eigh(a, symmetrize_input=False)
    magnitude = jnp.abs(s)
    tol = jnp.maximum(atol[..., None], rtol[..., None] * magnitude.max(axis=-1, keepdims=True))
    inverse = jnp.where(magnitude > tol, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(u * inverse[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))


@rule(aten.linalg_ldl_factor_ex)
def _ldl_factor_ex(out, a, *, hermitian=False, check_errors=False):
    from .jax_ldl import ldl_factor_ex

    return tuple(ldl_factor_ex(a, hermitian=hermitian))


@rule(aten.linalg_ldl_solve)
def _ldl_solve(out, ld, pivots, b, *, hermitian=False):
    from .jax_ldl import ldl_solve

    return ldl_solve(ld, pivots, b, hermitian=hermitian)


@rule(aten.linalg_matrix_exp)
def _matrix_exp(out, a):
    import jax.scipy.linalg

    return jax.scipy.linalg.expm(a)


# --------------------------------------------------------------------------- rules: special functions


def _operands(out, *values):
    """Tensor or Python-number operands in the result's dtype, broadcast to one shape."""
    import jax.numpy as jnp

    return jnp.broadcast_arrays(*(jnp.asarray(v, _np_dtype(out.dtype)) for v in values))


@rule(aten.igamma)
def _igamma(out, a, x):
    import jax.lax as lax

    return lax.igamma(*_operands(out, a, x))


@rule(aten.igammac)
def _igammac(out, a, x):
    import jax.lax as lax

    return lax.igammac(*_operands(out, a, x))


@rule(aten.special_zeta)
def _zeta(out, x, q):
    import jax.lax as lax
    import jax.numpy as jnp

    x, q = _operands(out, x, q)
    # Cephes (ATen): a pole at every non-positive integer q, where XLA's zeta gives NaN
    pole = (q <= 0) & (q == jnp.floor(q)) & (x > 1)
    return jnp.where(pole, jnp.inf, lax.zeta(x, q))


@rule(aten.hash_tensor)
def _hash_tensor(out, x, dim=(), *, keepdim=False, mode=0):
    # ATen's mode 0: the XOR of each element's 64-bit pattern (floats as float64, integers as int64)
    import jax.lax as lax
    import jax.numpy as jnp

    if mode != 0:
        raise NotImplementedError(f"hash_tensor mode {mode}")
    wide = x.astype(jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    axes = tuple(_dims(dim, x.ndim)) if dim else tuple(range(x.ndim))
    hashed = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return hashed.reshape(tuple(out.shape))


@rule(aten.frexp)
def _frexp(out, x):
    import jax.numpy as jnp

    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent


def _three_term(x, n, first, step, *, limit=None):
    """ATen's loop ``p, q = q, step(k, p, q)`` for k = 1 .. n-1 from (1, first), per element of
    x and n (already broadcast), as one ``stablehlo.while`` running to the largest degree. Returns
    q at each element's degree (1 for degree 0), and the degree as an integer tensor for the
    caller's special cases."""
    import jax.lax as lax
    import jax.numpy as jnp

    n = jnp.where(jnp.isfinite(n), n, -1).astype(jnp.int64)  # ATen truncates the degree to int64
    stop = jnp.max(n, initial=0)
    if limit is not None:
        stop = jnp.minimum(stop, limit)

    def body(state):
        k, p, q = state
        active = k < n
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    _, _, q = lax.while_loop(lambda s: s[0] < stop, body, (jnp.int64(1), jnp.ones_like(x), first(x)))
    return jnp.where(n == 0, 1, q).astype(x.dtype), n


def _hermite_limit(dtype) -> int:
    import jax.numpy as jnp

    return 128 if jnp.dtype(dtype).itemsize <= 4 else 512  # ATen's getHermitianLimit


@rule(aten.special_hermite_polynomial_h)
def _hermite_h(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    limit = _hermite_limit(x.dtype)
    value, n = _three_term(x, n, lambda x: x + x, lambda k, p, q: (x + x) * q - (k + k) * p, limit=limit)
    return jnp.where(n < 0, 0, jnp.where(n > limit, jnp.nan, value))


@rule(aten.special_hermite_polynomial_he)
def _hermite_he(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    limit = _hermite_limit(x.dtype)
    value, n = _three_term(x, n, lambda x: x, lambda k, p, q: x * q - k * p, limit=limit)
    return jnp.where(n < 0, 0, jnp.where(n > limit, jnp.nan, value))


@rule(aten.special_laguerre_polynomial_l)
def _laguerre_l(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    value, n = _three_term(x, n, lambda x: 1 - x, lambda k, p, q: ((k + k + (1 - x)) * q - k * p) / (k + 1))
    return jnp.where(n < 0, 0, jnp.where(jnp.abs(x) == 0, 1, value))


@rule(aten.special_legendre_polynomial_p)
def _legendre_p(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    value, n = _three_term(x, n, lambda x: x, lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1))
    at_one = jnp.where((x > 0) | (n % 2 == 0), 1, -1)
    return jnp.where(n < 0, 0, jnp.where(jnp.abs(x) == 1, at_one, value))
