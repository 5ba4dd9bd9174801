"""The decomposition table AOTAutograd applies before Torch-MLIR sees a graph.

torch-mlir's FX importer applies no decompositions of its own, so what reaches
it is exactly what this table leaves. Three layers, later ones win:

1. torch-mlir's own table (``fx_decomp_util.get_decomposition_table``): PyTorch's
   core-ATen decompositions, minus a few whose output torch-mlir lowers worse
   (roll, one_hot, rms_norm, ...: it keeps its C++ lowering for those), plus
   the overloads torch-mlir needs decomposed (layer/group/batch norm, SDPA, ...);
2. ours, below: ops that the table leaves and that torch-mlir does not
   legalize to StableHLO. Each entry says which model hits it.
"""

from __future__ import annotations

import functools
import math
import threading

import torch
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


_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)


def _lgamma_positive(z: torch.Tensor) -> torch.Tensor:
    """log Gamma(z) for z >= 0.5 by Lanczos (g=7, 9 terms)."""
    z = aten.sub.Tensor(z, 1)
    series = aten.full_like.default(z, _LANCZOS[0])
    for k, c in enumerate(_LANCZOS[1:], start=1):
        series = aten.add.Tensor(series, aten.div.Tensor(aten.full_like.default(z, c), aten.add.Tensor(z, k)))
    t = aten.add.Tensor(z, 7.5)
    half_log_2pi = 0.9189385332046727
    return aten.add.Tensor(aten.add.Tensor(aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(z, 0.5), aten.log.default(t)), t),
                                           half_log_2pi), aten.log.default(series))


@_ours(aten.lgamma)
def _lgamma(x: torch.Tensor):
    # torch-mlir does not lower aten.lgamma (OpInfo lgamma, mvlgamma; Poisson/Gamma losses).
    # Lanczos for x >= 0.5, the reflection log(pi / |sin(pi x)|) - lgamma(1 - x) below.
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    work = aten._to_copy.default(x, dtype=torch.float64) if x.dtype != torch.float64 else x
    small = aten.lt.Scalar(work, 0.5)
    safe = aten.where.self(small, aten.rsub.Scalar(work, 1), work)
    positive = _lgamma_positive(safe)
    sin = aten.abs.default(aten.sin.default(aten.mul.Tensor(work, math.pi)))
    reflected = aten.sub.Tensor(aten.log.default(aten.div.Tensor(aten.full_like.default(sin, math.pi), sin)), positive)
    out = aten.where.self(small, reflected, positive)
    # the poles at 0, -1, -2...: sin(pi x) is not exactly 0 there in floating point
    out = aten.where.self(_non_positive_integer(work), aten.full_like.default(out, float("inf")), out)
    return aten._to_copy.default(out, dtype=x.dtype)


def _non_positive_integer(x: torch.Tensor) -> torch.Tensor:
    return aten.logical_and.default(aten.le.Scalar(x, 0), aten.eq.Tensor(x, aten.floor.default(x)))


def _digamma_positive(z: torch.Tensor) -> torch.Tensor:
    """psi(z) for z > 0: ten recurrence steps, then the asymptotic series."""
    shift = aten.zeros_like.default(z)
    for k in range(10):
        shift = aten.add.Tensor(shift, aten.reciprocal.default(aten.add.Tensor(z, k)))
    w = aten.add.Tensor(z, 10)
    inv2 = aten.reciprocal.default(aten.mul.Tensor(w, w))
    series = aten.sub.Tensor(aten.log.default(w), aten.div.Tensor(aten.full_like.default(w, 0.5), w))
    power = inv2
    for j, b in enumerate(_BERNOULLI, start=1):
        series = aten.sub.Tensor(series, aten.mul.Tensor(power, b / (2 * j)))
        power = aten.mul.Tensor(power, inv2)
    return aten.sub.Tensor(series, shift)


@_ours(aten.digamma)
def _digamma(x: torch.Tensor):
    # torch-mlir does not lower aten.digamma (OpInfo digamma, polygamma_n_0, lgamma's
    # backward). Reflection psi(1 - x) - pi / tan(pi x) below 0.5.
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    work = aten._to_copy.default(x, dtype=torch.float64)
    small = aten.lt.Scalar(work, 0.5)
    positive = _digamma_positive(aten.where.self(small, aten.rsub.Scalar(work, 1), work))
    cot = aten.div.Tensor(aten.full_like.default(work, math.pi), aten.tan.default(aten.mul.Tensor(work, math.pi)))
    out = aten.where.self(small, aten.sub.Tensor(positive, cot), positive)
    # ATen: -inf at 0 (the reflection gives it), NaN at the negative integers (poles of either sign)
    pole = aten.logical_and.default(_non_positive_integer(work), aten.lt.Scalar(work, 0))
    out = aten.where.self(pole, aten.full_like.default(out, float("nan")), out)
    return aten._to_copy.default(out, dtype=x.dtype)


_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66)  # B2, B4, ..., B10


