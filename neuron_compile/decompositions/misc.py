"""Search, pairwise, strided and bit-level ops torch-mlir has no StableHLO lowering for.

Each is written with ops it lowers, exactly (no approximation): comparisons
counted instead of a binary search, pairs of rows taken by static slices,
strided views as gathers of statically computed positions, float neighbours
as integer steps on the bit pattern.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

MISC: dict = {}


def _misc(op):
    return register_decomposition(op, registry=MISC)


# --------------------------------------------------------------------------- searchsorted


@_misc(aten.searchsorted.Tensor)
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


@_misc(aten.searchsorted.Scalar)
def _searchsorted_scalar(sorted_sequence, value, *, out_int32: bool = False, right: bool = False, side=None,
                         sorter=None):
    values = torch.full([1] * max(sorted_sequence.dim() - 1, 0) + [1], value, dtype=sorted_sequence.dtype,
                        device=sorted_sequence.device)
    out = _searchsorted(sorted_sequence, values, out_int32=out_int32, right=right, side=side, sorter=sorter)
    return out.reshape([]) if sorted_sequence.dim() == 1 else out.squeeze(-1)


# --------------------------------------------------------------------------- pdist

PDIST_MAX_ROWS = 512


@_misc(aten._pdist_forward)
def _pdist_forward(x, p: float = 2.0):
    # Rows i < j in ATen's order (i major): one static slice per i, then the p-norm of the
    # differences (linalg_vector_norm handles p = 0 and inf). Unrolled over rows: above
    # PDIST_MAX_ROWS it is left to fail lowering rather than emit a huge graph.
    n = x.shape[0]
    if n > PDIST_MAX_ROWS:
        return NotImplemented
    if n < 2 or x.shape[1] == 0:
        return torch.zeros([n * (n - 1) // 2], dtype=x.dtype, device=x.device)
    diffs = torch.cat([x[i + 1:] - x[i:i + 1] for i in range(n - 1)], 0)
    return torch.linalg.vector_norm(diffs, p, [-1])


# --------------------------------------------------------------------------- nextafter

_BITS = {torch.float32: (torch.int32, 2 ** 31 - 1), torch.float64: (torch.int64, 2 ** 63 - 1)}


@_misc(aten.nextafter)
def _nextafter(x, other):
    # The float after x towards other: one step of x's bit pattern (up if the step moves
    # away from zero, down if towards it); other itself when x == other, NaN with a NaN, the
    # smallest subnormal (signed as other) from zero: C's nextafter. Compared as integers
    # (sign-magnitude bits mapped to an ordered key): XLA's CPU float compares treat
    # subnormals as zero.
    if x.dtype not in _BITS or other.dtype != x.dtype:
        return NotImplemented
    itype, magnitude = _BITS[x.dtype]
    x, other = torch.broadcast_tensors(x, other)
    bits, obits = x.view(itype), other.view(itype)
    key = torch.where(bits < 0, -(bits & magnitude), bits)
    okey = torch.where(obits < 0, -(obits & magnitude), obits)
    up = okey > key  # towards +inf
    away = up == (key > 0)
    stepped = torch.where(away, bits + 1, bits - 1)
    from_zero = torch.where(up, torch.ones_like(bits), torch.full_like(bits, -magnitude))  # -magnitude: sign bit | 1
    out = torch.where(key == 0, from_zero, stepped)
    out = torch.where(key == okey, obits, out).view(x.dtype)
    return torch.where(torch.isnan(x) | torch.isnan(other), torch.full_like(x, math.nan), out)


# --------------------------------------------------------------------------- strided views


def _strided_positions(size, stride, offset, like):
    """Flat storage position of every element of as_strided(size, stride, offset): an int64 tensor of shape size."""
    pos = torch.full(list(size), offset, dtype=torch.int64, device=like.device)
    for j, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[j] = n
        pos = pos + (torch.arange(n, dtype=torch.int64, device=like.device) * s).reshape(shape)
    return pos


def _static_positions(size, stride, offset):
    positions = [offset]
    for n, s in zip(size, stride):
        positions = [p + k * s for p in positions for k in range(n)]
    return positions


def _plain_storage(x) -> bool:
    # as_strided reads x's storage; in the graph that is x flattened only when x is contiguous
    # and starts the storage
    return x.is_contiguous() and x.storage_offset() == 0


def _as_slices(flat, size, stride, offset):
    """``as_strided(flat, size, stride, offset)`` of a 1-d ``flat`` as slices, a reshape and a permute (a
    transpose, a narrow, a step slice, an expand, a diagonal: every view whose dims, taken by stride, nest
    without overlap), or None where the strides do not nest (a gather is left): the view's part of its
    ``_block``, its dims put back in the view's order. XLA runs slices where it would run a gather, and the
    trace is a handful of ops."""
    if type(offset) is not int:
        return None
    dims = _nesting(size, stride, skip_expands=True)
    if dims is None:
        return None
    if not dims:
        piece = flat[offset]
    else:
        block, extents, _ = _block(flat, size, stride, offset, dims)
        cut = [slice(0, n) if n < whole else slice(None) for n, whole in zip(extents, block.shape)]
        if len(extents) > len(dims):  # a step: its dim is read at 0
            cut[-1] = 0
        piece = block[tuple(cut)] if any(c != slice(None) for c in cut) else block
        piece = piece.permute([dims.index(d) for d in sorted(dims)])  # back to the view's dim order
    for d in range(len(size)):  # size-1 and stride-0 dims: unsqueezed, then expanded
        if d not in dims:
            piece = piece.unsqueeze(d)
    return piece.expand(list(size))


def _nesting(size, stride, skip_expands: bool):
    """The view's dims of size above 1 (and nonzero stride, ``skip_expands``), by stride from largest to
    smallest, when their strides nest (each a multiple of the next and at least its dim's extent); None
    otherwise."""
    if not all(type(v) is int for v in (*size, *stride)):
        return None
    dims = sorted((d for d in range(len(size)) if size[d] != 1 and (stride[d] != 0 or not skip_expands)),
                  key=lambda d: -stride[d])
    sizes, strides = [size[d] for d in dims], [stride[d] for d in dims]
    if any(s <= 0 for s in strides) or any(
            strides[j] % strides[j + 1] or strides[j] < sizes[j + 1] * strides[j + 1] for j in range(len(dims) - 1)):
        return None
    return dims


def _block(flat, size, stride, offset: int, dims):
    """The part of ``flat`` a view whose strides nest (``_nesting``'s ``dims``, s1 > ... > sk) lies in:
    ``flat[offset : offset + n1 * s1]`` as ``(n1, s1/s2, ..., s[k-1]/sk)``, with a last dim ``sk`` where sk > 1
    (a step), padded where its last row runs past the storage (those elements are no part of the view).
    Returns the block, the view's extent along each block dim (``n1, ..., nk``, then 1 in a step's dim: the
    view is the block's ``[:n1, ..., :nk, 0]``), and how many of the block's elements the storage holds."""
    sizes, strides = [size[d] for d in dims], [stride[d] for d in dims]
    shape = [sizes[0]] + [strides[j] // strides[j + 1] for j in range(len(dims) - 1)]
    if strides[-1] != 1:
        shape, sizes = shape + [strides[-1]], sizes + [1]
    length = sizes[0] * strides[0]
    take = min(length, flat.shape[0] - offset)
    region = flat[offset:offset + take]
    if take < length:
        region = torch.nn.functional.pad(region, (0, length - take))
    return region.view(shape), sizes, take


def _scatter_slices(flat, src, size, stride, offset):
    """``as_strided_scatter(flat, src, size, stride, offset)`` of a 1-d ``flat`` for a view ``_as_slices`` reads
    without an expand: ``src`` in the view's ``_block`` order, padded to the block and selected in by a
    constant mask, the block put back between the storage's untouched ends. None where the strides do not
    nest (or repeat a position: a stride-0 dim), for the positional scatter. A copy into a fresh or a sliced
    tensor (``contiguous()`` of a transpose) is a pad and a select, where the scatter took ~10x longer."""
    if type(offset) is not int:
        return None
    dims = _nesting(size, stride, skip_expands=False)
    if dims is None:
        return None
    src = src.to(flat.dtype)
    if not dims:
        return _between(flat, offset, src.reshape(1))
    block, extents, take = _block(flat, size, stride, offset, dims)
    kept = [d for d in range(len(size)) if size[d] != 1]
    moved = src.reshape([size[d] for d in kept]).permute([kept.index(d) for d in dims]).reshape(extents)
    pads = []
    for have, want in zip(reversed(extents), reversed(block.shape)):
        pads += [0, want - have]
    mask = torch.nn.functional.pad(torch.ones(extents, dtype=torch.bool, device=flat.device), pads)
    written = torch.where(mask, torch.nn.functional.pad(moved, pads), block).reshape(-1)[:take]
    return _between(flat, offset, written)


def _between(flat, offset: int, piece):
    """``flat`` with ``piece`` in place of its elements from ``offset`` (no empty part: Torch-MLIR lowers a
    zero-size complex slice to a ``zeros`` it cannot legalize)."""
    end = offset + piece.shape[0]
    parts = ([flat[:offset]] if offset else []) + [piece] + ([flat[end:]] if end < flat.shape[0] else [])
    return torch.cat(parts) if len(parts) > 1 else piece


@_misc(aten.as_strided_copy)
def _as_strided_copy(x, size, stride, storage_offset=None):
    offset = storage_offset or 0
    if not _plain_storage(x):
        return NotImplemented
    if math.prod(size) == 0:
        return torch.zeros(list(size), dtype=x.dtype, device=x.device)
    flat = x.reshape(-1)
    sliced = _as_slices(flat, size, stride, offset)
    if sliced is not None:
        return sliced.clone()
    return flat[_strided_positions(size, stride, offset, x).reshape(-1)].reshape(list(size))


@_misc(aten.as_strided_scatter)
def _as_strided_scatter(x, src, size, stride, storage_offset=None):
    # Positions written twice (overlapping strides) have no defined winner: left to fail lowering.
    # the overlap check needs the numbers: symbolic ones are specialized (guarded, so a new
    # size, stride or offset recompiles; as_strided_scatter is never on a hot path)
    size, stride, offset = [int(n) for n in size], [int(n) for n in stride], int(storage_offset or 0)
    if not _plain_storage(x):
        return NotImplemented
    if math.prod(size) and (sliced := _scatter_slices(x.reshape(-1), src, size, stride, offset)) is not None:
        return sliced.reshape(list(x.shape))
    positions = _static_positions(size, stride, offset)
    if len(set(positions)) != len(positions):
        return NotImplemented
    flat = x.reshape(-1).clone()
    if not positions:
        return flat.reshape(list(x.shape))
    index = _strided_positions(size, stride, offset, x).reshape(-1)
    return torch.index_put(flat, [index], src.reshape(-1).to(x.dtype)).reshape(list(x.shape))


@_misc(aten.put)
def _put(x, index, source, accumulate: bool = False):
    # x.put(index, source): writes into x flattened (negative positions from the end). Without
    # accumulate, repeated positions have no defined winner in eager either; index_put is the op.
    flat = x.reshape(-1)
    index = index.reshape(-1)
    index = torch.where(index < 0, index + flat.shape[0], index)
    return torch.index_put(flat, [index], source.reshape(-1).to(x.dtype), accumulate).reshape(list(x.shape))


# --------------------------------------------------------------------------- mode


@_misc(aten.mode)
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


@_misc(aten.segment_reduce)
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


# --------------------------------------------------------------------------- random distributions

# torch-mlir lowers none of these samplers; each is its distribution's transform of
# uniform or standard normal draws (rand_like / randn_like, which lower), as ATen's CPU
# kernels do (cauchy: inverse CDF; log_normal: exp of a normal; geometric: the inverse CDF
# of a uniform on (0, 1]). An explicit generator is left to fail lowering.


def _open_uniform(x, dtype=None):
    """Uniform on (0, 1]: 1 - U[0, 1)."""
    return 1.0 - torch.rand_like(x, dtype=dtype or x.dtype)


@_misc(aten.cauchy)
def _cauchy(x, median: float = 0.0, sigma: float = 1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return median + sigma * torch.tan(math.pi * (torch.rand_like(x) - 0.5))


@_misc(aten.log_normal)
def _log_normal(x, mean: float = 1.0, std: float = 2.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return torch.exp(mean + std * torch.randn_like(x))


@_misc(aten.geometric)
def _geometric(x, p: float, *, generator=None):
    # trials until the first success: ceil(log(u) / log(1 - p)), at least 1
    if generator is not None:
        return NotImplemented
    u = _open_uniform(x, torch.float32)
    k = torch.ceil(torch.log(u) / math.log1p(-p)) if p < 1 else torch.ones_like(u)
    return torch.clamp(k, min=1).to(x.dtype)


@_misc(aten.normal.Tensor_Tensor)
def _normal_tt(mean, std, *, generator=None):
    if generator is not None:
        return NotImplemented
    shape = torch.broadcast_shapes(mean.shape, std.shape)
    z = torch.randn(list(shape), dtype=mean.dtype, device=mean.device)
    return mean + std * z


@_misc(aten.normal.Tensor_float)
def _normal_tf(mean, std: float = 1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn_like(mean)


@_misc(aten.normal.float_Tensor)
def _normal_ft(mean: float, std, *, generator=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn_like(std)


@_misc(aten.normal.float_float)
def _normal_ff(mean: float, std: float, size, *, generator=None, dtype=None, layout=None, device=None,
               pin_memory=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn(list(size), dtype=dtype or torch.get_default_dtype(), device=device)


def _randint_like(x, low, high, dtype):
    # floor(low + (high - low) U) from a float32 U (rand_like in float64 does not lower): every
    # integer reachable only while high - low <= 2^24; wider ranges are left to fail lowering
    if high - low > 2 ** 24:
        return NotImplemented
    u = torch.rand(list(x.shape), dtype=torch.float32, device=x.device)  # rand_like of an integer x does not lower
    return torch.clamp(torch.floor(low + (high - low) * u), max=high - 1).to(dtype or x.dtype)


@_misc(aten.randint_like.default)
def _randint_like_high(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint_like(x, 0, high, dtype)


@_misc(aten.randint_like.low_dtype)
def _randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint_like(x, low, high, dtype)


# --------------------------------------------------------------------------- stable sort

STABLE_SORT_MAX = 1024


@_misc(aten.sort.stable)
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


# --------------------------------------------------------------------------- linear_cross_entropy


def _lce_chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                 batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_input_grad,
                 compute_linear_weight_grad, compute_linear_bias_grad):
    # F.linear_cross_entropy with options calls torch.nn's custom op, which computes the loss
    # in batch chunks and, when asked, the gradients too (in the forward). Without gradients
    # it is the linear then cross_entropy, with the op's empty gradient placeholders; with
    # them it is left to fail lowering.
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        return NotImplemented
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    loss = torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    empty = torch.zeros([0], dtype=input.dtype, device=input.device)
    return loss, empty.reshape(0, 0), empty.reshape(0, 0), empty


def _lce_chunked_no_reduction(input, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size,
                              acc_policy, acc_dtype):
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    return torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction="none")


def library_decompositions() -> dict:
    """Decompositions of torch.nn's custom ops (registered when their module is imported)."""
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401  (registers torch_nn::*)
        ops = torch.ops.torch_nn
        return {ops._linear_cross_entropy_batch_chunked.default: _lce_chunked,
                ops._linear_cross_entropy_batch_chunked_no_reduction.default: _lce_chunked_no_reduction}
    except (ImportError, AttributeError, RuntimeError):
        return {}


# --------------------------------------------------------------------------- histogram


def _histogram_counts(x, edges, weight, density):
    # ATen's histogramdd kernel: an element's bin is the last edge <= it (the right edge
    # itself in the last bin), elements outside [first, last] edge are not counted
    bins = edges.shape[0] - 1
    flat = x.reshape(-1)
    pos, inside = _bin_of(flat, edges)
    hit = (pos.unsqueeze(1) == torch.arange(bins, device=x.device).unsqueeze(0)) & inside.unsqueeze(1)  # [M, bins]
    w = torch.ones_like(flat) if weight is None else weight.reshape(-1).to(x.dtype)
    hist = torch.where(hit, w.unsqueeze(1), torch.zeros((), dtype=x.dtype, device=x.device)).sum(0)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return hist, edges


@_misc(aten.histogram.bin_ct)
def _histogram_bin_ct(x, bins: int = 100, *, range=None, weight=None, density: bool = False):
    # edges as ATen: range, else the data's min and max (0 and 1 when empty, +-0.5 when equal),
    # split by linspace's two-sided formula
    if not x.dtype.is_floating_point:
        return NotImplemented
    if range is not None:
        left = torch.full((), range[0], dtype=x.dtype, device=x.device)
        right = torch.full((), range[1], dtype=x.dtype, device=x.device)
    elif x.numel() == 0:
        left = torch.zeros((), dtype=x.dtype, device=x.device)
        right = torch.ones((), dtype=x.dtype, device=x.device)
    else:
        left, right = x.min(), x.max()
    edges = _linspace_edges(left, right, bins, x)
    if x.numel() == 0:
        hist = torch.zeros([bins], dtype=x.dtype, device=x.device)
        return (hist / hist.sum() if density else hist), edges
    return _histogram_counts(x, edges, weight, density)


@_misc(aten.histogram.bins_tensor)
def _histogram_bins_tensor(x, bins, *, weight=None, density: bool = False):
    if not x.dtype.is_floating_point:
        return NotImplemented
    edges = bins.to(x.dtype).clone()
    if x.numel() == 0:
        hist = torch.zeros([edges.shape[0] - 1], dtype=x.dtype, device=x.device)
        return (hist / hist.sum() if density else hist), edges
    return _histogram_counts(x, edges, weight, density)


builtins_range = range  # histogram's own argument is called range


def _bin_of(values, edges):
    """(bin, inside) of each value as ATen's histogramdd kernel finds them (see _histogram_counts)."""
    bins = edges.shape[0] - 1
    pos = (edges.unsqueeze(0) <= values.unsqueeze(1)).sum(1) - 1
    pos = torch.where(values == edges[-1], bins - 1, pos)
    return pos, (values >= edges[0]) & (values <= edges[-1])


def _linspace_edges(left, right, bins: int, like):
    same = left == right
    left, right = torch.where(same, left - 0.5, left), torch.where(same, right + 0.5, right)
    idx = torch.arange(bins + 1, dtype=like.dtype, device=like.device)
    step = (right - left) / bins
    return torch.where(idx < (bins + 1) // 2, left + step * idx, right - step * (bins - idx))


def _dd_edges(x, bins, range):
    d = x.shape[-1]
    pts = x.reshape(-1, d)
    edges = []
    for k in builtins_range(d):
        if range is not None:
            left = torch.full((), range[2 * k], dtype=x.dtype, device=x.device)
            right = torch.full((), range[2 * k + 1], dtype=x.dtype, device=x.device)
        elif pts.shape[0] == 0:
            left = torch.zeros((), dtype=x.dtype, device=x.device)
            right = torch.ones((), dtype=x.dtype, device=x.device)
        else:
            left, right = pts[:, k].min(), pts[:, k].max()
        edges.append(_linspace_edges(left, right, bins[k], x))
    return edges


def _dd_counts(x, edges, weight, density):
    d = x.shape[-1]
    pts = x.reshape(-1, d)
    sizes = [e.shape[0] - 1 for e in edges]
    flat = torch.zeros([pts.shape[0]], dtype=torch.int64, device=x.device)
    inside = torch.ones([pts.shape[0]], dtype=torch.bool, device=x.device)
    for k in builtins_range(d):
        pos, ok = _bin_of(pts[:, k], edges[k])
        flat = flat * sizes[k] + pos
        inside = inside & ok
    total = math.prod(sizes)
    hit = (flat.unsqueeze(1) == torch.arange(total, device=x.device).unsqueeze(0)) & inside.unsqueeze(1)
    w = torch.ones([pts.shape[0]], dtype=x.dtype, device=x.device) if weight is None else weight.reshape(-1).to(x.dtype)
    hist = torch.where(hit, w.unsqueeze(1), torch.zeros((), dtype=x.dtype, device=x.device)).sum(0).reshape(sizes)
    if density:
        volume = None
        for k in builtins_range(d):
            width = (edges[k][1:] - edges[k][:-1]).reshape([-1 if j == k else 1 for j in builtins_range(d)])
            volume = width if volume is None else volume * width
        hist = hist / (hist.sum() * volume)
    return hist


def _dd_supported(x, bins_total: int) -> bool:
    return x.dtype.is_floating_point and x.numel() > 0 and bins_total <= 1 << 16


@_misc(aten._histogramdd_bin_edges)
def _histogramdd_bin_edges(x, bins, *, range=None, weight=None, density: bool = False):
    if not x.dtype.is_floating_point:
        return NotImplemented
    return _dd_edges(x, bins, range)


@_misc(aten._histogramdd_from_bin_cts)
def _histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density: bool = False):
    # histogramdd: one flat bin index per point (row-major over the dims), counted by a one-hot
    # sum; more than 2^16 bins in all is left to fail lowering
    if not _dd_supported(x, math.prod(bins)):
        return NotImplemented
    return _dd_counts(x, _dd_edges(x, bins, range), weight, density)


@_misc(aten._histogramdd_from_bin_tensors)
def _histogramdd_from_bin_tensors(x, bins, *, weight=None, density: bool = False):
    if not _dd_supported(x, math.prod(b.shape[0] - 1 for b in bins)):
        return NotImplemented
    return _dd_counts(x, [b.to(x.dtype) for b in bins], weight, density)


@_misc(aten.multinomial)
def _multinomial(weights, num_samples: int, replacement: bool = False, *, generator=None):
    # Gumbel-max: argmax(log w + G) is a draw of category i with probability w_i / sum(w);
    # the top num_samples keys of one set of draws are a draw without replacement, and
    # a fresh set per sample is a draw with replacement. Zero weights get -inf keys.
    if generator is not None:
        return NotImplemented
    logits = torch.log(weights.to(torch.float32))
    if replacement:
        shape = list(weights.shape[:-1]) + [num_samples, weights.shape[-1]]
        keys = logits.unsqueeze(-2) - torch.log(-torch.log(_open_uniform(torch.empty(shape, device=weights.device),
                                                                          torch.float32)))
        return torch.argmax(keys, dim=-1)
    keys = logits - torch.log(-torch.log(_open_uniform(logits, torch.float32)))
    return torch.topk(keys, num_samples, dim=-1).indices


@_misc(aten.nonzero_static)
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


@_misc(aten.view_copy.dtype)
def _view_copy_dtype(x, dtype):
    # torch-mlir has no view_copy.dtype: the view (a bitcast, ``lowering.jax_rules``), then a copy. The
    # device reinterprets a storage's bytes with it (device.transfers.retype)
    return aten.view.dtype(x, dtype).clone()


def _multilabel_slots(input, target):
    """(input and target as [N, C], which target slots count (those before a row's first -1), the input at
    each slot's target, which classes are targets)."""
    x, t = torch.atleast_2d(input), torch.atleast_2d(target)
    classes = x.shape[1]
    idx = torch.arange(classes, device=t.device)
    valid = idx < torch.amin(torch.where(t == -1, idx, classes), dim=-1, keepdim=True)  # [N, slot]
    at_target = torch.gather(x, -1, torch.where(valid, t, 0))  # [N, slot]
    is_target = torch.any(idx == torch.where(valid, t, -1).unsqueeze(-1), dim=1)  # [N, class]
    return x, t, valid, at_target, is_target


def _multilabel_hinge(x, valid, at_target, is_target):
    """[N, slot, class]: 1 - x[target] + x[class] for counted slots and non-target classes, else 0."""
    z = 1.0 - at_target.unsqueeze(-1) + x.unsqueeze(1)
    return torch.where(valid.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0)


@_misc(aten.multilabel_margin_loss_forward)
def _multilabel_margin_loss_forward(input, target, reduction: int):
    """CPU's loss: torch's decomposition (2.13) counts the slots after a row's first -1 as targets (the
    input at class 0), so a row with a -1 got a larger loss."""
    x, _, valid, at_target, is_target = _multilabel_slots(input, target)
    per_row = _multilabel_hinge(x, valid, at_target, is_target).clamp_min(0).sum(dim=(1, 2)) / x.shape[1]
    if reduction == 1:  # mean
        loss = per_row.mean()
    elif reduction == 2:  # sum
        loss = per_row.sum()
    else:
        loss = per_row if input.dim() > 1 else per_row.reshape(())
    return loss, is_target.to(input.dtype).reshape(target.shape)


@_misc(aten.multilabel_margin_loss_backward)
def _multilabel_margin_loss_backward(grad_output, input, target, reduction: int, is_target):
    """CPU's gradient: each positive hinge (slot k, class j) adds 1/C to class j and takes it from the slot's
    target class."""
    x, t, valid, at_target, _ = _multilabel_slots(input, target)
    targets = is_target.reshape(x.shape) != 0
    active = (_multilabel_hinge(x, valid, at_target, targets) > 0).to(x.dtype) / x.shape[1]  # [N, slot, class]
    grad = active.sum(1) - torch.zeros_like(x).scatter_add(1, torch.where(valid, t, 0), active.sum(2))
    if reduction == 1:
        grad = grad * (grad_output / x.shape[0])
    elif reduction == 2 or input.dim() <= 1:
        grad = grad * grad_output
    else:
        grad = grad * grad_output.reshape(-1, 1)
    return grad.reshape(input.shape)


@_misc(aten.native_batch_norm)
def _native_batch_norm_eval(input, weight, bias, running_mean, running_var, training: bool, momentum: float,
                            eps: float):
    """Eval mode, as an eager op on the device: torch-mlir's lowering returns the running statistics as
    ``save_mean``/``save_invstd`` (CUDA's shapes), where CPU's kernel and its Meta kernel return empty
    tensors, so the graph's types disagreed. The output is ``_native_batch_norm_legit_no_training``'s
    (what compiled graphs hold); the saved statistics are CPU's empty ones."""
    if training:
        return NotImplemented
    out = aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                              momentum, eps)[0]
    return out, input.new_zeros((0,)), input.new_zeros((0,))


def _torch_decompositions():
    # PyTorch's own decompositions that torch-mlir's list leaves out
    from torch._decomp import decomposition_table

    for op in (aten._batch_norm_with_update_functional.default, aten._batch_norm_with_update.default,
               aten._batch_norm_no_update.default):
        if op in decomposition_table:
            MISC.setdefault(op, decomposition_table[op])


_torch_decompositions()
