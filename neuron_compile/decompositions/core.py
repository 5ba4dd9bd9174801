"""Core decompositions: ATen ops the table leaves and torch-mlir does not legalize to StableHLO.

The ``_ours`` registry (``_OURS``) that every rule of the core families
(here, ``gamma``, ``reductions``, ``layers``) registers into; the package's
``__init__`` puts it into the table after torch-mlir's own. This module: views
and copies (squeeze.dims, slice_scatter, the empty factories), 0-d inputs
(``_RANK0``: torch-mlir's lowerings of reductions and scans on a 0-d tensor),
indexing and scatters (index_put with negative indices, scatter_reduce,
index_reduce, topk), remainder with Python's sign, and OpInfo's long tail of
small elementwise ops (hypot, fmax/fmin, roll, logcumsumexp, dist, cdist...).
Each entry says which model hits it.
"""

from __future__ import annotations

import math
import threading

import torch
import torch._decomp
from torch._decomp import register_decomposition

aten = torch.ops.aten

_OURS: dict = {}


def _ours(op):
    return register_decomposition(op, registry=_OURS)


@_ours(aten.squeeze.dims)
def _squeeze_dims(x: torch.Tensor, dims):
    # Every transformers causal-LM loss hits this (cross-entropy's target squeeze);
    # torch-mlir legalizes only squeeze.dim. A view to the squeezed shape is exact.
    if x.dim() == 0:
        return aten.view.default(x, [])
    wanted = {d % x.dim() for d in dims}
    shape = [s for i, s in enumerate(x.shape) if not (i in wanted and s == 1)]
    return aten.view.default(x, shape)


@_ours(aten.slice_scatter)
def _slice_scatter(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1):
    # Backward of any slice (rotary embeddings' rotate_half in llama, qwen, ...) emits
    # slice_scatter with end=INT64_MAX, on which torch-mlir's StableHLO lowering dies
    # with std::bad_alloc. Clamp the bounds; a unit step becomes a concatenation.
    dim = dim % x.dim()
    size = x.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    start, end = max(0, min(start, size)), max(0, min(end, size))
    if step != 1:
        from torch._decomp import decomposition_table as torch_table

        return torch_table[aten.slice_scatter.default](x, src, dim, start, end, step)
    pieces = []
    if start > 0:
        pieces.append(aten.slice.Tensor(x, dim, 0, start))
    pieces.append(src)
    if end < size:
        pieces.append(aten.slice.Tensor(x, dim, end, size))
    return aten.cat.default(pieces, dim) if len(pieces) > 1 else aten.clone.default(src)


@_ours(aten.max_pool2d_with_indices_backward)
def _max_pool2d_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    # Every CNN with max-pooling hits this in training; torch-mlir has no StableHLO
    # lowering for it. The forward's indices are flat positions in each (N, C)
    # plane, so the gradient is a scatter-add of grad_output into those positions
    # (overlapping windows add up, as in eager).
    batch = list(x.shape[:-2])
    plane = x.shape[-2] * x.shape[-1]
    zeros = aten.new_zeros.default(grad_output, batch + [plane])
    flat_grad = aten.view.default(grad_output, batch + [-1])
    flat_idx = aten.view.default(indices, batch + [-1])
    return aten.view.default(aten.scatter_add.default(zeros, -1, flat_idx, flat_grad), list(x.shape))


def _zeros(size, dtype, device):
    # Not aten.full: its own decomposition allocates with aten.empty (a recursion).
    zero = aten.scalar_tensor.default(0, dtype=dtype or torch.get_default_dtype(), device=device)
    return aten.clone.default(aten.expand.default(zero, list(size)))


@_ours(aten.empty.memory_format)
def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # torch-mlir lowers aten.empty to tensor.empty, which XLA refuses to import ("unsupported
    # op for export to XLA"): transformers' MoE routing (an empty tensor filled by scatter,
    # mixtral, qwen3_moe...) and OpInfo's empty/new_empty ops. Contents are undefined: zeros.
    return _zeros(size, dtype, device)


@_ours(aten.empty_strided)
def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype, device)