@_ours(aten.polygamma)
def _polygamma(n: int, x: torch.Tensor):
    # torch-mlir does not lower aten.polygamma (OpInfo polygamma_n_*): n = 0 is digamma;
    # n >= 1 is (-1)^(n+1) n! zeta(n+1, x), summed directly over ten shifts and by
    # Euler-Maclaurin beyond (for x > 0; poles and negative x are left to the formula).
    # Negative x: the reflection formula, psi_n(x) = (-1)^n psi_n(1 - x) - pi d^n/dx^n cot(pi x),
    # the Hurwitz zeta series' value that ATen's Cephes zeta sums (the Euler-Maclaurin tail at
    # x + 10 alone was 0.1% off below -5); nonpositive integers are ATen's +-inf.
    if n == 0:
        return aten.digamma.default(x)
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    if n == 1:
        return _trigamma(x)
    z = aten._to_copy.default(x, dtype=torch.float64)
    negative = aten.lt.Scalar(z, 0)
    pole = aten.logical_and.default(aten.le.Scalar(z, 0), aten.eq.Tensor(z, aten.floor.default(z)))
    z = aten.where.self(negative, aten.rsub.Scalar(z, 1), z)
    s = n + 1
    total = aten.zeros_like.default(z)
    for k in range(10):
        total = aten.add.Tensor(total, aten.pow.Tensor_Scalar(aten.add.Tensor(z, k), -s))
    w = aten.add.Tensor(z, 10)
    tail = aten.add.Tensor(aten.div.Tensor(aten.pow.Tensor_Scalar(w, 1 - s), s - 1),
                           aten.mul.Tensor(aten.pow.Tensor_Scalar(w, -s), 0.5))
    rising = float(s)  # s (s+1) ... (s+2j-2)
    for j, b in enumerate(_BERNOULLI, start=1):
        term = b / math.factorial(2 * j) * rising
        tail = aten.add.Tensor(tail, aten.mul.Tensor(aten.pow.Tensor_Scalar(w, -s - 2 * j + 1), term))
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    zeta = aten.add.Tensor(total, tail)
    out = aten.mul.Tensor(zeta, (-1) ** (n + 1) * math.factorial(n))
    cot = aten.reciprocal.default(aten.tan.default(aten.mul.Tensor(aten._to_copy.default(x, dtype=torch.float64),
                                                                   math.pi)))
    derivative = aten.zeros_like.default(cot)
    for power, coeff in enumerate(_cot_derivative(n)):
        if coeff:
            derivative = aten.add.Tensor(derivative, aten.mul.Tensor(aten.pow.Tensor_Scalar(cot, power), coeff))
    reflected = aten.sub.Tensor(aten.mul.Tensor(out, (-1) ** n), aten.mul.Tensor(derivative, math.pi))
    out = aten.where.self(negative, reflected, out)
    out = aten.where.self(pole, aten.full_like.default(out, (-1) ** (n + 1) * math.inf), out)
    out = aten.where.self(aten.eq.Scalar(x, math.inf), aten.full_like.default(out, math.nan), out)  # as Cephes
    return aten._to_copy.default(out, dtype=x.dtype)


def _cot_derivative(n: int) -> list:
    """Coefficients in c = cot(pi x) of d^n/dx^n cot(pi x) (d/dx c = -pi (1 + c^2))."""
    poly = [0.0, 1.0]
    for _ in range(n):
        deriv = [k * poly[k] for k in range(1, len(poly))] + [0.0]  # P'(c)
        nxt = [0.0] * (len(deriv) + 2)
        for k, a in enumerate(deriv):
            nxt[k] -= math.pi * a
            nxt[k + 2] -= math.pi * a
        poly = nxt
    return poly


def _trigamma(x: torch.Tensor):
    # ATen's calc_trigamma (Math.h), step for step in x's precision: reflection below 1/2,
    # six shifts, then the asymptotic series.
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    z = aten._to_copy.default(x, dtype=dtype)
    small = aten.lt.Scalar(z, 0.5)
    sin_pi = aten.sin.default(aten.mul.Tensor(z, math.pi))
    result = aten.where.self(small, aten.neg.default(aten.div.Tensor(aten.full_like.default(z, math.pi * math.pi),
                                                                         aten.mul.Tensor(sin_pi, sin_pi))),
                             aten.zeros_like.default(z))
    z = aten.where.self(small, aten.rsub.Scalar(z, 1), z)
    for _ in range(6):
        result = aten.add.Tensor(result, aten.reciprocal.default(aten.mul.Tensor(z, z)))
        z = aten.add.Tensor(z, 1)
    ixx = aten.reciprocal.default(aten.mul.Tensor(z, z))
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, 1.0 / 42), 1.0 / 30)
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, series), 1.0 / 6)
    series = aten.add.Tensor(aten.add.Tensor(aten.mul.Tensor(ixx, series), aten.reciprocal.default(aten.mul.Tensor(z, 2))), 1)
    result = aten.add.Tensor(result, aten.div.Tensor(series, z))
    return aten._to_copy.default(aten.where.self(small, aten.neg.default(result), result), dtype=x.dtype)


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


def _cumulative_extreme(x: torch.Tensor, dim: int, largest: bool):
    """(values, indices) of a running max/min along dim: a triangular mask, the last extreme's index."""
    if x.dim() == 0:
        return aten.clone.default(x), aten.zeros_like.default(x, dtype=torch.int64)
    dim = dim % x.dim()
    n = x.shape[dim]
    y = aten.movedim.int(x, dim, -1)
    grid = aten.expand.default(aten.unsqueeze.default(y, -2), list(y.shape[:-1]) + [n, n])  # [..., i, j] = y[j]
    idx = _arange(n, x)
    upto = aten.le.Tensor(aten.unsqueeze.default(idx, 0), aten.unsqueeze.default(idx, 1))  # j <= i
    if x.dtype.is_floating_point:
        fill = float("-inf") if largest else float("inf")
    else:
        info = torch.iinfo(x.dtype)
        fill = info.min if largest else info.max
    masked = aten.where.self(upto, grid, aten.full_like.default(grid, fill))
    values = aten.amax.default(masked, [-1]) if largest else aten.amin.default(masked, [-1])
    hits = aten.logical_and.default(upto, aten.eq.Tensor(grid, aten.unsqueeze.default(values, -1)))
    if x.dtype.is_floating_point:  # a NaN is the extreme from where it appears on
        nan_seen = aten.any.dim(aten.logical_and.default(upto, aten.isnan.default(grid)), -1)
        values = aten.where.self(nan_seen, aten.full_like.default(values, float("nan")), values)
        hits = aten.where.self(aten.unsqueeze.default(nan_seen, -1),
                               aten.logical_and.default(upto, aten.isnan.default(grid)), hits)
    position = aten.where.self(hits, aten.expand.default(idx, list(hits.shape)), aten.full_like.default(
        aten.expand.default(idx, list(hits.shape)), -1))
    indices = aten.amax.default(position, [-1])  # ATen reports the last position reaching the extreme
    return aten.movedim.int(values, -1, dim), aten.movedim.int(indices, -1, dim)


