"""Histograms: ``histogram`` and ``histogramdd`` as comparisons against the bin edges and a sum, so
no data-dependent scatter is needed.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

HISTOGRAMS: dict = {}


def _register(op):
    return register_decomposition(op, registry=HISTOGRAMS)


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


@_register(aten.histogram.bin_ct)
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


@_register(aten.histogram.bins_tensor)
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


@_register(aten._histogramdd_bin_edges)
def _histogramdd_bin_edges(x, bins, *, range=None, weight=None, density: bool = False):
    if not x.dtype.is_floating_point:
        return NotImplemented
    return _dd_edges(x, bins, range)


@_register(aten._histogramdd_from_bin_cts)
def _histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density: bool = False):
    # histogramdd: one flat bin index per point (row-major over the dims), counted by a one-hot
    # sum; more than 2^16 bins in all is left to fail lowering
    if not _dd_supported(x, math.prod(bins)):
        return NotImplemented
    return _dd_counts(x, _dd_edges(x, bins, range), weight, density)


@_register(aten._histogramdd_from_bin_tensors)
def _histogramdd_from_bin_tensors(x, bins, *, weight=None, density: bool = False):
    if not _dd_supported(x, math.prod(b.shape[0] - 1 for b in bins)):
        return NotImplemented
    return _dd_counts(x, [b.to(x.dtype) for b in bins], weight, density)