@_ours(aten.empty_permuted)
def _empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype, device)


@_ours(aten.empty_like)
def _empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _zeros(x.shape, dtype or x.dtype, device or x.device)


@_ours(aten.new_empty)
def _new_empty(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype or x.dtype, device or x.device)


@_ours(aten.new_empty_strided)
def _new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype or x.dtype, device or x.device)


# Reductions over a dim of a 0-d tensor: torch-mlir's StableHLO pipeline segfaults on
# them (OpInfo's sum/amax/... samples of shape [] with dim=0). A 0-d tensor reduced
# over its only "dim" is itself (in the reduction's dtype); other ranks go on as before.
def _sum_dtype(x, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not (x.dtype.is_floating_point or x.dtype.is_complex) else x.dtype


def _rank0(fn):
    def decomposition(x, *args, **kwargs):
        return fn(x, *args, **kwargs) if isinstance(x, torch.Tensor) and x.dim() == 0 else NotImplemented
    return decomposition


_RANK0 = {
    aten.sum.dim_IntList: lambda x, dim=None, keepdim=False, *, dtype=None:
        aten._to_copy.default(x, dtype=_sum_dtype(x, dtype)),
    aten.prod.dim_int: lambda x, dim, keepdim=False, *, dtype=None:
        aten._to_copy.default(x, dtype=_sum_dtype(x, dtype)),
    aten.mean.dim: lambda x, dim=None, keepdim=False, *, dtype=None:
        aten._to_copy.default(x, dtype=dtype or x.dtype),
    aten.amax.default: lambda x, dim=(), keepdim=False: aten.clone.default(x),
    aten.amin.default: lambda x, dim=(), keepdim=False: aten.clone.default(x),
    aten.logsumexp.default: lambda x, dim, keepdim=False: aten.clone.default(x),
    aten.max.dim: lambda x, dim, keepdim=False: (aten.clone.default(x), aten.zeros_like.default(x, dtype=torch.int64)),
    aten.min.dim: lambda x, dim, keepdim=False: (aten.clone.default(x), aten.zeros_like.default(x, dtype=torch.int64)),
    aten.argmax.default: lambda x, dim=None, keepdim=False: aten.zeros_like.default(x, dtype=torch.int64),
    aten.argmin.default: lambda x, dim=None, keepdim=False: aten.zeros_like.default(x, dtype=torch.int64),
    aten.any.dim: lambda x, dim, keepdim=False: aten.ne.Scalar(x, 0),
    aten.all.dim: lambda x, dim, keepdim=False: aten.ne.Scalar(x, 0),
    aten.cumsum.default: lambda x, dim, *, dtype=None: aten._to_copy.default(x, dtype=_sum_dtype(x, dtype)),
    # torch.softmax(x, dim=0) of a 0-d x (nn.Softmax on a scalar): torch-mlir's own lowering of _softmax
    # (torch-mlir's table leaves the op to it) does not apply to a reduction over a 0-d tensor, and its
    # torch-decompose-complex-ops pass then never finished (the process hung). PyTorch's decomposition
    # goes through amax and sum, whose 0-d rules are above.
    aten._softmax.default: torch._decomp.decomposition_table[aten._softmax.default],
}


_WRAPPING = threading.local()


def _wrap_negative(x: torch.Tensor, indices):
    """Integer index tensors with negative entries counted from the end, as eager reads them."""
    out = []
    for dim, index in enumerate(indices):
        if index is not None and not (index.dtype == torch.bool or index.dtype == torch.uint8):
            index = aten.where.self(aten.lt.Scalar(index, 0), aten.add.Tensor(index, x.shape[dim]), index)
        out.append(index)
    return out


def _with_wrapped_indices(op):
    # XLA's gather and scatter clamp out-of-range indices where PyTorch counts negative
    # ones from the end: x[:, [-2]] (falcon's _split_heads, OpInfo index samples) read the
    # wrong row. Wrap them, then trace the op itself (the flag stops the recursion).
    def decomposition(x, indices, *args, **kwargs):
        if getattr(_WRAPPING, "on", False):
            return NotImplemented
        _WRAPPING.on = True
        try:
            return op(x, _wrap_negative(x, indices), *args, **kwargs)
        finally:
            _WRAPPING.on = False

    return decomposition


_OURS[aten.index.Tensor] = _with_wrapped_indices(aten.index.Tensor)
_index_put_wrapped = _with_wrapped_indices(aten.index_put.default)


@_ours(aten.index_put.default)
def _index_put(x: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False):
    # x[mask] = v (masked writes in user code, OpInfo index_put): torch-mlir does not lower
    # index_put with a boolean index. When v is the same for every selected position
    # (it broadcasts over x's trailing dims), that is a select: where(mask, v, x).
    mask = indices[0] if len(indices) == 1 else None
    if mask is not None and mask.dtype in (torch.bool, torch.uint8) and \
            values.dim() <= x.dim() - mask.dim() and not getattr(_WRAPPING, "on", False):
        selected = aten._to_copy.default(mask, dtype=torch.bool)
        selected = aten.view.default(selected, list(mask.shape) + [1] * (x.dim() - mask.dim()))
        values = aten._to_copy.default(values, dtype=x.dtype)
        if accumulate:
            return aten.add.Tensor(x, aten.where.self(selected, values, aten.zeros_like.default(x)))
        return aten.where.self(selected, aten.expand.default(values, list(x.shape)), x)
    return _index_put_wrapped(x, indices, values, accumulate)


@_ours(aten._index_put_impl.default)
def _index_put_impl(x: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False, unsafe: bool = False):
    # an eager x[mask] = v on the neuron device reaches its graph as index_put_'s implementation
    return _index_put(x, indices, values, accumulate)


def _python_remainder(a: torch.Tensor, b: torch.Tensor):
    # torch-mlir lowers remainder as a truncated fmod (stablehlo.remainder), while
    # PyTorch's remainder takes the divisor's sign (Python's %): OpInfo remainder and
    # __rmod__ gave wrong values for mixed signs. Shift nonzero results of the wrong sign.
    r = aten.fmod.Tensor(a, b)
    wrong_sign = aten.logical_and.default(aten.ne.Scalar(r, 0),
                                          aten.ne.Tensor(aten.lt.Scalar(r, 0), aten.lt.Scalar(b, 0)))
    return aten.where.self(wrong_sign, aten.add.Tensor(r, b), r)


@_ours(aten.remainder.Tensor)
def _remainder(a: torch.Tensor, b: torch.Tensor):
    return _python_remainder(a, b)


@_ours(aten.remainder.Scalar)
def _remainder_scalar(a: torch.Tensor, b):
    # The divisor's sign is known here: no comparison of a constant (torch-mlir folds
    # lt(scalar_tensor(1.5), 0) to true).
    divisor = aten.scalar_tensor.default(b, dtype=torch.result_type(a, b), device=a.device)
    r = aten.fmod.Tensor(a, divisor)
    wrong_sign = aten.gt.Scalar(r, 0) if b < 0 else aten.lt.Scalar(r, 0)
    return aten.where.self(wrong_sign, aten.add.Tensor(r, divisor), r)


@_ours(aten.remainder.Scalar_Tensor)
def _remainder_scalar_tensor(a, b: torch.Tensor):
    return _python_remainder(aten.scalar_tensor.default(a, dtype=torch.result_type(b, a), device=b.device), b)


def _masked_scatter_reduce(x, dim, index, src, reduce, include_self):
    """scatter_reduce by a one-hot mask over x's positions along dim (O(|index| * x.shape[dim]) work).

    Where index is shorter than x in another dim, the reduction runs on that slice
    of x and is written back (slice_scatter); NotImplemented (the op stays) for a
    0-d x or an index of another rank.
    """
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0 or index.dim() != x.dim():
        return NotImplemented
    if x.dtype == torch.bool:  # in int64, back to bool: a sum is an or, a product an and
        out = _masked_scatter_reduce(aten._to_copy.default(x, dtype=torch.int64), dim, index,
                                     aten._to_copy.default(src, dtype=torch.int64), reduce, include_self)
        return out if out is NotImplemented else aten._to_copy.default(out, dtype=torch.bool)
    short = [d for d in range(x.dim()) if d != dim and index.shape[d] < x.shape[d]]
    if short:
        part = x
        for d in short:
            part = aten.slice.Tensor(part, d, 0, index.shape[d])
        out = _masked_scatter_reduce(part, dim, index, src, reduce, include_self)
        for d in reversed(short):
            outer = x
            for e in short[:short.index(d)]:
                outer = aten.slice.Tensor(outer, e, 0, index.shape[e])
            out = aten.slice_scatter.default(outer, out, d, 0, index.shape[d])
        return out
    for d in range(src.dim()):
        if src.shape[d] != index.shape[d]:
            src = aten.slice.Tensor(src, d, 0, index.shape[d])
    src = aten._to_copy.default(src, dtype=x.dtype)
    width = x.shape[dim]
    hot = aten.eq.Tensor(aten.unsqueeze.default(index, -1), _arange(width, x))  # index.shape + [T]
    spread = aten.expand.default(aten.unsqueeze.default(src, -1), list(hot.shape))
    if reduce in ("sum", "mean"):
        fill = 0
    elif reduce == "prod":
        fill = 1
    elif x.dtype.is_floating_point:
        fill = float("-inf") if reduce == "amax" else float("inf")
    else:
        info = torch.iinfo(x.dtype)
        fill = info.min if reduce == "amax" else info.max
    masked = aten.where.self(hot, spread, aten.full_like.default(spread, fill))
    if reduce in ("sum", "mean"):
        red = aten.sum.dim_IntList(masked, [dim])
    elif reduce == "prod":
        red = aten.prod.dim_int(masked, dim)
    elif reduce == "amax":
        red = aten.amax.default(masked, [dim])
    else:
        red = aten.amin.default(masked, [dim])
    red = aten.movedim.int(red, -1, dim)  # x's shape
    count = aten.movedim.int(aten.sum.dim_IntList(aten._to_copy.default(hot, dtype=torch.int64), [dim]), -1, dim)
    hit = aten.gt.Scalar(count, 0)
    if reduce == "mean":
        total = aten.add.Tensor(red, x) if include_self else red
        n = aten.add.Tensor(count, 1) if include_self else aten.clamp_min.default(count, 1)
        mean = aten.div.Tensor(total, n) if x.dtype.is_floating_point else \
            aten.div.Tensor_mode(total, n, rounding_mode="floor")
        return aten.where.self(hit, aten._to_copy.default(mean, dtype=x.dtype), x)
    if include_self:
        combine = {"sum": aten.add.Tensor, "prod": aten.mul.Tensor, "amax": aten.maximum.default,
                   "amin": aten.minimum.default}[reduce]
        red = combine(x, red)
    return aten.where.self(hit, red, x)


@_ours(aten.scatter_reduce.two)
def _scatter_reduce(x, dim: int, index, src, reduce: str, *, include_self: bool = True):
    # torch-mlir lowers none of scatter_reduce, scatter(reduce=), index_reduce to StableHLO
    # (OpInfo scatter_reduce.*, index_reduce.*, scatter with reduce; segment sums in GNNs).
    return _masked_scatter_reduce(x, dim, index, src, reduce, include_self)


@_ours(aten.scatter.reduce)
def _scatter_with_reduce(x, dim: int, index, src, *, reduce: str):
    return _masked_scatter_reduce(x, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce], True)


