"""The rules of ``direct``: each core ATen op's StableHLO, written from its node's arguments and value.

A rule is ``rule(fn, node, args, out)``: ``fn`` the ``direct_ir.Function`` being
written, ``args`` the node's arguments with a ``direct_ir.V`` for each tensor,
``out`` the node's (shape, dtype); it returns the result's ``V`` or raises
``NoRule`` for arguments it does not take.
"""

from __future__ import annotations

import math

import torch

from .direct_ir import NoRule, V, _array

aten = torch.ops.aten

RULES: dict = {}


def rule(*ops):
    def register(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return register


def _dims(dims, rank: int) -> list[int]:
    """Reduced dims as ATen reads them: None or [] is every dim."""
    if isinstance(dims, int):
        dims = [dims]
    if not dims:
        return list(range(rank))
    return [d % rank for d in dims] if rank else []


def _no_bool(dtype):
    if dtype is torch.bool:
        raise NoRule("arithmetic on bool")


def _binary(name):
    def emit(fn, node, args, out):
        shape, dtype = out
        _no_bool(dtype)
        a, b = (fn.operand(x, dtype, shape) for x in args[:2])
        alpha = node.kwargs.get("alpha", 1)
        if alpha != 1:
            b = fn.op("multiply", [b, fn.const(alpha, dtype, shape)], shape, dtype)
        return fn.op(name, [a, b], shape, dtype)
    return emit


for _name, _ops in {"add": (aten.add.Tensor, aten.add.Scalar), "subtract": (aten.sub.Tensor, aten.sub.Scalar),
                    "multiply": (aten.mul.Tensor, aten.mul.Scalar),
                    "maximum": (aten.maximum.default,), "minimum": (aten.minimum.default,)}.items():
    rule(*_ops)(_binary(_name))


@rule(aten.div.Tensor, aten.div.Scalar)
def _div(fn, node, args, out):
    if not out[1].is_floating_point or len(args) > 2 or node.kwargs:
        raise NoRule("div with a rounding mode")
    return _binary("divide")(fn, node, args, out)


def _tensor_meta(x):
    if isinstance(x, V):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def _compare(direction):
    def emit(fn, node, args, out):
        a, b = args[:2]
        dtype = torch.result_type(_tensor_meta(a), _tensor_meta(b))
        return fn.compare(fn.operand(a, dtype, out[0]), fn.operand(b, dtype, out[0]), direction)
    return emit


for _direction, _name in (("EQ", "eq"), ("NE", "ne"), ("LT", "lt"), ("LE", "le"), ("GT", "gt"), ("GE", "ge")):
    rule(getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)(_compare(_direction))


def _unary(name, floating: bool = True):
    def emit(fn, node, args, out):
        shape, dtype = out
        if (floating and not dtype.is_floating_point) or dtype in (torch.bool, torch.uint8):
            raise NoRule(f"{name} of {dtype}")
        return fn.op(name, [fn.operand(args[0], dtype, shape)], shape, dtype)
    return emit


for _name, _op in (("exponential", aten.exp), ("log", aten.log), ("tanh", aten.tanh), ("rsqrt", aten.rsqrt),
                   ("sqrt", aten.sqrt), ("sine", aten.sin), ("cosine", aten.cos), ("logistic", aten.sigmoid),
                   ("log_plus_one", aten.log1p), ("exponential_minus_one", aten.expm1), ("floor", aten.floor),
                   ("ceil", aten.ceil)):
    rule(_op.default)(_unary(_name))
rule(aten.neg.default)(_unary("negate", floating=False))
rule(aten.abs.default)(_unary("abs", floating=False))


@rule(aten.reciprocal.default)
def _reciprocal(fn, node, args, out):
    shape, dtype = out
    if not dtype.is_floating_point:
        raise NoRule("reciprocal of integers")
    return fn.op("divide", [fn.const(1, dtype, shape), fn.operand(args[0], dtype, shape)], shape, dtype)


@rule(aten.pow.Tensor_Scalar)
def _pow(fn, node, args, out):
    shape, dtype = out
    x, exponent = args
    if not dtype.is_floating_point or not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
        raise NoRule("pow of integers")
    x = fn.operand(x, dtype, shape)
    if exponent == 1:
        return x
    if exponent in (2, 3):  # as CPU's kernel: products, not exp(log)
        square = fn.op("multiply", [x, x], shape, dtype)
        return square if exponent == 2 else fn.op("multiply", [square, x], shape, dtype)
    special = {0.5: "sqrt", -0.5: "rsqrt"}.get(exponent)
    if special:
        return fn.op(special, [x], shape, dtype)
    if exponent == -1:
        return fn.op("divide", [fn.const(1, dtype, shape), x], shape, dtype)
    return fn.op("power", [x, fn.const(exponent, dtype, shape)], shape, dtype)


def _logical(name):
    def emit(fn, node, args, out):
        a, b = (fn.operand(x, torch.bool, out[0]) for x in args[:2])
        return fn.op(name, [a, b], out[0], torch.bool)
    return emit


for _name in ("and", "or", "xor"):
    rule(getattr(aten, f"logical_{_name}").default)(_logical(_name))


@rule(aten.logical_not.default)
def _logical_not(fn, node, args, out):
    return fn.op("not", [fn.operand(args[0], torch.bool, out[0])], out[0], torch.bool)


def _bitwise(name):
    def emit(fn, node, args, out):
        shape, dtype = out
        if dtype.is_floating_point:
            raise NoRule("bitwise on floats")
        operands = [fn.operand(x, dtype, shape) for x in args[:2]]
        return fn.op(name, operands, shape, dtype)
    return emit


for _name in ("and", "or", "xor"):
    rule(getattr(aten, f"bitwise_{_name}").Tensor, getattr(aten, f"bitwise_{_name}").Scalar)(_bitwise(_name))
rule(aten.bitwise_not.default)(_bitwise("not"))


@rule(aten.where.self)
def _where(fn, node, args, out):
    shape, dtype = out
    condition = fn.operand(args[0], torch.bool, shape)
    return fn.op("select", [condition, fn.operand(args[1], dtype, shape), fn.operand(args[2], dtype, shape)],
                 shape, dtype)


@rule(aten.clamp.default)
def _clamp(fn, node, args, out):
    shape, dtype = out
    _no_bool(dtype)
    low = args[1] if len(args) > 1 else node.kwargs.get("min")
    high = args[2] if len(args) > 2 else node.kwargs.get("max")
    x = fn.operand(args[0], dtype, shape)
    if low is not None:
        x = fn.op("maximum", [x, fn.operand(low, dtype, shape)], shape, dtype)
    if high is not None:
        x = fn.op("minimum", [x, fn.operand(high, dtype, shape)], shape, dtype)
    return x


# ---- layout: a functional graph's values are logical tensors, so a view is a reshape ----

@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default, aten.alias.default,
      aten.detach.default, aten.lift_fresh_copy.default, aten.unsqueeze.default, aten.squeeze.dim,
      aten.squeeze.dims, aten.squeeze.default, aten.contiguous.default)
