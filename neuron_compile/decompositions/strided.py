"""Strided views torch-mlir has no lowering for: ``as_strided_copy``, ``as_strided_scatter`` and ``put``,
as gathers and scatters of statically computed positions (static slices where the strides allow).
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

STRIDED: dict = {}


def _register(op):
    return register_decomposition(op, registry=STRIDED)


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


@_register(aten.as_strided_copy)
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


@_register(aten.as_strided_scatter)
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


@_register(aten.put)
def _put(x, index, source, accumulate: bool = False):
    # x.put(index, source): writes into x flattened (negative positions from the end). Without
    # accumulate, repeated positions have no defined winner in eager either; index_put is the op.
    flat = x.reshape(-1)
    index = index.reshape(-1)
    index = torch.where(index < 0, index + flat.shape[0], index)
    return torch.index_put(flat, [index], source.reshape(-1).to(x.dtype), accumulate).reshape(list(x.shape))
