"""Reductions, scans and order statistics torch-mlir does not lower, or lowers wrong.

cummax/cummin (a triangular mask and the last extreme's index), var/std and
var_mean/std_mean on real floats (``_variance``), diagonal and
diagonal_scatter as gathers, histc, median/nanmedian/kthvalue (counting
comparisons instead of sorting), scatter with one index per row, cumprod and
addmv. They register into the core ``_ours`` registry (var/std by assignment,
wrapped by ``_real_float``).
"""

from __future__ import annotations

import torch

from .core import _OURS, _arange, _ours

aten = torch.ops.aten


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
    # scattered value, the rest keep x. Where indices repeat, eager writes one of the values
    # (which is unspecified; CPU: the last); here the last along dim, the others masked to 0
    # before the sum (a pairwise compare along dim, O(k^2) per row): a sum of the repeats
    # would be a value eager never writes.
    if index.numel() == 0:
        return aten.clone.default(x)
    src = aten.slice.Tensor(src, 0, 0, index.shape[0]) if src.dim() else src
    for d in range(1, index.dim()):
        src = aten.slice.Tensor(src, d, 0, index.shape[d])
    mask = _one_per_row(x, dim, index)
    if mask is not None:  # src now has index's shape: one value per row, broadcast along dim
        return aten.where.self(mask, aten._to_copy.default(src, dtype=x.dtype), x)
    # the last writer: no later entry along dim (in its row) with the same index; the others add 0
    dim = dim % x.dim()
    k = index.shape[dim]
    later = aten.unsqueeze.default(aten.arange.start_step(0, k, 1, device=x.device), -1)  # [k, 1]: j' > j
    later = aten.lt.Tensor(later, aten.arange.start_step(0, k, 1, device=x.device))  # [j, j']
    later = aten.view.default(later, [k if d == dim else 1 for d in range(index.dim())] + [k])
    same = aten.eq.Tensor(aten.unsqueeze.default(index, -1), aten.unsqueeze.default(aten.movedim.int(index, dim, -1), dim))
    overwritten = aten.any.dim(aten.logical_and.default(same, later), -1)  # index.shape
    src = aten._to_copy.default(src, dtype=x.dtype)
    src = aten.where.self(overwritten, aten.zeros_like.default(src), src)
    written = aten.scatter_add.default(aten.zeros_like.default(x, dtype=torch.int64), dim, index,
                                       aten.ones_like.default(index, dtype=torch.int64))
    placed = aten.scatter_add.default(aten.zeros_like.default(x), dim, index, src)
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
