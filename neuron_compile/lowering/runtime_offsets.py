"""A slice of a buffer at an offset known only at run time: ``neuron_device::offset_slice``.

An eager op on the ``neuron`` device reads a view of a storage (``data[i:i + 35]``,
the key of a fused ``qkv`` projection) as a slice of the storage's buffer inside
its executable. Were the view's storage offset a constant of the executable, a
loop that slices a batch at a new offset each step would compile every op that
reads the batch once per step. So the device traces such a read as
``offset_slice(buffer, offset, length)``: the ``length`` elements of the
flattened buffer from ``offset``, a 0-d int64 input of the executable; then the
view's sizes and strides from element 0 of that slice.

Torch-MLIR has no lowering for an op of ours, so its JAX rule (``ALWAYS``)
lowers it: ``lax.dynamic_slice``, StableHLO's ``dynamic_slice``. A start past
``size - length`` is clamped there; a view's elements always lie inside its
storage, so the clamp never moves a real one.
"""

from __future__ import annotations

import torch

from .jax_rules import rule


@torch.library.custom_op("neuron_device::offset_slice", mutates_args=())
def offset_slice(base: torch.Tensor, offset: torch.Tensor, length: int) -> torch.Tensor:
    """``length`` elements of ``base`` flattened, from element ``offset`` (a 0-d integer tensor)."""
    return base.reshape(-1).narrow(0, int(offset), length).clone()


@offset_slice.register_fake
def _(base, offset, length):
    return base.new_empty((length,))


@rule(torch.ops.neuron_device.offset_slice)
def _offset_slice(out, base, offset, length):
    from jax import lax

    return lax.dynamic_slice(base.reshape(-1), (offset,), (length,))