def _reshape(fn, node, args, out):
    x = args[0]
    if not isinstance(x, V) or x.dtype is not out[1]:
        raise NoRule("a view that changes the dtype")
    return fn.reshape(x, out[0])


@rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _convert(fn, node, args, out):
    return fn.reshape(fn.convert(args[0], out[1]), out[0])


@rule(aten.permute.default, aten.transpose.int, aten.t.default)
def _permute(fn, node, args, out):
    x = args[0]
    rank = len(x.shape)
    if node.target is aten.permute.default:
        order = [d % rank for d in args[1]] if rank else []
    else:
        order = list(range(rank))
        if rank >= 2:
            a, b = (args[1] % rank, args[2] % rank) if node.target is aten.transpose.int else (0, 1)
            order[a], order[b] = order[b], order[a]
    if order == sorted(order):
        return x
    return fn.op("transpose", [x], out[0], x.dtype, f"permutation = {_array(order)}")


@rule(aten.expand.default)
def _expand(fn, node, args, out):
    return fn.broadcast(args[0], out[0])


@rule(aten.slice.Tensor)
def _slice(fn, node, args, out):
    x, dim, start, _end, step = list(args) + [0, None, None, 1][len(args) - 1:]
    dim, step = node.kwargs.get("dim", dim), node.kwargs.get("step", step)
    start = node.kwargs.get("start", start) or 0
    dim %= len(x.shape)
    size = x.shape[dim]
    if start < 0:
        start += size
    return fn.slice(x, dim, min(max(start, 0), size), out[0][dim], step)


