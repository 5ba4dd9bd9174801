"""Pooling and window ops torch-mlir does not lower, or lowers wrong, as gathers of windows.

torch-mlir's StableHLO lowerings of max/avg pooling (reduce_window) are right for floor-mode windows; with
``ceil_mode=True`` max_pool2d/3d return wrong values (the extra right window) and avg_pool2d/3d do not lower;
avg_pool3d ignores ``divisor_override``; max_pool3d_with_indices, adaptive_max_pool3d and _adaptive_avg_pool3d
have no lowering at all, adaptive_max_pool2d's fails, and an empty ``stride`` (ATen's default: the kernel
size, what eager ``F.max_pool2d(x, 2)`` passes) is lowered as stride 1. Those cases, and only those (the
others keep torch-mlir's reduce_window), are computed here by one engine:

* per spatial dim, an integer table ``pos[o, k]`` of the input position the k-th element of window o reads,
  and ``valid[o, k]`` (inside the input and, for adaptive windows of different lengths, inside the window);
* one ``index_select`` per spatial dim gathers every window element (positions clamped), giving ``[batch...,
  o1..od, k1..kd]``;
* max: the largest valid element, NaN if any (eager propagates NaN); its index is eager's: the first valid
  element equal to the max in scan order, the last NaN when there is one (ATen's CPU kernel updates on every
  NaN), the window's first valid element when all are -inf; flat in the input's spatial plane;
* avg: the sum of valid elements over ATen's divisor (divisor_override, or the window clipped to the padded
  input when count_include_pad, else to the input).

Replication padding's backward (no lowering) adds each gradient at the input position its output copies.
torch-mlir lowers no average-pooling backward either (but the global average pool's), nor adaptive max
pooling's or max_pool3d's: the average ones are the adjoint of the same engine, one [out, size] spread matrix
per spatial dim; the max ones scatter each gradient to the position its index names.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

POOL: dict = {}


def _pool(op):
    return register_decomposition(op, registry=POOL)


def _tuple(v, d):
    if v is None:
        return None
    if isinstance(v, int):
        return (v,) * d
    v = tuple(v)
    return v * d if len(v) == 1 else v


def _out_size(size, k, s, p, dil, ceil_mode):
    # ATen's pooling_output_shape (pool.h)
    num = size + 2 * p - dil * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _ar(n, like):
    return torch.arange(n, dtype=torch.int64, device=like.device)


class _Dim:
    """One spatial dim's windows: pos/valid [out, K], and for avg the divisor factor [out]."""

    def __init__(self, pos, valid, size, count=None):
        self.pos, self.valid, self.size, self.count = pos, valid, size, count


def _strided_dim(size, k, s, p, dil, ceil_mode, like, count_include_pad=True):
    out = _out_size(size, k, s, p, dil, ceil_mode)
    start = _ar(out, like) * s - p
    pos = start.unsqueeze(1) + _ar(k, like).unsqueeze(0) * dil
    valid = (pos >= 0) & (pos < size)
    if count_include_pad:  # ATen's avg_pool: the window clipped to the padded input
        count = torch.clamp(start + k, max=size + p) - start
    else:
        count = valid.sum(1)
    return _Dim(pos, valid, size, count)


