"""Search and order statistics torch-mlir has no StableHLO lowering for: ``searchsorted``, ``mode``,
``segment_reduce``, the stable ``sort`` and ``nonzero_static``.

Each is written with ops it lowers, exactly: comparisons counted instead of a binary search, ranks
as running counts.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

SEARCH: dict = {}


def _register(op):
    return register_decomposition(op, registry=SEARCH)


# --------------------------------------------------------------------------- searchsorted


@_register(aten.searchsorted.Tensor)
def _searchsorted(sorted_sequence, values, *, out_int32: bool = False, right: bool = False, side=None,
                  sorter=None):
    # ATen's binary search finds the first position whose element is >= v (left) or > v
    # (right); on a sorted row that is the count of elements for which that fails, which
    # is also what the search returns for v = NaN (the row's length).
    dtype = torch.int32 if out_int32 else torch.int64
    right = right or side == "right"
    if values.numel() == 0 or sorted_sequence.shape[-1] == 0:
        return torch.zeros(list(values.shape), dtype=dtype, device=values.device)
    seq = sorted_sequence
    if sorter is not None:
        seq = torch.gather(seq, -1, sorter)
    if seq.dim() == 1:
        v, s = values.unsqueeze(-1), seq
    else:
        v, s = values.unsqueeze(-1), seq.unsqueeze(-2)
    found = (s > v) if right else (s >= v)
    return torch.logical_not(found).sum(-1).to(dtype)


@_register(aten.searchsorted.Scalar)
def _searchsorted_scalar(sorted_sequence, value, *, out_int32: bool = False, right: bool = False, side=None,
                         sorter=None):
    values = torch.full([1] * max(sorted_sequence.dim() - 1, 0) + [1], value, dtype=sorted_sequence.dtype,
                        device=sorted_sequence.device)
    out = _searchsorted(sorted_sequence, values, out_int32=out_int32, right=right, side=side, sorter=sorter)
    return out.reshape([]) if sorted_sequence.dim() == 1 else out.squeeze(-1)


# --------------------------------------------------------------------------- mode


@_register(aten.mode)
def _mode(x, dim: int = -1, keepdim: bool = False):
    # ATen (CPU) sorts each row and takes the longest run: the most frequent value, the
    # smallest among equally frequent ones, with the index of its last occurrence. Counted
    # here with an n x n comparison per row. Rows with NaN have no defined answer in eager
    # (its sort's comparator is not an order with NaN: [nan, 1, nan, 1, nan] gives NaN at
    # index 0, [1, nan, 2, nan, nan] gives 1); here NaN is never the mode but of an all-NaN
    # row (index 0, as eager); the rows above give 1 at index 3 and 1 at index 0.
    if x.dim() == 0:
        return x.clone(), torch.zeros([], dtype=torch.int64, device=x.device)
    if not x.dtype.is_floating_point and x.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8,
                                                         torch.uint8):
        return NotImplemented
    d = dim % x.dim()
    y = x.movedim(d, -1)
    n = y.shape[-1]
    if n == 0 or y.numel() == 0:
        return NotImplemented
    same = y.unsqueeze(-1) == y.unsqueeze(-2)  # [..., n, n]
    nan = torch.isnan(y) if y.dtype.is_floating_point else torch.zeros_like(y, dtype=torch.bool)
    count = same.sum(-1)  # [..., n]; NaN equals nothing
    best = count.amax(-1, keepdim=True)
    top = (count == best) & ~nan
    if y.dtype.is_floating_point:
        big = torch.full_like(y, math.inf)
    else:
        big = torch.full_like(y, torch.iinfo(y.dtype).max)
    value = torch.where(top, y, big).amin(-1, keepdim=True)
    all_nan = nan.all(-1, keepdim=True)
    position = torch.arange(n, dtype=torch.int64, device=x.device)
    last = torch.where((y == value) & top, position, -1).amax(-1, keepdim=True)
    last = torch.where(all_nan, 0, last)
    value = torch.where(all_nan, torch.full_like(value, math.nan) if y.dtype.is_floating_point else value, value)
    value, last = value.squeeze(-1), last.squeeze(-1)
    if keepdim:
        value, last = value.unsqueeze(d), last.unsqueeze(d)
    return value, last


# --------------------------------------------------------------------------- segment_reduce

_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf, "mean": 0.0}


@_register(aten.segment_reduce)
def _segment_reduce(data, reduce: str, *, lengths=None, indices=None, offsets=None, axis: int = 0,
                    unsafe: bool = False, initial=None):
    # Segments [start, end) of data's axis from lengths (or offsets); a membership mask
    # [..., S, N] selects each segment's elements, the rest get the reduction's identity.
    # ATen counts ``initial`` as one more element (mean: (initial + sum) / length), an
    # empty segment is initial, or the identity (mean: NaN).
    if indices is not None or reduce not in _IDENTITY or not data.dtype.is_floating_point:
        return NotImplemented
    axis = axis % data.dim()
    if offsets is not None:
        starts, ends = offsets[..., :-1], offsets[..., 1:]
    elif lengths is not None:
        ends = torch.cumsum(lengths, -1)
        starts = ends - lengths
    else:
        return NotImplemented
    n = data.shape[axis]
    post = data.dim() - axis - 1
    pos = torch.arange(n, dtype=starts.dtype, device=data.device)
    mask = (pos >= starts.unsqueeze(-1)) & (pos < ends.unsqueeze(-1))  # [pre..., S, N]
    mask = mask.reshape(list(mask.shape) + [1] * post)
    values = torch.where(mask, data.unsqueeze(axis), torch.full((), _IDENTITY[reduce], dtype=data.dtype,
                                                                    device=data.device))
    dim = axis + 1
    if reduce in ("sum", "mean"):
        out = values.sum(dim)
    elif reduce == "prod":
        out = values.prod(dim)
    elif reduce == "max":
        out = values.amax(dim)
    else:
        out = values.amin(dim)
    if initial is not None:
        if reduce in ("sum", "mean"):
            out = out + initial
        elif reduce == "prod":
            out = out * initial
        elif reduce == "max":
            out = torch.clamp(out, min=initial)
        else:
            out = torch.clamp(out, max=initial)
    if reduce == "mean":
        count = mask.sum(dim).to(data.dtype)
        empty = torch.full((), math.nan if initial is None else initial, dtype=data.dtype, device=data.device)
        out = torch.where(count == 0, empty, out / count)
    return out


# --------------------------------------------------------------------------- stable sort

STABLE_SORT_MAX = 1024


@_register(aten.sort.stable)
def _sort_stable(x, *, stable=None, dim: int = -1, descending: bool = False):
    # torch-mlir's sort is not stable (tied elements come back in another order) and sort.stable
    # does not lower. Each element's place is counted: the elements before it in the order, plus
    # its equals at lower indices (NaN last ascending, first descending, as eager). n x n
    # comparisons: rows longer than STABLE_SORT_MAX are left to fail lowering.
    if x.dim() == 0:
        return x.clone(), torch.zeros([], dtype=torch.int64, device=x.device)
    d = dim % x.dim()
    y = x.movedim(d, -1)
    n = y.shape[-1]
    if n > STABLE_SORT_MAX or y.dtype == torch.bool or y.dtype.is_complex:
        return NotImplemented
    if y.numel() == 0:
        return x.clone(), torch.zeros(list(x.shape), dtype=torch.int64, device=x.device)
    a, b = y.unsqueeze(-1), y.unsqueeze(-2)  # a: element i, b: element j
    if y.dtype.is_floating_point:
        na, nb = torch.isnan(a), torch.isnan(b)
        before = ((b > a) | (nb & ~na)) if descending else ((b < a) | (na & ~nb))
        equal = (a == b) | (na & nb)
    else:
        before = (b > a) if descending else (b < a)
        equal = a == b
    position = torch.arange(n, dtype=torch.int64, device=x.device)
    earlier = position.unsqueeze(0) < position.unsqueeze(1)  # [i, j]: j < i
    rank = (before | (equal & earlier)).sum(-1)  # [..., n]
    order = torch.zeros_like(rank).scatter(-1, rank, position.expand(rank.shape))
    values = torch.gather(y, -1, order)
    return values.movedim(-1, d), order.movedim(-1, d)


@_register(aten.nonzero_static)
def _nonzero_static(x, *, size: int, fill_value: int = -1):
    # The r-th row holds the coordinates of the r-th nonzero element in row-major order:
    # each nonzero's rank is a running count, a [size, numel] comparison finds the element
    # of each rank, and its flat index splits into coordinates; rows past the count are
    # fill_value.
    flat = (x != 0).reshape(-1)
    index = torch.arange(flat.numel(), device=x.device)
    rank = torch.cumsum(flat.to(torch.int64), 0) - 1
    rows = torch.arange(size, device=x.device).unsqueeze(1)
    chosen = flat.unsqueeze(0) & (rank.unsqueeze(0) == rows)  # [size, numel]
    found = chosen.any(1, keepdim=True)
    flat_index = (chosen.to(torch.int64) * index.unsqueeze(0)).sum(1, keepdim=True)
    coords, stride = [], 1
    for extent in reversed(x.shape):
        coords.append(torch.remainder(torch.div(flat_index, stride, rounding_mode="floor"), extent))
        stride *= extent
    coords = torch.cat(coords[::-1], 1) if coords else torch.zeros((size, 0), dtype=torch.int64, device=x.device)
    return torch.where(found, coords, fill_value)