@rule(aten.select.int)
def _select(fn, node, args, out):
    x, dim, index = args
    dim %= len(x.shape)
    return fn.reshape(fn.slice(x, dim, index % x.shape[dim], 1), out[0])


@rule(aten.cat.default)
def _cat(fn, node, args, out):
    shape, dtype = out
    dim = (args[1] if len(args) > 1 else node.kwargs.get("dim", 0)) % len(shape)
    parts = [fn.convert(t, dtype) for t in args[0] if not (len(t.shape) == 1 and t.shape[0] == 0 and len(shape) != 1)]
    parts = [t for t in parts if t.shape[dim]] or parts[:1]
    if any(len(t.shape) != len(shape) for t in parts):
        raise NoRule("cat of tensors of other ranks")
    if len(parts) == 1:
        return fn.reshape(parts[0], shape)
    return fn.op("concatenate", parts, shape, dtype, f"dimension = {dim} : i64")


@rule(aten.constant_pad_nd.default)
def _pad(fn, node, args, out):
    x = args[0]
    pads = list(args[1])
    value = args[2] if len(args) > 2 else node.kwargs.get("value", 0)
    rank = len(x.shape)
    low, high = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        low[rank - 1 - i], high[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    return fn.op("pad", [x, fn.const(value, x.dtype)], out[0], x.dtype,
                 f"edge_padding_low = {_array(low)}, edge_padding_high = {_array(high)}, "
                 f"interior_padding = {_array([0] * rank)}")


@rule(aten.copy.default)
def _copy(fn, node, args, out):
    return fn.operand(args[1], out[1], out[0])


# ---- values made in the graph ----

@rule(aten.scalar_tensor.default)
def _scalar_tensor(fn, node, args, out):
    return fn.const(args[0], out[1], out[0])


@rule(aten.full.default, aten.full_like.default)
def _full(fn, node, args, out):
    return fn.const(args[1], out[1], out[0])


@rule(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format, aten.empty_like.default,
      aten.empty_strided.default, aten.new_zeros.default)
def _zeros(fn, node, args, out):
    return fn.const(0, out[1], out[0])


@rule(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(fn, node, args, out):
    return fn.const(1, out[1], out[0])


@rule(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(fn, node, args, out):
    shape, dtype = out
    numbers = list(args) if node.target is not aten.arange.default else [0, *args]
    start, step = numbers[0], (numbers[2] if len(numbers) > 2 else node.kwargs.get("step", 1))
    compute = torch.float64 if dtype.is_floating_point else torch.int64
    _no_bool(dtype)
    index = fn.convert(fn.op("iota", [], shape, torch.int64, "iota_dimension = 0 : i64"), compute)
    value = fn.op("add", [fn.op("multiply", [index, fn.const(step, compute, shape)], shape, compute),
                          fn.const(start, compute, shape)], shape, compute)
    return fn.convert(value, dtype)


# ---- reductions and contractions ----

def _accumulator(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@rule(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def _sum(fn, node, args, out):
    shape, dtype = out
    _no_bool(dtype)
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else node.kwargs.get("dim"), len(x.shape))
    total = fn.reduce(x, dims, "add", 0, _accumulator(dtype))
    if node.target in (aten.mean.dim, aten.mean.default):
        if not dtype.is_floating_point:
            raise NoRule("mean of integers")
        count = math.prod(x.shape[d] for d in dims)
        total = fn.op("divide", [total, fn.const(count, total.dtype, total.shape)], total.shape, total.dtype)
    return fn.reshape(fn.convert(total, dtype), shape)


def _extreme(body, sign):
    def emit(fn, node, args, out):
        shape, dtype = out
        _no_bool(dtype)
        x = args[0]
        dims = _dims(args[1] if len(args) > 1 else node.kwargs.get("dim", []), len(x.shape))
        if dtype.is_floating_point:
            init = sign * math.inf
        else:
            info = torch.iinfo(dtype)
            init = info.min if sign < 0 else info.max
        return fn.reshape(fn.reduce(x, dims, body, init, dtype), shape)
    return emit


rule(aten.amax.default)(_extreme("maximum", -1))
rule(aten.amin.default)(_extreme("minimum", 1))


def _boolean(body, init):
    def emit(fn, node, args, out):
        x = args[0]
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
        dims = _dims(dims, len(x.shape))
        return fn.reshape(fn.reduce(fn.convert(x, torch.bool), dims, body, init, torch.bool), out[0])
    return emit


rule(aten.all.default, aten.all.dim, aten.all.dims)(_boolean("and", True))
rule(aten.any.default, aten.any.dim, aten.any.dims)(_boolean("or", False))


@rule(aten.mm.default, aten.bmm.default)
def _matmul(fn, node, args, out):
    shape, dtype = out
    _no_bool(dtype)
    a, b = (fn.convert(x, dtype) for x in args[:2])
    batch = "[0]" if node.target is aten.bmm.default else "[]"
    lhs = len(a.shape) - 1
    numbers = (f"#stablehlo.dot<lhs_batching_dimensions = {batch}, rhs_batching_dimensions = {batch}, "
               f"lhs_contracting_dimensions = [{lhs}], rhs_contracting_dimensions = [{lhs - 1}]>")
    return fn.op("dot_general", [a, b], shape, dtype, f"dot_dimension_numbers = {numbers}")


@rule(aten._softmax.default)
def _softmax(fn, node, args, out):
    x, dim, half_to_float = args
    shape, dtype = out
    if half_to_float or not dtype.is_floating_point:
        raise NoRule("softmax to another dtype")
    compute = _accumulator(dtype)
    x = fn.convert(x, compute)
    dim = _dims(dim, len(shape))
    kept = [1 if i in dim else n for i, n in enumerate(shape)]

    def back(v):  # a reduced value broadcast back over the reduced dims
        return fn.broadcast(fn.reshape(v, kept), shape)

    top = back(fn.reduce(x, dim, "maximum", -math.inf, compute))
    e = fn.op("exponential", [fn.op("subtract", [x, top], shape, compute)], shape, compute)
    total = back(fn.reduce(e, dim, "add", 0, compute))
    return fn.convert(fn.op("divide", [e, total], shape, compute), dtype)


@rule(aten.index_select.default)
def _index_select(fn, node, args, out):
    x, dim, index = args
    rank = len(x.shape)
    dim %= rank if rank else 1
    if not rank and index.dtype in (torch.int64, torch.int32) and math.prod(index.shape) == 1 and out[0] == ():
        return fn.op("reshape", [x], (), x.dtype)  # a 0-d tensor's one element (index_add's backward of one)
    if not rank or index.dtype not in (torch.int64, torch.int32) or len(index.shape) > 1:
        raise NoRule("index_select of a 0-d tensor")
    index = fn.reshape(index, (math.prod(index.shape),))
    sizes = list(x.shape)
    sizes[dim] = 1
    offsets = [d for d in range(rank) if d != dim]
    numbers = (f"#stablehlo.gather<offset_dims = [{', '.join(map(str, offsets))}], collapsed_slice_dims = [{dim}], "
               f"start_index_map = [{dim}], index_vector_dim = 1>")
    gathered = list(x.shape)
    gathered[dim] = index.shape[0]
    result = fn.op("gather", [x, index], gathered, x.dtype,
                   f"dimension_numbers = {numbers}, slice_sizes = {_array(sizes)}, indices_are_sorted = false")
    return fn.reshape(result, out[0])


@rule(aten.gather.default)
def _gather(fn, node, args, out):
    """``out[i][j] = x[index[i][j]][j]`` (dim 0): each element's full coordinates, ``index`` along ``dim`` and
    the element's own position along the others, gathered one element at a time."""
    x, dim, index = args[:3]
    rank = len(x.shape)
    if not rank or len(index.shape) != rank or not index.shape or node.kwargs.get("sparse_grad"):
        raise NoRule("gather of a 0-d tensor")
    dim %= rank
    column = (*index.shape, 1)
    coordinates = [fn.reshape(fn.convert(index, torch.int64), column) if d == dim else
                   fn.op("iota", [], column, torch.int64, f"iota_dimension = {d} : i64") for d in range(rank)]
    indices = fn.op("concatenate", coordinates, (*index.shape, rank), torch.int64, f"dimension = {rank} : i64")
    every = ", ".join(map(str, range(rank)))
    numbers = (f"#stablehlo.gather<collapsed_slice_dims = [{every}], start_index_map = [{every}], "
               f"index_vector_dim = {rank}>")
    return fn.op("gather", [x, indices], index.shape, x.dtype,
                 f"dimension_numbers = {numbers}, slice_sizes = {_array([1] * rank)}, indices_are_sorted = false")


@rule(aten.index_put.default)
def _index_put(fn, node, args, out):
    """``x[..., index] = values`` (``+=`` with ``accumulate``) for one integer index after leading full
    slices (``None``: ``index_copy``'s decomposition along ``dim``, a KV cache's update): a scatter of the
    windows ``values`` gives (broadcast to ``x.shape[:dim] + index.shape + x.shape[dim + 1:]``), each
    window all of ``x`` but ``dim``."""
    x, indices, values = args[:3]
    accumulate = args[3] if len(args) > 3 else node.kwargs.get("accumulate", False)
    dim = next((d for d, index in enumerate(indices) if index is not None), len(indices))
    if len(indices) != dim + 1 or not isinstance(indices[dim], V) \
            or indices[dim].dtype not in (torch.int64, torch.int32) or dim >= len(x.shape) \
            or (accumulate and x.dtype is torch.bool):
        raise NoRule("index_put with other than one integer index after full slices")
    index = fn.convert(indices[dim], torch.int64)
    depth = len(index.shape)
    negative = fn.compare(index, fn.const(0, torch.int64, index.shape), "LT")  # x[-1]: the last row, as on CPU
    index = fn.op("select", [negative, fn.op("add", [index, fn.const(x.shape[dim], torch.int64, index.shape)],
                                             index.shape, torch.int64), index], index.shape, torch.int64)
    rows_shape = (*x.shape[:dim], *index.shape, *x.shape[dim + 1:])
    rows = fn.operand(values, x.dtype, rows_shape)
    if math.prod(index.shape) == 1 and not accumulate:  # one position: an update XLA does in place
        return _update_one(fn, x, dim, fn.reshape(index, ()), fn.reshape(rows, (*x.shape[:dim], 1, *x.shape[dim + 1:])))
    window = [d for d in range(len(rows_shape)) if d < dim or d >= dim + depth]
    numbers = (f"#stablehlo.scatter<update_window_dims = [{', '.join(map(str, window))}], "
               f"inserted_window_dims = [{dim}], scatter_dims_to_operand_dims = [{dim}], index_vector_dim = {depth}>")
    return fn.region("scatter", [x, index, rows], x.shape, x.dtype, "add" if accumulate else None,
                     f"scatter_dimension_numbers = {numbers}, indices_are_sorted = false, unique_indices = false")


def _update_one(fn, x, dim, start, row):
    """``x`` with ``row`` (``x``'s shape, 1 along ``dim``) at ``start`` along ``dim``: a dynamic_update_slice,
    which XLA runs in place on a donated buffer (a scatter of the same row copied the whole of a 4 MiB KV
    cache each call). A position out of range writes nothing, as the scatter's: the update then writes back
    the row already there (dynamic_update_slice alone would clamp it onto the last row)."""
    zero = fn.const(0, torch.int64)
    starts = [start if d == dim else zero for d in range(len(x.shape))]
    inside = fn.op("and", [fn.compare(start, zero, "GE"), fn.compare(start, fn.const(x.shape[dim], torch.int64), "LT")],
                   (), torch.bool)
    there = fn.op("dynamic_slice", [x, *starts], row.shape, x.dtype, f"slice_sizes = {_array(row.shape)}")
    row = fn.op("select", [fn.broadcast(inside, row.shape), row, there], row.shape, x.dtype)
    return fn.op("dynamic_update_slice", [x, row, *starts], x.shape, x.dtype)


def _offset_slice_rule(fn, node, args, out):
    base, offset, length = args
    flat = fn.reshape(base, (math.prod(base.shape),))
    start = fn.reshape(fn.convert(offset, torch.int64), ())
    return fn.op("dynamic_slice", [flat, start], (length,), base.dtype, f"slice_sizes = {_array([length])}")


def register_ours() -> None:
    """Ops of ours that exist once their modules are imported (``runtime_offsets``)."""
    ours = getattr(torch.ops, "neuron_device", None)
    if ours is not None and hasattr(ours, "offset_slice"):
        RULES.setdefault(ours.offset_slice.default, _offset_slice_rule)