@_ours(aten.scatter.value_reduce)
def _scatter_value_with_reduce(x, dim: int, index, value, *, reduce: str):
    src = aten.full.default(list(index.shape), value, dtype=x.dtype, device=x.device)
    return _masked_scatter_reduce(x, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce], True)


@_ours(aten.index_reduce)
def _index_reduce(x, dim: int, index, source, reduce: str, *, include_self: bool = True):
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0:  # a 0-d x is a 1-element vector here
        one = _index_reduce(aten.view.default(x, [1]), 0, index, aten.view.default(source, [-1]), reduce,
                            include_self=include_self)
        return NotImplemented if one is NotImplemented else aten.view.default(one, [])
    shape = [1] * source.dim()
    shape[dim] = -1
    spread = aten.expand.default(aten.view.default(index, shape), list(source.shape))
    return _masked_scatter_reduce(x, dim, spread, source, reduce, include_self)


@_ours(aten.topk)
def _topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    # torch-mlir lowers topk only with sorted=True (deepseek_v3's expert-group routing asks
    # sorted=False). Unsorted order is unspecified, so the sorted result is a valid one.
    if sorted:
        return NotImplemented
    return aten.topk.default(x, k, dim, largest, True)


# Small ops torch-mlir has no StableHLO lowering for, each written with ops it has
# (OpInfo's long tail: one OpInfo entry each).
@_ours(aten.hypot)
def _hypot(a, b):
    return aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(a, a), aten.mul.Tensor(b, b)))