@_ours(aten.cummax)
def _cummax(x, dim: int):
    return _cumulative_extreme(x, dim, True)


@_ours(aten.cummin)
def _cummin(x, dim: int):
    return _cumulative_extreme(x, dim, False)


def _variance(x: torch.Tensor, dim, correction, keepdim: bool):
    """(var, mean) with eager's edge: no degrees of freedom left (N <= correction) gives NaN.

    torch-mlir's lowering divided by max(N - correction, 0) as if it were 1 (OpInfo
    var/std(_mean).unbiased of one element gave -0 where eager gives NaN).
    """
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else [d % max(x.dim(), 1) for d in dim]
    n = 1
    for d in dims:
        n *= x.shape[d]
    c = 1 if correction is None else correction
    mean = aten.mean.dim(x, dims, True)
    centered = aten.sub.Tensor(x, mean)
    total = aten.sum.dim_IntList(aten.mul.Tensor(centered, centered), dims, keepdim)
    var = aten.div.Tensor(total, max(n - c, 0))
    return var, mean if keepdim else aten.view.default(mean, list(var.shape))


def _real_float(fn):
    def decomposition(x, *args, **kwargs):
        if not x.dtype.is_floating_point:
            return NotImplemented
        if x.dtype in (torch.bfloat16, torch.float16):  # in float32, rounded once: ATen's acc_type
            out = fn(aten._to_copy.default(x, dtype=torch.float32), *args, **kwargs)
            if isinstance(out, tuple):
                return tuple(aten._to_copy.default(o, dtype=x.dtype) for o in out)
            return aten._to_copy.default(out, dtype=x.dtype)
        return fn(x, *args, **kwargs)
    return decomposition


_OURS[aten.var.correction] = _real_float(
    lambda x, dim=None, *, correction=None, keepdim=False: _variance(x, dim, correction, keepdim)[0])
_OURS[aten.std.correction] = _real_float(
    lambda x, dim=None, *, correction=None, keepdim=False: aten.sqrt.default(_variance(x, dim, correction, keepdim)[0]))
_OURS[aten.var_mean.correction] = _real_float(
    lambda x, dim=None, *, correction=None, keepdim=False: _variance(x, dim, correction, keepdim))
_OURS[aten.std_mean.correction] = _real_float(
    lambda x, dim=None, *, correction=None, keepdim=False: (
        aten.sqrt.default(_variance(x, dim, correction, keepdim)[0]), _variance(x, dim, correction, keepdim)[1]))


def _arange(n: int, like: torch.Tensor) -> torch.Tensor:
    return aten.arange.start_step(0, n, 1, dtype=torch.int64, device=like.device)


def _to_last_two(x: torch.Tensor, dim1: int, dim2: int):
    """Permute dims (dim1, dim2) to the end; returns the view and the inverse permutation."""
    perm = [d for d in range(x.dim()) if d not in (dim1, dim2)] + [dim1, dim2]
    inverse = [perm.index(d) for d in range(x.dim())]
    return aten.permute.default(x, perm), inverse


def _diagonal_indices(x: torch.Tensor, offset: int, dim1: int, dim2: int):
    n1, n2 = x.shape[dim1], x.shape[dim2]
    length = max(0, min(n1 + min(offset, 0), n2 - max(offset, 0)))
    i = _arange(length, x)
    return length, aten.sub.Tensor(i, min(offset, 0)), aten.add.Tensor(i, max(offset, 0))


