"""DTensor's random-number tracker on a neuron mesh: the one place that touches its internals.

DTensor runs a random op (``normal_``, ``uniform_``, dropout... on a DTensor, ``distribute_tensor``'s
factories) on each rank's local tensor inside ``OffsetBasedRNGTracker._distribute_region(spec)``
(``torch/distributed/tensor/_random.py``), a private method of a private class. For CUDA it reads the
device's Philox state, moves its offset to ``shard index * local numel`` for the op and past the full
tensor after it. For a neuron mesh ``install()`` makes that region ours (``rng.region``): the local op draws
from the device's Philox stream at each local element's linear position in the full tensor, which this
module computes from the spec (``shard_positions``) with torch's own per-dim shard arithmetic
(``torch.distributed.tensor._utils._get_shard_size_and_offsets``: ``Shard`` and ``_StridedShard``,
uneven shards, placements applied left to right as ``compute_local_shape_and_global_offset`` applies
them); after the op the offset moves by the tracker's own end increment (``_compute_rng_offsets``), so
the state a neuron mesh leaves is the state CUDA's tracker leaves. Every other device, a user's
generator and LocalTensor mode get torch's region unchanged.

``install()`` runs at ``import torch`` and imports nothing of ``torch.distributed``: it patches the module
as soon as it is imported (a post-import hook on ``sys.meta_path``), or at once if it already is.
``tests/test_device_hooks.py`` checks each internal this relies on, so a torch upgrade that changes one
fails there, by name.
"""

from __future__ import annotations

import contextlib

from .post_import import patch_on_import

TARGET = "torch.distributed.tensor._random"
DEVICE = "neuron"


def patch(random_module) -> None:
    """Give ``random_module.OffsetBasedRNGTracker`` our region for neuron meshes (once)."""
    tracker = random_module.OffsetBasedRNGTracker
    original = tracker._distribute_region
    if getattr(original, "_neuron", False):
        return

    def _distribute_region(self, spec, generator=None):
        if self._device.type != DEVICE or generator is not None or _local_tensor_mode():
            return original(self, spec, generator)
        return _neuron_region(self, spec)

    _distribute_region._neuron = True
    _distribute_region.__wrapped__ = original
    _distribute_region.__doc__ = original.__doc__
    tracker._distribute_region = _distribute_region


def _local_tensor_mode() -> bool:
    from torch.distributed._local_tensor import enabled_local_tensor_mode

    return bool(enabled_local_tensor_mode())


@contextlib.contextmanager
def _neuron_region(tracker, spec):
    from . import rng

    if not tracker.distribute_region_enabled:
        yield
        return
    _, end_increment = tracker._compute_rng_offsets(spec)
    with rng.region(tracker._device.index or 0, lambda shape: shard_positions(spec, shape), end_increment):
        yield


def shard_positions(spec, shape):
    """The linear positions in the full tensor (row-major) of this rank's local tensor's elements, in the
    local tensor's own row-major order, as an int64 numpy array of ``shape`` (checked against the spec)."""
    import numpy as np
    import torch
    from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    full = tuple(spec.shape)
    mesh, coordinate = spec.mesh, spec.mesh.get_coordinate()
    local, along = list(full), {}  # along[d]: the global indices of the local tensor's dim d
    for mesh_dim, placement in enumerate(spec.placements):
        if not isinstance(placement, (Shard, _StridedShard)):
            continue
        dim = placement.dim
        size, offsets = _get_shard_size_and_offsets(local[dim], mesh.size(mesh_dim), coordinate[mesh_dim],
                                                     placement, along.get(dim), full[dim], False)
        local[dim] = size
        along[dim] = offsets[:size]  # an empty shard's offsets hold one placeholder
    if tuple(local) != tuple(shape):
        raise RuntimeError(f"a DTensor random op's local tensor has shape {tuple(shape)}, where its spec "
                           f"({spec.placements} of {full} on mesh {tuple(mesh.shape)}) gives {tuple(local)}")
    positions = np.zeros(tuple(local), dtype=np.int64)
    stride = 1
    for dim in reversed(range(len(full))):
        index = along.get(dim)
        index = np.arange(full[dim], dtype=np.int64) if index is None else \
            torch.as_tensor(index).to(torch.int64).numpy()
        positions += (index * stride).reshape([-1 if d == dim else 1 for d in range(len(full))])
        stride *= full[dim]
    return positions


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    patch_on_import({TARGET: patch})