@_ours(aten.fmax)
def _fmax(a, b):
    # max that ignores a NaN operand (NaN only when both are)
    return aten.where.self(aten.isnan.default(b), a, aten.where.self(aten.isnan.default(a), b, aten.maximum.default(a, b)))


@_ours(aten.fmin)
def _fmin(a, b):
    return aten.where.self(aten.isnan.default(b), a, aten.where.self(aten.isnan.default(a), b, aten.minimum.default(a, b)))


@_ours(aten.narrow_copy)
def _narrow_copy(x, dim: int, start: int, length: int):
    if length == 0 or x.numel() == 0:  # an empty slice does not lower; its value is a constant
        shape = list(x.shape)
        shape[dim] = length
        return _zeros(shape, x.dtype, x.device)
    return aten.clone.default(aten.slice.Tensor(x, dim, start, start + length))


def _copy_of(view):
    """A contiguous copy of a view (the ``*_copy`` ops return one, whatever the input's layout)."""
    if view.numel() == 0:  # an empty slice does not lower; its value is a constant
        view = _zeros(view.shape, view.dtype, view.device)
    return aten.clone.default(view, memory_format=torch.contiguous_format)


# the view-copy ops no table decomposes (PyTorch's test_view_ops.py: slice_copy of a channels-last
# tensor, split_copy with out=): Torch-MLIR does not legalize them; each is its view, copied
@_ours(aten.slice_copy.Tensor)
def _slice_copy(x, dim: int = 0, start=None, end=None, step: int = 1):
    return _copy_of(aten.slice.Tensor(x, dim, start, end, step))


