"""Bit-level ops: ``nextafter`` as integer steps on the bit pattern, ``view_copy.dtype`` as a bitcast
and a copy.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

BITS: dict = {}


def _register(op):
    return register_decomposition(op, registry=BITS)


# --------------------------------------------------------------------------- nextafter

_BITS = {torch.float32: (torch.int32, 2 ** 31 - 1), torch.float64: (torch.int64, 2 ** 63 - 1)}


@_register(aten.nextafter)
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


@_register(aten.view_copy.dtype)
def _view_copy_dtype(x, dtype):
    # torch-mlir has no view_copy.dtype: the view (a bitcast, ``lowering.jax_rules``), then a copy. The
    # device reinterprets a storage's bytes with it (device.transfers.retype)
    return aten.view.dtype(x, dtype).clone()