@_ours(aten.diagonal)
def _diagonal(x: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    # torch-mlir has no StableHLO lowering for aten.diagonal: torch.diag, diagonal,
    # diag_embed's backward, trace-like code and most linalg OpInfo samples hit it.
    # A gather with two arange index vectors on the permuted tensor is the same view's values.
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    _, rows, cols = _diagonal_indices(x, offset, dim1, dim2)
    y, _ = _to_last_two(x, dim1, dim2)
    return aten.index.Tensor(y, [None] * (x.dim() - 2) + [rows, cols])


@_ours(aten.diagonal_scatter)
def _diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    # The backward of diagonal (and functionalized in-place writes to a diagonal) emits
    # diagonal_scatter, which torch-mlir does not lower either. Select src where
    # col - row == offset, x elsewhere: src is gathered along the rows first.
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    length, _, _ = _diagonal_indices(x, offset, dim1, dim2)
    y, inverse = _to_last_two(x, dim1, dim2)
    n1, n2 = y.shape[-2], y.shape[-1]
    if length == 0:
        return aten.clone.default(x)
    rows, cols = _arange(n1, x), _arange(n2, x)
    on_diagonal = aten.eq.Scalar(aten.sub.Tensor(aten.unsqueeze.default(cols, 0), aten.unsqueeze.default(rows, 1)),
                                 offset)
    pick = aten.clamp.default(aten.add.Tensor(rows, min(offset, 0)), 0, length - 1)
    src_rows = aten.index.Tensor(src, [None] * (src.dim() - 1) + [pick])  # [..., n1]
    src_full = aten.expand.default(aten.unsqueeze.default(src_rows, -1), list(y.shape))
    return aten.permute.default(aten.where.self(on_diagonal, src_full, y), inverse)


@_ours(aten.histc)
def _histc(x: torch.Tensor, bins: int = 100, min=0, max=0):
    # torch-mlir does not lower aten.histc; transformers' MoE layers (qwen3_moe, mixtral,
    # olmoe... grouped_mm_experts_forward) count tokens per expert with it. Bin index
    # floor((v - lo) * bins / (hi - lo)) as ATen computes it, the top edge in the last
    # bin, out-of-range values dropped; counts by one-hot sum.
    flat = aten.view.default(x, [-1])
    if min == max:
        lo, hi = aten.min.default(flat), aten.max.default(flat)
        same = aten.eq.Tensor(lo, hi)
        lo = aten.where.self(same, aten.sub.Tensor(lo, 1), lo)
        hi = aten.where.self(same, aten.add.Tensor(hi, 1), hi)
    else:
        lo = aten.scalar_tensor.default(min, dtype=x.dtype, device=x.device)
        hi = aten.scalar_tensor.default(max, dtype=x.dtype, device=x.device)
    scaled = aten.div.Tensor(aten.mul.Tensor(aten.sub.Tensor(flat, lo), bins), aten.sub.Tensor(hi, lo))
    index = aten._to_copy.default(aten.floor.default(scaled), dtype=torch.int64)
    index = aten.masked_fill.Scalar(index, aten.eq.Tensor(flat, hi), bins - 1)
    inside = aten.logical_and.default(aten.ge.Tensor(flat, lo), aten.le.Tensor(flat, hi))
    one_hot = aten.logical_and.default(aten.eq.Tensor(aten.unsqueeze.default(index, 1),
                                                      aten.unsqueeze.default(_arange(bins, x), 0)),
                                       aten.unsqueeze.default(inside, 1))
    return aten.sum.dim_IntList(aten._to_copy.default(one_hot, dtype=x.dtype), [0])


def _kth_smallest(x: torch.Tensor, k, dim: int, keepdim: bool, nan: str = "ignore"):
    """(values, indices) of the k-th smallest (0-based) along dim, from a sort (NaN sorts last).

    ``nan``: "ignore" takes position k as is; "propagate" (median) takes the last
    position, a NaN, when the slice has one; "skip" (nanmedian) takes the lower
    median of the non-NaN values (k is then recomputed per slice).
    """
    if x.dim() == 0:
        return aten.clone.default(x), aten.zeros_like.default(x, dtype=torch.int64)
    dim = dim % x.dim()
    n = x.shape[dim]
    key = x
    if x.dtype.is_floating_point:
        # XLA's sort comparator is not an order with NaNs in it: sort NaN as +inf, read x back
        key = aten.masked_fill.Scalar(x, aten.isnan.default(x), float("inf"))
    indices = aten.sort.default(key, dim)[1]
    values = aten.gather.default(x, dim, indices)
    if nan == "ignore":
        position = aten.full.default([1] * x.dim(), k, dtype=torch.int64, device=x.device)
        position = aten.expand.default(position, [1 if d == dim else s for d, s in enumerate(x.shape)])
    else:
        nans = aten.sum.dim_IntList(aten._to_copy.default(aten.isnan.default(x), dtype=torch.int64), [dim], True)
        if nan == "propagate":
            position = aten.where.self(aten.gt.Scalar(nans, 0), aten.full_like.default(nans, n - 1),
                                       aten.full_like.default(nans, k))
        else:
            position = aten.clamp_min.default(aten.div.Tensor_mode(aten.rsub.Scalar(nans, n - 1), 2,
                                                                   rounding_mode="floor"), 0)
    values = aten.gather.default(values, dim, position)
    indices = aten.gather.default(indices, dim, position)
    if not keepdim:
        values, indices = aten.squeeze.dim(values, dim), aten.squeeze.dim(indices, dim)
    return values, indices


@_ours(aten.median.dim)
def _median_dim(x: torch.Tensor, dim: int = -1, keepdim: bool = False):
    # torch-mlir does not lower aten.median (nor median.dim): the lower median of a
    # sort, a NaN when the slice has one (as in eager).
    n = x.shape[dim % x.dim()] if x.dim() else 1
    return _kth_smallest(x, (n - 1) // 2, dim, keepdim, nan="propagate")


@_ours(aten.median.default)
def _median(x: torch.Tensor):
    flat = aten.view.default(x, [-1])
    return aten.view.default(_kth_smallest(flat, (flat.numel() - 1) // 2, 0, False, nan="propagate")[0], [])


@_ours(aten.nanmedian.dim)
def _nanmedian_dim(x: torch.Tensor, dim: int = -1, keepdim: bool = False):
    # torch-mlir does not lower aten.nanmedian: the lower median of the non-NaN values.
    return _kth_smallest(x, 0, dim, keepdim, nan="skip")


@_ours(aten.nanmedian.default)
def _nanmedian(x: torch.Tensor):
    flat = aten.view.default(x, [-1])
    return aten.view.default(_kth_smallest(flat, 0, 0, False, nan="skip")[0], [])


def _one_per_row(x: torch.Tensor, dim: int, index: torch.Tensor):
    """Where ``index`` writes, as ``iota == index``, when it writes exactly one position per row
    along ``dim`` and covers every other dim of ``x`` (nll_loss's backward, one-hot targets).

    XLA fuses the compare into its consumer; the general scatter_add form below materializes an
    int64 tensor the size of ``x`` (three times the logits in a language model's loss backward).
    """
    dim = dim % x.dim() if x.dim() else 0
    if x.dim() == 0 or index.dim() != x.dim() or index.shape[dim] != 1:
        return None
    if any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        return None
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    iota = aten.view.default(aten.arange.start_step(0, x.shape[dim], 1, dtype=index.dtype, device=x.device), shape)
    return aten.eq.Tensor(iota, index)


@_ours(aten.scatter.src)
def _scatter_src(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor):
    # torch-mlir's StableHLO lowering has scatter_add but not scatter.src (median's and
    # kthvalue's backward, value-selecting reductions). Written positions take the
    # scattered value, the rest keep x; with duplicate indices eager's winner is
    # unspecified, here they add up.
    if index.numel() == 0:
        return aten.clone.default(x)
    src = aten.slice.Tensor(src, 0, 0, index.shape[0]) if src.dim() else src
    for d in range(1, index.dim()):
        src = aten.slice.Tensor(src, d, 0, index.shape[d])
    mask = _one_per_row(x, dim, index)
    if mask is not None:  # src now has index's shape: one value per row, broadcast along dim
        return aten.where.self(mask, aten._to_copy.default(src, dtype=x.dtype), x)
    written = aten.scatter_add.default(aten.zeros_like.default(x, dtype=torch.int64), dim, index,
                                       aten.ones_like.default(index, dtype=torch.int64))
    placed = aten.scatter_add.default(aten.zeros_like.default(x), dim, index, aten._to_copy.default(src, dtype=x.dtype))
    return aten.where.self(aten.gt.Scalar(written, 0), placed, x)


@_ours(aten.scatter.value)
def _scatter_value(x: torch.Tensor, dim: int, index: torch.Tensor, value):
    if index.numel() == 0:
        return aten.clone.default(x)
    mask = _one_per_row(x, dim, index)
    if mask is None:
        written = aten.scatter_add.default(aten.zeros_like.default(x, dtype=torch.int64), dim, index,
                                           aten.ones_like.default(index, dtype=torch.int64))
        mask = aten.gt.Scalar(written, 0)
    return aten.masked_fill.Scalar(x, mask, value)


@_ours(aten.kthvalue)
def _kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False):
    # torch-mlir does not lower aten.kthvalue: the (k-1)-th of a stable sort.
    return _kth_smallest(x, k - 1, dim, keepdim)


@_ours(aten.cumprod)
def _cumprod(x: torch.Tensor, dim: int, dtype=None):
    # torch-mlir does not lower aten.cumprod (nor its backward's cumprod): a product over
    # a lower-triangular selection, out[i] = prod_{j<=i} x[j] (O(n^2) work along dim).
    if dtype is not None:
        x = aten._to_copy.default(x, dtype=dtype)
    elif not (x.dtype.is_floating_point or x.dtype.is_complex):
        x = aten._to_copy.default(x, dtype=torch.int64)
    if x.dim() == 0:
        return aten.clone.default(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    y = aten.movedim.int(x, dim, -1)  # [..., n]
    grid = aten.expand.default(aten.unsqueeze.default(y, -2), list(y.shape[:-1]) + [n, n])  # [..., i, j] = y[j]
    idx = _arange(n, x)
    lower = aten.le.Tensor(aten.unsqueeze.default(idx, 0), aten.unsqueeze.default(idx, 1))  # j <= i
    picked = aten.where.self(lower, grid, aten.ones_like.default(grid))
    return aten.movedim.int(aten.prod.dim_int(picked, -1), -1, dim)


@_ours(aten.addmv)
def _addmv(x: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta=1, alpha=1):
    # torch-mlir does not lower aten.addmv (nn.Linear on a 1-D input reaches it through
    # addmv in some paths; OpInfo addmv): beta * x + alpha * (mat @ vec), beta=0 ignores x.
    if not x.dtype.is_floating_point and not x.dtype.is_complex:
        beta, alpha = int(beta), int(alpha)  # ATen converts the scalars to the integer dtype first
    out = aten.mv.default(mat, vec)
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return aten.expand.default(out, list(torch.broadcast_shapes(x.shape, out.shape)))
    return aten.add.Tensor(aten.mul.Tensor(x, beta) if beta != 1 else x, out)


@_ours(aten.convolution_backward)
def _convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    # torch-mlir lowers the convolution backward only for 2-D, ungrouped, undilated, untransposed
    # convolutions: training Conv1d/Conv3d, depthwise or dilated convolutions and ConvTranspose
    # failed. Each gradient is a forward convolution instead, which it lowers in general:
    # the input's is the adjoint convolution (transposed <-> not), the weight's correlates the
    # input with the output gradient, batch folded into channels, group by group.
    spatial = x.dim() - 2
    grad_x = grad_w = grad_b = None
    if output_mask[0]:
        if transposed:
            grad_x = aten.convolution.default(grad, weight, None, stride, padding, dilation, False,
                                              [0] * spatial, groups)
            for i in range(spatial):  # an output padding of a stride or more (dilation allows it) adds rows
                grad_x = aten.slice.Tensor(grad_x, 2 + i, 0, x.shape[2 + i])
        else:  # the output padding that gives back the input's size
            extra = [x.shape[2 + i] - ((grad.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                       + dilation[i] * (weight.shape[2 + i] - 1) + 1) for i in range(spatial)]
            grad_x = aten.convolution.default(grad, weight, None, stride, padding, dilation, True, extra, groups)
    if output_mask[1]:
        # non-transposed: grad_w[g*Co + o, c, k] = sum_n,j x[n, g*Ci + c, j*s + k*d - p] * grad[n, g*Co + o, j];
        # transposed: the same with x and grad swapped. A convolution of `signal` by `kernel`, stride
        # and dilation exchanged, over [channels, groups*batch, ...] and [groups*channels, batch, ...].
        signal, kernel = (grad, x) if transposed else (x, grad)
        batch = x.shape[0]

        def by_group(t, as_signal):  # [N, G*C, ...] -> [C, G*N, ...] (signal) or [G*C, N, ...] (kernel)
            c = t.shape[1] // groups
            t = aten.view.default(t, [batch, groups, c, *t.shape[2:]])
            if as_signal:
                return aten.reshape.default(aten.permute.default(t, [2, 1, 0, *range(3, 3 + spatial)]),
                                            [c, groups * batch, *t.shape[3:]])
            return aten.reshape.default(aten.permute.default(t, [1, 2, 0, *range(3, 3 + spatial)]),
                                        [groups * c, batch, *t.shape[3:]])

        w = aten.convolution.default(by_group(signal, True), by_group(kernel, False), None, dilation, padding,
                                     stride, False, [0] * spatial, groups)
        for i in range(spatial):  # the correlation can run past the kernel's size
            w = aten.slice.Tensor(w, 2 + i, 0, weight.shape[2 + i])
        # [Ci, G*Co, ...] -> [G*Co, Ci, ...]; transposed: [Co, G*Ci, ...] -> [G*Ci, Co, ...], the weight's layout
        grad_w = aten.permute.default(w, [1, 0, *range(2, 2 + spatial)])
    if output_mask[2]:
        grad_b = aten.sum.dim_IntList(grad, [0, *range(2, 2 + spatial)])
    return grad_x, grad_w, grad_b


@_ours(aten._weight_norm_interface_backward)
def _weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    # Training through weight_norm (audio models' convolutions, wav2vec2's positional conv) reaches
    # this opaque backward; torch-mlir lowers the forward's decomposition but not it. ATen's
    # _weight_norm_differentiable_backward: w = g * v / ||v||, norms taken over every dim but `dim`.
    dim = dim % saved_v.dim()
    others = [d for d in range(saved_v.dim()) if d != dim]
    sums = aten.sum.dim_IntList(aten.mul.Tensor(grad_w, saved_v), others, True)
    grad_v = aten.mul.Tensor(aten.div.Tensor(saved_g, saved_norms), aten.sub.Tensor(
        grad_w, aten.mul.Tensor(saved_v, aten.div.Tensor(sums, aten.mul.Tensor(saved_norms, saved_norms)))))
    grad_g = aten.div.Tensor(sums, saved_norms)
    return aten._to_copy.default(grad_v, dtype=saved_v.dtype), aten._to_copy.default(grad_g, dtype=saved_g.dtype)


@_ours(aten._transformer_encoder_layer_fwd)
def _transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                               norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                               ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    # nn.TransformerEncoderLayer's fast path (eval mode, no grad) is this one fused ATen op, which
    # torch-mlir does not lower: the layer's own algebra (ATen's transformer_encoder_layer_forward)
    def norm(x, weight, bias):
        return aten.native_layer_norm.default(x, [embed_dim], weight, bias, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten.add.Tensor(_self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                                        mask_type), src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = aten.linear.default(h, ffn_weight_1, ffn_bias_1)
    h = aten.gelu.default(h) if use_gelu else aten.relu.default(h)
    x = aten.add.Tensor(aten.linear.default(h, ffn_weight_2, ffn_bias_2), residual)
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def _self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    # ATen's native multi-head attention on [B, L, D]. Masks as merge_masks builds them: type 0
    # [L, L], type 1 key padding [B, L], type 2 [B, H or 1, L, L]; bool masks hide True, float
    # masks add. A row with every key hidden is zero, as ATen's masked softmax makes it.
    batch, length, dim = x.shape
    head = dim // num_heads

    def heads(t):  # [B, L, D] -> [B, H, L, head]
        return aten.permute.default(aten.view.default(t, [batch, length, num_heads, head]), [0, 2, 1, 3])

    q, k, v = (heads(t) for t in aten.split.Tensor(aten.linear.default(x, qkv_weight, qkv_bias), dim, -1))
    scores = aten.matmul.default(aten.mul.Tensor(q, 1.0 / math.sqrt(head)), aten.transpose.int(k, -2, -1))
    if mask is not None:
        shape = {0: [1, 1, length, length], 1: [batch, 1, 1, length]}.get(mask_type)
        mask = aten.view.default(mask, shape) if shape is not None else mask
        if mask.dtype == torch.bool:
            scores = aten.masked_fill.Scalar(scores, mask, float("-inf"))
        else:
            scores = aten.add.Tensor(scores, mask)
    probs = aten._softmax.default(scores, -1, False)
    if mask is not None:
        probs = aten.where.self(aten.isnan.default(probs), aten.zeros_like.default(probs), probs)
    context = aten.permute.default(aten.matmul.default(probs, v), [0, 2, 1, 3])
    return aten.linear.default(aten.reshape.default(context, [batch, length, dim]), proj_weight, proj_bias)


# ---- torch._foreach_*: one op over a list of tensors ----------------------------------------------
# torch-mlir lowers none of them. They come from torch.nn.utils.clip_grad_norm_ (_foreach_norm,
# _foreach_mul_), optimizers built with foreach=True and user code. Each becomes its per-tensor op,
# list arguments taken element by element; XLA fuses the result as it would the loop.

def _addc(combine):
    def per_tensor(x, t1, t2, value=1):
        return aten.add.Tensor(x, aten.mul.Tensor(combine(t1, t2), value))
    return per_tensor


_FOREACH_PER_TENSOR = {
    # per-tensor ops whose call differs from the foreach one
    "addcmul": _addc(aten.mul.Tensor),  # foreach passes value positionally (and as a tensor element)
    "addcdiv": _addc(aten.div.Tensor),
    "norm": lambda x, ord=2, dtype=None: aten.linalg_vector_norm.default(x, ord, dtype=dtype),
    "powsum": lambda x, ord=2, dtype=None: aten.sum.default(aten.pow.Tensor_Scalar(aten.abs.default(x), ord),
                                                            dtype=dtype),
}


def _foreach(name: str, overload):
    """The decomposition of ``aten._foreach_<name>.<overload>``: the per-tensor op, element by element."""
    schema = overload._schema
    # arguments taken element by element: every list, and the per-element scalars of addcmul/addcdiv.Tensor
    listed = [str(a.type).startswith("List[") or (a.name == "scalars" and str(a.type) == "Tensor")
              for a in schema.arguments if not a.kwarg_only]
    per_tensor = _FOREACH_PER_TENSOR.get(name)
    if per_tensor is None:
        packet = getattr(aten, name)
        if name in ("maximum", "minimum") and overload._overloadname in ("Scalar", "ScalarList"):
            packet = aten.clamp_min if name == "maximum" else aten.clamp_max  # no Scalar overload
        per_tensor = packet

    def decomposition(*args, **kwargs):
        count = len(next(a for a, is_list in zip(args, listed) if is_list))
        return [per_tensor(*(a[i] if is_list else a for a, is_list in zip(args, listed)), **kwargs)
                for i in range(count)]
    return decomposition


def _foreach_decompositions() -> dict:
    table = {}
    for qualified in torch._C._dispatch_get_all_op_names():  # 4 ms; every schema parsed would be 12
        name, _, overload_name = qualified.removeprefix("aten::").partition(".")
        if not qualified.startswith("aten::_foreach_") or name.endswith("_") or overload_name.endswith("out"):
            continue  # in-place and out= forms are functionalized before they reach us
        overload = getattr(getattr(aten, name), overload_name or "default")
        table[overload] = _foreach(name[len("_foreach_"):], overload)
    return table


@_ours(aten._cdist_forward)
def _cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode=None):
    # torch-mlir does not lower aten._cdist_forward (torch.cdist): pairwise differences,
    # then the p-norm over the last dim (exact, no matmul trick).
    diff = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))  # [..., r1, r2, m]
    return aten.linalg_vector_norm.default(diff, p, [-1])


@functools.lru_cache(maxsize=1)
def _base_table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    from .linalg import LINALG
    from .misc import MISC, library_decompositions
    from .pool import POOL, with_zero_size
    from .special import SPECIAL

    table = dict(get_decomposition_table())
    table.update(_OURS)
    table.update(_foreach_decompositions())
    table.update(LINALG)
    table.update(SPECIAL)
    table.update(POOL)
    table.update(MISC)
    table.update(library_decompositions())
    for op, fn in _RANK0.items():
        if op not in table:  # ops some table already decomposes keep that decomposition
            table[op] = _rank0(fn)
    for op in _WIDENED:
        table[op] = _first_of(_widened(op), table.get(op))
    table[aten.cumsum.default] = _first_of(_cumsum_half, table.get(aten.cumsum.default))
    return with_zero_size(table)


def _cumsum_half(x, dim, *, dtype=None):
    # ATen accumulates bfloat16 and float16 running sums in float32 (acc_type); in bfloat16 the
    # sum drifts by several ulps over a row
    if x.dim() == 0 or x.dtype not in (torch.bfloat16, torch.float16) or dtype not in (None, x.dtype):
        return NotImplemented
    wide = aten.cumsum.default(aten._to_copy.default(x, dtype=torch.float32), dim)
    return aten._to_copy.default(wide, dtype=x.dtype)


# Reductions that pick an element: torch-mlir's lowering compares bool and uint8 wrongly (max.dim on
# bool returned wrong indices, its amax under cummax wrong values, argmax on bool does not lower), so
# those inputs go through int32 and then whatever decomposes the op (ours or a 0-d rule).
_WIDENED = (aten.max.dim, aten.min.dim, aten.argmax.default, aten.argmin.default, aten.cummax.default,
            aten.cummin.default)


def _widened(op):
    def decomposition(x, *args, **kwargs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.dtype not in (torch.bool, torch.uint8):
            return NotImplemented
        out = op(aten._to_copy.default(x, dtype=torch.int32), *args, **kwargs)
        if isinstance(out, (tuple, list)):  # (values, indices): values back to the input's dtype
            return (aten._to_copy.default(out[0], dtype=x.dtype), *out[1:])
        return out
    return decomposition


def _first_of(first, second):
    """A decomposition trying ``first``, then ``second`` (if any), NotImplemented when neither applies."""
    if second is None:
        return first

    def decomposition(*args, **kwargs):
        out = first(*args, **kwargs)
        return second(*args, **kwargs) if out is NotImplemented else out
    return decomposition


def decomposition_table() -> dict:
    """The table we hand to AOTAutograd: torch-mlir's, ours, and those of libraries loaded so far."""
    table = _base_table()
    for op, fn in _library_decompositions():
        table.setdefault(op, fn)
    return table


def _group_of_rows(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Expert of each row for cumulative group ends ``offs``: the number of ends <= row (E: past the last)."""
    row = aten.arange.start_step(0, rows, 1, dtype=offs.dtype, device=offs.device)
    return aten.sum.dim_IntList(aten._to_copy.default(aten.ge.Tensor(aten.unsqueeze.default(row, 1),
                                                                     aten.unsqueeze.default(offs, 0)),
                                                      dtype=torch.int64), [1])


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # transformers' MoE layers (mixtral, qwen3_moe, olmoe, granitemoe, gpt_oss...) call the
    # opaque custom op transformers::grouped_mm_fallback, a Python loop over experts.
    # Every expert on every row, then each row picks its own expert's result (rows past
    # the last offset stay zero, as in the loop).
    rows, experts = x.shape[0], weight.shape[0]
    group = _group_of_rows(offs, rows)
    every = aten.matmul.default(x, weight)  # [E, S, N]
    picked = aten.index.Tensor(every, [aten.clamp_max.default(group, experts - 1), _arange(rows, x)])
    return aten.mul.Tensor(picked, aten.unsqueeze.default(aten.lt.Scalar(group, experts), 1))


def _grouped_mm_backward(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor):
    # The backward custom op of the same loop: grad_input rows use their expert's weight,
    # grad_weight[e] sums x^T grad over expert e's rows (a one-hot mask per expert).
    rows, experts = x.shape[0], weight.shape[0]
    group = _group_of_rows(offs, rows)
    grad_input = _grouped_mm(grad, aten.transpose.int(weight, 1, 2), offs)
    mask = aten._to_copy.default(aten.eq.Tensor(aten.unsqueeze.default(_arange(experts, x), 1),
                                                aten.unsqueeze.default(group, 0)), dtype=x.dtype)  # [E, S]
    masked = aten.mul.Tensor(aten.unsqueeze.default(mask, 2), aten.unsqueeze.default(x, 0))  # [E, S, K]
    grad_weight = aten.matmul.default(aten.transpose.int(masked, 1, 2), grad)  # [E, K, N]
    return grad_input, grad_weight


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    # Dynamo itself rewrites addcmul_(t1, t2, value=v), addcdiv_ and add_(other, alpha=tensor)
    # into Inductor's prims.fma (every compiled Adam/AdamW step), which torch-mlir does not know.
    # StableHLO has no fused multiply-add: a * b + c, which XLA's CPU code may fuse again.
    return aten.add.Tensor(aten.mul.Tensor(a, b), c)


def _library_decompositions():
    """Decompositions of custom ops that libraries register (only once they are loaded)."""
    found = []
    fma = getattr(torch.ops.prims, "fma", None)  # registered by torch._inductor.inductor_prims
    if fma is not None:
        found.append((fma.default, _fma))
    transformers_ops = getattr(torch.ops, "transformers", None)
    for name, fn in (("grouped_mm_fallback", _grouped_mm), ("grouped_mm_fallback_backward", _grouped_mm_backward)):
        try:
            found.append((getattr(transformers_ops, name).default, fn))
        except (AttributeError, RuntimeError):
            pass
    return found


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # What ATen's SDPA does before it dispatches (convert_boolean_attn_mask): the
        # math kernel adds the mask, so True must become 0 and False -inf. Without it a
        # boolean mask was added as 1/0 (every transformers model with use_cache=False:
        # llama's logits were off by 0.4).
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )[0]


_SDPA_TARGETS = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}


def _embedding_bag_math(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                        mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                        padding_idx=None):
    """F.embedding_bag as differentiable ops: a gather, then each bag's sum, mean or max."""
    dim = weight.shape[1]
    if input.dim() == 2:  # one bag per row
        bags, per_bag = input.shape
        flat = input.reshape(-1)
        bag = torch.arange(bags, device=input.device).unsqueeze(1).expand(bags, per_bag).reshape(-1)
        keep = torch.ones_like(flat, dtype=torch.bool)
    else:  # bags start at offsets (the last one closes the last bag with include_last_offset)
        flat = input
        bags = offsets.shape[0] - (1 if include_last_offset else 0)
        position = torch.arange(flat.shape[0], device=input.device)
        bag = (position.unsqueeze(1) >= offsets[:bags].unsqueeze(0)).sum(1) - 1
        keep = bag >= 0
        if include_last_offset:
            keep = keep & (position < offsets[-1])
        bag = bag.clamp(min=0)
    if padding_idx is not None:
        keep = keep & (flat != (padding_idx % weight.shape[0]))
    rows = torch.index_select(weight, 0, flat)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if mode == "max":
        lowest = torch.full((), float("-inf"), dtype=weight.dtype, device=weight.device)
        picked = torch.where(keep.unsqueeze(1), rows, lowest)
        out = torch.full((bags, dim), float("-inf"), dtype=weight.dtype, device=weight.device).scatter_reduce(
            0, bag.unsqueeze(1).expand(-1, dim), picked, "amax")
        return torch.where(out == float("-inf"), torch.zeros((), dtype=weight.dtype, device=weight.device), out)
    kept = keep.to(weight.dtype)
    out = torch.zeros(bags, dim, dtype=weight.dtype, device=weight.device).index_add(0, bag, rows * kept.unsqueeze(1))
    if mode == "mean":  # over the bag's kept entries; an empty bag is zero
        count = torch.zeros(bags, dtype=weight.dtype, device=weight.device).index_add(0, bag, kept)
        out = out / count.clamp(min=1).unsqueeze(1)
    return out


def _plain_embedding_bag(node) -> bool:
    """A call whose every argument our math covers (no max_norm renorm, dense gradient as eager's)."""
    import inspect

    try:
        bound = inspect.signature(torch.nn.functional.embedding_bag).bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    args = bound.arguments
    return (args.get("max_norm") is None and not args.get("scale_grad_by_freq", False)
            and not args.get("sparse", False) and args.get("mode", "mean") in ("sum", "mean", "max"))


def decompose_before_autograd(gm: torch.fx.GraphModule) -> int:
    """Rewrite Dynamo's graph before AOTAutograd traces it; returns how many nodes changed.

    ``scaled_dot_product_attention`` dispatches on CPU to the fused
    ``_scaled_dot_product_flash_attention_for_cpu``, whose backward is an opaque
    op torch-mlir cannot lower (every transformers model hits it in training).
    Sending it to the math formulation instead (matmul, scale, mask, softmax,
    matmul: the same algebra) lets autograd differentiate plain ops, and
    leaves the attention pattern visible to our fusion pass. Subgraphs of
    higher-order ops are rewritten too: activation checkpointing (transformers'
    ``gradient_checkpointing_enable()``) puts each layer in one.

    ``embedding_bag`` (nn.EmbeddingBag) is an ATen op torch-mlir does not lower,
    whose backward needs its bag bookkeeping: it becomes a gather and a per-bag
    sum, mean or max of plain ops.
    """
    changed = 0
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        here = 0
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target in _SDPA_TARGETS:
                node.target = _sdpa_math
                here += 1
            elif (node.op == "call_function" and node.target is torch.nn.functional.embedding_bag
                  and _plain_embedding_bag(node)):
                node.target = _embedding_bag_math
                here += 1
        if here:
            module.recompile()
            changed += here
    return changed