@_ours(aten.select_copy.int)
def _select_copy(x, dim: int, index: int):
    return _copy_of(aten.select.int(x, dim, index))


@_ours(aten.split_copy.Tensor)
def _split_copy(x, split_size: int, dim: int = 0):
    return [_copy_of(v) for v in aten.split.Tensor(x, split_size, dim)]


@_ours(aten.detach_copy.default)
def _detach_copy(x):
    return _copy_of(aten.alias.default(x))


@_ours(aten.roll)
def _roll(x, shifts, dims=()):
    # torch-mlir's roll lowering fails on a shift of 0 (a no-op: a copy); other shifts keep it
    size = [x.numel()] if not dims else [x.shape[d] for d in dims]
    if x.numel() and all(s % n == 0 for s, n in zip(shifts, size)):
        return aten.clone.default(x)
    return NotImplemented


@_ours(aten.linalg_vector_norm)
def _vector_norm_rank0(x, ord=2, dim=None, keepdim: bool = False, *, dtype=None):
    # torch-mlir's StableHLO pipeline fails on a norm over the only "dim" of a 0-d tensor
    # (OpInfo cosine_similarity, masked.norm): the norm of one element is |x| (ord 0: x != 0).
    # Other ranks keep its lowering.
    if x.dim() != 0:
        return NotImplemented
    out = aten._to_copy.default(aten.ne.Scalar(x, 0), dtype=x.dtype) if ord == 0 else aten.abs.default(x)
    return aten._to_copy.default(out, dtype=dtype) if dtype is not None else out