def _adaptive_dim(size, out, like):
    o = _ar(out, like)
    start = torch.div(o * size, out, rounding_mode="floor")
    end = torch.div((o + 1) * size + out - 1, out, rounding_mode="floor")
    k = max(((i + 1) * size + out - 1) // out - (i * size) // out for i in range(out)) if out else 1
    pos = start.unsqueeze(1) + _ar(k, like).unsqueeze(0)
    valid = pos < end.unsqueeze(1)
    return _Dim(pos, valid, size, end - start)


def _gather_windows(x, dims):
    """x [B..., S1..Sd] -> (values [B..., o1..od, W], valid [o1..od, W], flat input position [o1..od, W])."""
    d = len(dims)
    nb = x.dim() - d
    outs = [dm.pos.shape[0] for dm in dims]
    ks = [dm.pos.shape[1] for dm in dims]
    v = x
    for j, dm in enumerate(dims):
        axis = nb + 2 * j  # earlier dims are already split into (o, k)
        idx = torch.clamp(dm.pos, 0, dm.size - 1).reshape(-1)
        v = torch.index_select(v, axis, idx)
        shape = list(v.shape)
        v = v.reshape(shape[:axis] + [outs[j], ks[j]] + shape[axis + 1:])
    perm = list(range(nb)) + [nb + 2 * j for j in range(d)] + [nb + 2 * j + 1 for j in range(d)]
    v = v.permute(perm).reshape(list(x.shape[:nb]) + outs + [math.prod(ks)])
    valid = None
    flat = None
    plane = 1
    for j in reversed(range(d)):
        dm = dims[j]
        shape = [1] * (2 * d)
        shape[j], shape[d + j] = outs[j], ks[j]
        vj = dm.valid.reshape(shape)
        pj = torch.clamp(dm.pos, 0, dm.size - 1).reshape(shape) * plane
        valid = vj if valid is None else valid & vj
        flat = pj if flat is None else flat + pj
        plane *= dm.size
    full = outs + ks
    valid = valid.expand(full).reshape(outs + [-1])
    flat = flat.expand(full).reshape(outs + [-1])
    return v, valid, flat


def _max_windows(x, dims, with_indices):
    v, valid, flat = _gather_windows(x, dims)
    return _window_max(v, valid, flat, with_indices)


def _window_max(v, valid, flat, with_indices):
    """The max of each window [..., W] (and eager's index of it, from ``flat``), over its valid elements."""
    x = v
    lowest = float("-inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    neg = torch.full((), lowest, dtype=x.dtype, device=x.device)
    masked = torch.where(valid, v, neg)
    values = torch.amax(masked, -1)
    if not with_indices:
        return values
    w = v.shape[-1]
    nan = (torch.isnan(v) if x.dtype.is_floating_point else torch.zeros_like(valid)) & valid
    last_nan = (w - 1) - torch.argmax(torch.flip(nan, [-1]).to(torch.int32), -1)
    hit = valid & (v == values.unsqueeze(-1))
    first_valid = torch.argmax(valid.to(torch.int32), -1)  # all -inf: ATen keeps the window's first element
    first_hit = torch.where(hit.any(-1), torch.argmax(hit.to(torch.int32), -1), first_valid)
    k = torch.where(nan.any(-1), last_nan, first_hit)
    flat = flat.expand(v.shape)
    return values, torch.gather(flat, -1, k.unsqueeze(-1)).squeeze(-1)


def _avg_windows(x, dims, divisor_override):
    v, valid, _ = _gather_windows(x, dims)
    total = torch.where(valid, v, torch.zeros((), dtype=x.dtype, device=x.device)).sum(-1)
    if divisor_override:
        count = divisor_override
    else:
        count = None
        d = len(dims)
        for j, dm in enumerate(dims):
            shape = [1] * d
            shape[j] = dm.pos.shape[0]
            c = dm.count.reshape(shape)
            count = c if count is None else count * c
        count = count.to(x.dtype)
    if not x.dtype.is_floating_point:  # ATen divides integers in C++: toward zero
        return torch.div(total, count, rounding_mode="trunc")
    return total / count


def _check(x, d, integers=False):
    if x.dim() not in (d + 1, d + 2) or x.numel() == 0:
        return False
    return x.dtype.is_floating_point or (integers and x.dtype != torch.bool and not x.dtype.is_complex)


def _max_pool(d, with_indices, always, op):
    def decomposition(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        # integers too: torch-mlir's ceil-mode reduce_window is as wrong for them (int64 samples)
        if not (always or ceil_mode) or not _check(x, d, integers=True):
            if not stride:  # ATen's default stride is the kernel size; torch-mlir's lowering takes 1
                return op(x, kernel_size, kernel_size, padding, dilation, ceil_mode)
            return NotImplemented
        k = _tuple(kernel_size, d)
        s = _tuple(stride, d) if stride else k
        p, dil = _tuple(padding, d), _tuple(dilation, d)
        size = x.shape[-d:]
        dims = [_strided_dim(size[j], k[j], s[j], p[j], dil[j], ceil_mode, x) for j in range(d)]
        return _max_windows(x, dims, with_indices)
    return decomposition


# ceil_mode=True: torch-mlir's reduce_window gives wrong values (max) or does not lower (avg);
# max_pool3d_with_indices never lowers. Floor-mode 2d pooling keeps torch-mlir's lowering.
for _op, _d, _indices, _always in ((aten.max_pool2d_with_indices.default, 2, True, False),
                                   (aten.max_pool3d_with_indices.default, 3, True, True),
                                   (aten.max_pool2d.default, 2, False, False),
                                   (aten.max_pool3d.default, 3, False, False)):
    POOL[_op] = _max_pool(_d, _indices, _always, _op)


def _avg_dims(x, d, kernel_size, stride, padding, ceil_mode, count_include_pad):
    """The windows of an average pool over x's last d dims, as avg_pool{2,3}d's arguments give them."""
    k = _tuple(kernel_size, d)
    s = _tuple(stride, d) if stride else k
    p = _tuple(padding, d)
    size = x.shape[-d:]
    return [_strided_dim(size[j], k[j], s[j], p[j], 1, ceil_mode, x, count_include_pad) for j in range(d)]


def _avg_pool(d):
    def decomposition(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None):
        if not (ceil_mode or divisor_override) or not _check(x, d, integers=True):
            return NotImplemented
        dims = _avg_dims(x, d, kernel_size, stride, padding, ceil_mode, count_include_pad)
        return _avg_windows(x, dims, divisor_override)
    return decomposition


POOL[aten.avg_pool2d.default] = _avg_pool(2)
POOL[aten.avg_pool3d.default] = _avg_pool(3)


def _avg_backward(grad, x, dims, divisor_override):
    """The adjoint of ``_avg_windows``: each output's gradient spread over its window's valid
    positions, over the same divisor. The divisor is a product over dims, so the spread is one
    [out, size] matrix per spatial dim."""
    nb = x.dim() - len(dims)
    g = grad
    for j, dm in enumerate(dims):
        hit = (dm.pos.unsqueeze(-1) == _ar(dm.size, x)) & dm.valid.unsqueeze(-1)  # [out, K, size]
        spread = hit.sum(1).to(grad.dtype)
        if not divisor_override:
            spread = spread / dm.count.to(grad.dtype).unsqueeze(1)
        g = torch.movedim(_spread(torch.movedim(g, nb + j, -1), spread), -1, nb + j)
    return g / divisor_override if divisor_override else g


def _spread(g, spread):
    """``g [..., out] @ spread [out, size]`` with a NaN or infinite gradient reaching only the positions its
    window covers, as ATen's loop adds it (a matmul's NaN * 0 made the whole input gradient NaN: lp_pool's
    gradient at a negative input, test_modules.py's LPPool3d parity); a NaN, or +inf and -inf, make NaN."""
    out = torch.matmul(torch.where(torch.isfinite(g), g, torch.zeros_like(g)), spread)
    cover = (spread != 0).to(g.dtype)
    nan, pos, neg = torch.matmul(torch.stack([torch.isnan(g), g == math.inf, g == -math.inf]).to(g.dtype), cover) > 0
    out = torch.where(pos, torch.full_like(out, math.inf), torch.where(neg, torch.full_like(out, -math.inf), out))
    return torch.where(nan | (pos & neg), torch.full_like(out, math.nan), out)


def _avg_pool_backward(d):
    # torch-mlir lowers no average-pooling backward (AvgPool1d/2d/3d training failed); the adjoint
    # of the window engine, for every padding, ceil_mode, count_include_pad and divisor
    def decomposition(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        if not grad.dtype.is_floating_point:
            return NotImplemented
        dims = _avg_dims(x, d, kernel_size, stride, padding, ceil_mode, count_include_pad)
        return _avg_backward(grad, x, dims, divisor_override)
    return decomposition


POOL[aten.avg_pool2d_backward.default] = _avg_pool_backward(2)
POOL[aten.avg_pool3d_backward.default] = _avg_pool_backward(3)


def _adaptive_avg_pool_backward(d):
    # no lowering of the adaptive backward either, but for the global (1x1) case
    def decomposition(grad, x):
        if not grad.dtype.is_floating_point:
            return NotImplemented
        dims = [_adaptive_dim(x.shape[-d + j], grad.shape[-d + j], x) for j in range(d)]
        return _avg_backward(grad, x, dims, None)
    return decomposition


POOL[aten._adaptive_avg_pool2d_backward.default] = _adaptive_avg_pool_backward(2)
POOL[aten._adaptive_avg_pool3d_backward.default] = _adaptive_avg_pool_backward(3)


def _to_indices(grad, x, indices, d):
    """Each output's gradient added at the input position its index names, flat in the spatial plane."""
    lead = list(x.shape[:-d])
    flat = torch.zeros(lead + [math.prod(x.shape[-d:])], dtype=grad.dtype, device=grad.device)
    flat = torch.scatter_add(flat, -1, indices.reshape(lead + [-1]), grad.reshape(lead + [-1]))
    return flat.reshape(x.shape)


POOL[aten.adaptive_max_pool2d_backward.default] = lambda grad, x, indices: _to_indices(grad, x, indices, 2)
POOL[aten.adaptive_max_pool3d_backward.default] = lambda grad, x, indices: _to_indices(grad, x, indices, 3)
# max_pool3d's indices are flat in the spatial volume too (max_pool2d's backward torch-mlir lowers)
POOL[aten.max_pool3d_with_indices_backward.default] = (
    lambda grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices: _to_indices(grad, x, indices, 3))


@_pool(aten._adaptive_avg_pool3d)
def _adaptive_avg_pool3d(x, output_size):
    if not _check(x, 3):
        return NotImplemented
    dims = [_adaptive_dim(x.shape[-3 + j], output_size[j], x) for j in range(3)]
    return _avg_windows(x, dims, None)


def _adaptive_max_pool(d):
    def decomposition(x, output_size):
        if not _check(x, d):
            return NotImplemented
        dims = [_adaptive_dim(x.shape[-d + j], output_size[j], x) for j in range(d)]
        return _max_windows(x, dims, True)
    return decomposition


POOL[aten.adaptive_max_pool2d.default] = _adaptive_max_pool(2)
POOL[aten.adaptive_max_pool3d.default] = _adaptive_max_pool(3)


# --------------------------------------------------------------------------- fractional max pooling


def _fractional_max_pool(d):
    """ATen's fractional max pooling (no lowering): per (batch, channel) plane and spatial dim, window starts
    ``int((i + u) * alpha) - int(u * alpha)`` with ``alpha = (in - k) / (out - 1)`` computed in the input's
    dtype, the last window at ``in - k``; ``u`` is the plane's random sample for the dim (2d: [W, H],
    3d: [T, H, W]). Max and index as the other max pools."""
    def decomposition(x, kernel_size, output_size, random_samples):
        if not _check(x, d):
            return NotImplemented
        batched = x.dim() == d + 2
        xb = x if batched else x.unsqueeze(0)
        lead, size = list(xb.shape[:2]), list(xb.shape[2:])
        # ATen reads sample [n][c] for batch n: an unbatched input with more sample rows uses the first
        samples = random_samples[:lead[0]].to(x.dtype)
        sample_of = [1, 0] if d == 2 else [0, 1, 2]
        flat, plane = None, 1
        for j in reversed(range(d)):
            n_in, n_out, k = size[j], output_size[j], kernel_size[j]
            u = samples[..., sample_of[j]].unsqueeze(-1)  # [N, C, 1]
            i = _ar(n_out, x).to(x.dtype)
            if n_out > 1:
                alpha = torch.full((), n_in - k, dtype=x.dtype, device=x.device) / (n_out - 1)
                start = ((i + u) * alpha).to(torch.int64) - (u * alpha).to(torch.int64)
                start = torch.where(_ar(n_out, x) == n_out - 1, n_in - k, start)
            else:
                start = torch.full(lead + [1], n_in - k, dtype=torch.int64, device=x.device)
            pos = start.unsqueeze(-1) + _ar(k, x)  # [N, C, out, k]
            shape = lead + [1] * (2 * d)
            shape[2 + j], shape[2 + d + j] = n_out, k
            term = pos.reshape(shape) * plane
            flat = term if flat is None else flat + term
            plane *= n_in
        outs = list(output_size[:d])
        flat = flat.expand(lead + outs + list(kernel_size[:d])).reshape(lead + outs + [-1])
        values = torch.gather(xb.reshape(lead + [-1]), -1, flat.reshape(lead + [-1])).reshape(flat.shape)
        out, index = _window_max(values, torch.ones_like(flat, dtype=torch.bool), flat, True)
        return (out, index) if batched else (out.squeeze(0), index.squeeze(0))
    return decomposition


POOL[aten.fractional_max_pool2d.default] = _fractional_max_pool(2)
POOL[aten.fractional_max_pool3d.default] = _fractional_max_pool(3)
POOL[aten.fractional_max_pool2d_backward.default] = (
    lambda grad, x, kernel_size, output_size, indices: _to_indices(grad, x, indices, 2))
POOL[aten.fractional_max_pool3d_backward.default] = (
    lambda grad, x, kernel_size, output_size, indices: _to_indices(grad, x, indices, 3))


# --------------------------------------------------------------------------- replication padding


def _replication_pad_backward(d):
    """The adjoint of replicate padding over the last d dims: each output position's gradient added at the
    input position it copies (its index clamped into the input), one dim at a time."""
    def decomposition(grad, x, padding):
        for j in range(d):
            dim = x.dim() - 1 - j
            size = x.shape[dim]
            source = torch.clamp(_ar(grad.shape[dim], grad) - padding[2 * j], 0, size - 1)
            shape = list(grad.shape)
            shape[dim] = size
            grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add(dim, source, grad)
        return grad
    return decomposition


POOL[aten.replication_pad1d_backward.default] = _replication_pad_backward(1)
POOL[aten.replication_pad2d_backward.default] = _replication_pad_backward(2)
POOL[aten.replication_pad3d_backward.default] = _replication_pad_backward(3)


# --------------------------------------------------------------------------- zero-size inputs

# Ops whose decompositions (torch's index arithmetic for padding and im2col, ours above,
# torch-mlir's reduce_window) do not lower when the input has no elements (OpInfo's
# batch-0 samples: StableHLO gathers with a slice size of 1 on a 0-dim). The result then
# has no elements either: zeros of the shape and dtype the op's meta kernel gives.
ZERO_SIZE = (
    aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
    aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default,
    aten.im2col.default, aten.col2im.default,
    aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default,
    aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default,
    aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
    aten.avg_pool2d.default, aten.avg_pool3d.default, aten.roll.default, aten._trilinear.default,
)


def _meta_outputs(op, args, kwargs):
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    def to_meta(a):
        if isinstance(a, torch.Tensor):
            return torch.empty([int(s) for s in a.shape], dtype=a.dtype, device="meta")
        return a

    with disable_proxy_modes_tracing(), unset_fake_temporarily():
        return op(*torch.utils._pytree.tree_map(to_meta, args), **torch.utils._pytree.tree_map(to_meta, kwargs))


def _zero_size(op, inner):
    def decomposition(*args, **kwargs):
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if tensors and tensors[0].numel() == 0:
            device = tensors[0].device
            out = _meta_outputs(op, args, kwargs)
            return torch.utils._pytree.tree_map(
                lambda m: torch.zeros(list(m.shape), dtype=m.dtype, device=device) if isinstance(m, torch.Tensor) else m,
                out)
        return inner(*args, **kwargs) if inner is not None else NotImplemented
    return decomposition


def with_zero_size(table: dict) -> dict:
    """Wrap the table's entries (or the ops themselves) for ZERO_SIZE with the empty-input case."""
    for op in ZERO_SIZE:
        table[op] = _zero_size(op, table.get(op))
    return table


# --------------------------------------------------------------------------- Tensor.unfold


@_pool(aten.unfold)
def _unfold(x, dimension: int, size: int, step: int):
    # Tensor.unfold (sliding windows of one dim, a view in eager): torch-mlir has no StableHLO
    # lowering. A gather of the windows along the dim, the window's elements as a new last dim.
    if x.dim() == 0:
        return x.reshape([1])
    d = dimension % x.dim()
    n = (x.shape[d] - size) // step + 1
    if x.numel() == 0 or n * size == 0:
        shape = list(x.shape)
        shape[d] = n
        return torch.zeros(shape + [size], dtype=x.dtype, device=x.device)
    idx = (_ar(n, x).unsqueeze(1) * step + _ar(size, x).unsqueeze(0)).reshape(-1)
    v = torch.index_select(x, d, idx)
    shape = list(x.shape)
    v = v.reshape(shape[:d] + [n, size] + shape[d + 1:])
    return v.movedim(d + 1, -1)


@_pool(aten.unfold_copy)
def _unfold_copy(x, dimension: int, size: int, step: int):
    return _unfold(x, dimension, size, step).clone()


# --------------------------------------------------------------------------- transposed convolution


@_pool(aten.convolution.default)
def _convolution(x, weight, bias, stride, padding, dilation, transposed: bool, output_padding, groups: int):
    # torch-mlir fails to lower transposed convolutions with output_padding in some stride
    # combinations (OpInfo conv_transpose2d/3d: stride (3, 2), output_padding (2, 3)). Those, and
    # only those (others keep its lowering with lhs dilation), become the ordinary convolution
    # they equal: zeros between input elements, padding dilation * (k - 1) - p on each side (+
    # output_padding on the right, a crop where negative), the kernel flipped, in and out swapped
    # per group.
    if not transposed or not any(output_padding) or x.dim() < 3:
        return NotImplemented
    d = x.dim() - 2
    stride, padding, dilation = _tuple(stride, d), _tuple(padding, d), _tuple(dilation, d)
    output_padding = _tuple(output_padding, d)
    ks = list(weight.shape[2:])
    for j in range(d):
        axis = 2 + j
        s = stride[j]
        if s > 1:
            size = x.shape[axis]
            x = x.unsqueeze(axis + 1)
            pad = [0, 0] * (x.dim() - axis - 2) + [0, s - 1]
            x = aten.constant_pad_nd.default(x, pad, 0.0)
            shape = list(x.shape)
            x = x.reshape(shape[:axis] + [size * s] + shape[axis + 2:])
            x = aten.slice.Tensor(x, axis, 0, (size - 1) * s + 1)
        lo = dilation[j] * (ks[j] - 1) - padding[j]
        hi = lo + output_padding[j]
        pad = [0, 0] * (x.dim() - axis - 1) + [max(lo, 0), max(hi, 0)]
        x = aten.constant_pad_nd.default(x, pad, 0.0)
        length = x.shape[axis]
        x = aten.slice.Tensor(x, axis, max(-lo, 0), length - max(-hi, 0))
    cin, cout_g = weight.shape[0], weight.shape[1]
    w = weight.reshape([groups, cin // groups, cout_g] + ks).transpose(1, 2)
    w = w.reshape([groups * cout_g, cin // groups] + ks).flip(list(range(2, 2 + d)))
    return aten.convolution.default(x, w, bias, [1] * d, [0] * d, list(dilation), False, [0] * d, groups)


# --------------------------------------------------------------------------- antialiased bilinear resize


def _aa_weights(in_size: int, out_size: int, align_corners: bool, scale_opt, like):
    """ATen's _compute_weights_aa for the bilinear (triangle) filter: [out_size, in_size] weights, from aranges."""
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        scale = 1.0 / scale_opt if scale_opt is not None and scale_opt > 0 else in_size / out_size
    support = scale if scale >= 1.0 else 1.0  # interp_size 2, times scale when downsampling
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    dtype = like.dtype
    center = (torch.arange(out_size, dtype=dtype, device=like.device) + 0.5) * scale
    center = center.unsqueeze(1)  # [out, 1]
    xmin = torch.clamp(torch.floor(center - support + 0.5), min=0)  # ATen truncates; equal once clamped at 0
    xend = torch.clamp(torch.floor(center + support + 0.5), max=in_size)
    j = torch.arange(in_size, dtype=dtype, device=like.device).unsqueeze(0)  # [1, in]
    w = torch.clamp(1.0 - torch.abs((j - center + 0.5) * invscale), min=0)
    w = torch.where((j >= xmin) & (j < xend), w, torch.zeros((), dtype=dtype, device=like.device))
    total = w.sum(1, keepdim=True)
    return torch.where(total != 0, w / torch.where(total != 0, total, torch.ones_like(total)), w)


@_pool(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(x, output_size, align_corners: bool, scales_h=None, scales_w=None):
    # torch-mlir has no lowering; the antialiased resize is separable with weights that depend
    # only on the sizes: two matmuls with ATen's weights (float32 sums in another order).
    if not x.dtype.is_floating_point or x.dim() != 4:
        return NotImplemented
    h, w = x.shape[-2:]
    oh, ow = output_size
    if x.numel() == 0 or oh * ow == 0:
        return torch.zeros(list(x.shape[:2]) + [oh, ow], dtype=x.dtype, device=x.device)
    wh = _aa_weights(h, oh, align_corners, scales_h, x)
    ww = _aa_weights(w, ow, align_corners, scales_w, x)
    out = torch.matmul(x, ww.t())  # [N, C, h, ow]
    return torch.matmul(wh, out)  # [N, C, oh, ow]


# --------------------------------------------------------------------------- grid_sampler_3d


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


@_pool(aten.grid_sampler_3d)
def _grid_sampler_3d(x, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    # torch-mlir has no lowering. ATen's trilinear (mode 0) or nearest (mode 1) sampling with
    # zeros (0) or border (1) padding: the 8 (or 1) neighbours of each grid point gathered from
    # the flattened volume, out-of-volume neighbours weighted 0. Reflection padding and bicubic
    # are left to fail lowering.
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1) or not x.dtype.is_floating_point:
        return NotImplemented
    n, c, d, h, w = x.shape
    out_shape = list(grid.shape[1:4])
    p = math.prod(out_shape)
    if x.numel() == 0 or p == 0:
        return torch.zeros([n, c] + out_shape, dtype=x.dtype, device=x.device)
    g = grid.reshape(n, p, 3)
    coords = []
    for k, size in enumerate((w, h, d)):  # grid's last dim is (x, y, z) = (W, H, D)
        v = _unnormalize(g[..., k], size, align_corners)
        if padding_mode == 1:
            v = torch.clamp(v, 0, size - 1)
        coords.append(v)
    flat = x.reshape(n, c, d * h * w)

    def corner(ix, iy, iz):
        valid = (ix >= 0) & (ix <= w - 1) & (iy >= 0) & (iy <= h - 1) & (iz >= 0) & (iz <= d - 1)
        xi = torch.clamp(ix, 0, w - 1).to(torch.int64)
        yi = torch.clamp(iy, 0, h - 1).to(torch.int64)
        zi = torch.clamp(iz, 0, d - 1).to(torch.int64)
        index = ((zi * h + yi) * w + xi).unsqueeze(1).expand(n, c, p)
        return torch.gather(flat, 2, index), valid.unsqueeze(1)

    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if interpolation_mode == 1:
        ix, iy, iz = (torch.round(v) for v in coords)  # nearbyint: half to even
        vals, valid = corner(ix, iy, iz)
        out = torch.where(valid, vals, zero)
    else:
        ix, iy, iz = coords
        x0, y0, z0 = torch.floor(ix), torch.floor(iy), torch.floor(iz)
        fx, fy, fz = ix - x0, iy - y0, iz - z0
        out = None
        for dz in (0, 1):
            for dy in (0, 1):
                for dx in (0, 1):
                    weight = ((fx if dx else 1 - fx) * (fy if dy else 1 - fy) * (fz if dz else 1 - fz)).unsqueeze(1)
                    vals, valid = corner(x0 + dx, y0 + dy, z0 + dz)
                    term = torch.where(valid, vals * weight, zero)
                    out = term if out is None else out + term
    return out.reshape([n, c] + out_shape)