@_ours(aten.masked_scatter)
def _masked_scatter_broadcast(x, mask, source):
    # torch-mlir lowers masked_scatter only when x and mask have one shape (OpInfo: a [5] x
    # under a [5, 5] mask broadcasts to [5, 5]): expand both first, then the op itself.
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    if list(x.shape) == shape and list(mask.shape) == shape:
        return NotImplemented
    return aten.masked_scatter.default(aten.clone.default(aten.expand.default(x, shape)),
                                       aten.expand.default(mask, shape), source)


@_ours(aten.clamp.Tensor)
def _clamp_tensor(x, min=None, max=None):
    # torch-mlir's clamp.Tensor needs bounds of x's shape (OpInfo clamp_max: a [5] bound on a
    # [5, 1] input broadcasts to [5, 5]). maximum/minimum broadcast, promote and keep NaN as eager.
    if min is not None:
        x = aten.maximum.default(x, min)
    if max is not None:
        x = aten.minimum.default(x, max)
    return x


@_ours(aten.all.dims)
def _all_dims(x, dim=None, keepdim: bool = False):
    # torch-mlir has no all.dims; dim=None reduces everything, dim=() nothing (as eager)
    truth = aten.ne.Scalar(x, 0)
    if dim is None:
        out = aten.all.default(truth)
        return aten.view.default(out, [1] * x.dim()) if keepdim else out
    for d in sorted({d % max(x.dim(), 1) for d in dim}, reverse=True):
        truth = aten.all.dim(truth, d, keepdim) if x.dim() else truth
    return truth


@_ours(aten.angle.default)
def _angle(x):
    # real inputs only (complex ones do not lower anyway): pi below zero, NaN kept, as ATen
    if x.dtype.is_complex:
        return NotImplemented
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    pi = aten.where.self(aten.lt.Scalar(x, 0), aten.full_like.default(x, math.pi), aten.zeros_like.default(x))
    return aten.where.self(aten.isnan.default(x), x, pi)


def _logaddexp(a, b):
    big, small = aten.maximum.default(a, b), aten.minimum.default(a, b)
    out = aten.add.Tensor(big, aten.log1p.default(aten.exp.default(aten.sub.Tensor(small, big))))
    return aten.where.self(aten.isinf.default(big), big, out)  # +inf wins; both -inf stay -inf


@_ours(aten.logcumsumexp)
def _logcumsumexp(x, dim: int):
    # torch-mlir's lowering gives inf/NaN (exp before the running max). A Hillis-Steele scan of
    # logaddexp: log2(n) shifted steps, each element combines with the one 2^k before it.
    if x.dim() == 0:
        return aten.clone.default(x)
    if not x.dtype.is_floating_point or x.dtype.is_complex:
        return NotImplemented
    dim = dim % x.dim()
    n = x.shape[dim]
    step = 1
    while step < n:
        pad = [0, 0] * (x.dim() - 1 - dim) + [step, 0]
        shifted = aten.constant_pad_nd.default(aten.slice.Tensor(x, dim, 0, n - step), pad, -math.inf)
        x = _logaddexp(x, shifted)
        step *= 2
    return x


@_ours(aten.view_copy.default)
def _view_copy(x, size):
    return aten.clone.default(aten.view.default(x, size))


@_ours(aten.permute_copy)
def _permute_copy(x, dims):
    return aten.clone.default(aten.permute.default(x, dims))


@_ours(aten.unbind_copy.int)
def _unbind_copy(x, dim: int = 0):
    return [aten.clone.default(aten.select.int(x, dim, i)) for i in range(x.shape[dim])]


@_ours(aten.dist)
def _dist(a, b, p=2):
    return aten.linalg_vector_norm.default(aten.sub.Tensor(a, b), p)


def _arange(n: int, like: torch.Tensor) -> torch.Tensor:
    return aten.arange.start_step(0, n, 1, dtype=torch.int64, device=like.device)


@_ours(aten._cdist_forward)
def _cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode=None):
    # torch-mlir does not lower aten._cdist_forward (torch.cdist): pairwise differences,
    # then the p-norm over the last dim (exact, no matmul trick).
    diff = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))  # [..., r1, r2, m]
    return aten.linalg_vector_norm.default(diff, p, [-1])
