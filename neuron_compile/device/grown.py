"""Factories at a growing length: ``torch.empty``, ``arange(out=)`` and ``fill_`` give the true part of a
bucket (``lengths``), so the ops that read them run bucketed too.

A sampling loop makes its position ids (``arange(t)``), its causal mask (``ones(t, t)``, C++ SDPA's
``ones(t, t).tril()``) and ``contiguous()``'s buffers at the new length every token. Each is sighted per
dtype and rank (``_bucket_shape``, ``_length``): once a dim grows, the factory's
result lies in a bucket's storage, and the next op reads it at the bucket's shape and compiles nothing.
"""

from __future__ import annotations

import torch

from . import lengths
from . import storage as _storage
from .lengths import _PADDED, COUNTS, _buckets, _growing, _padded_tensor, active


def _length(sizes: set, n: int, first: set) -> bool:
    """A factory's dim whose sizes so far are ``sizes`` (``n`` among them) is a length at ``n``: it grew
    through the sizes below, and ``n`` is no size of the first sighting (a width), or is but no larger
    size was seen at the dim (a length growing to the head size: ``contiguous()`` of the attention's
    output at that length)."""
    return _growing(sizes, n) and (n not in first or n >= max(sizes))


def _bucket_shape(key, shape, table: dict):
    """``shape`` with its leading length (``_length``) at its bucket, or None where it has none; ``table``
    records the sightings under ``key``."""
    from ..bucketing.sizes import round_up

    if not active() or not shape or not _buckets():
        return None
    seen = table.get(key)
    if seen is None:
        table[key] = (set(shape), [{n} for n in shape])
        return None
    first, per_dim = seen
    for sizes, n in zip(per_dim, shape):
        sizes.add(n)
    # the leading dim larger than 1 only: the result stays contiguous, as CPU's (a view of it works)
    d = next((d for d, n in enumerate(shape) if n > 1), None)
    if d is None or not _length(per_dim[d], shape[d], first):
        return None
    return tuple(shape[:d]) + (round_up(shape[d], _buckets()),) + tuple(shape[d + 1:])


EMPTY_SEEN: dict = {}


def empty_padded(size, dtype, index: int):
    """``torch.empty(size)`` on the device at a length that keeps changing: the leading part of a bucket
    (an ``out=`` or in-place op then writes it bucketed)."""
    size = tuple(size)
    shape = _bucket_shape((dtype, len(size)), size, EMPTY_SEEN)
    return None if shape is None else _padded_tensor(size, shape, dtype, None, index, addressed=True)


ARANGE_SEEN: dict = {}
lengths.SIGHTINGS += [EMPTY_SEEN, ARANGE_SEEN]


def arange_kernel(op, args, kwargs, leaves):
    """``arange(t, out=...)`` into a fresh tensor at a length that keeps changing: made on the host into
    the leading part of a bucket (its consumers then read it bucketed); None otherwise. ``torch.arange(t,
    device=)`` hands an empty ``out`` that arange resizes: the length is the values'."""
    out = kwargs.get("out")
    if out is None or out.dim() != 1 or out.untyped_storage()._neuron.buffer is not None:
        return None
    n = _arange_values(op, args, out.dtype).numel()
    if out.numel() not in (0, n):
        return None
    shape = _bucket_shape((op, out.dtype), (n,), ARANGE_SEEN)
    return None if shape is None else _host_arange


def _arange_values(op, args, dtype):
    return op(*args, out=torch.empty(0, dtype=dtype))


def _host_arange(op, args, kwargs, leaves):
    from . import _torch_hooks
    from ..bucketing.sizes import round_up

    out = kwargs["out"]
    data = out.untyped_storage()._neuron
    values = _arange_values(op, args, out.dtype) if out.dim() == 1 and data.buffer is None else None
    if values is None or out.numel() not in (0, values.numel()):  # not a fresh vector: as any out= op
        return lengths.OPS.run_on_host(op, args, kwargs)
    n = values.numel()
    padded = _padded_tensor((n,), (round_up(n, _buckets()),), out.dtype, None, leaves.index or 0, addressed=True)
    host = torch.zeros(padded.untyped_storage()._neuron.numel, dtype=out.dtype)
    host[:n] = values
    COUNTS["host_copies"] += 1
    padded.untyped_storage()._neuron.set(_storage.host_to_buffer(host.view(_PADDED[padded.untyped_storage()._neuron]),
                                                                 leaves.index or 0))
    _torch_hooks.place(out, padded.untyped_storage(), 0, (n,), (1,))
    return out


def fill_bucket(tensor: torch.Tensor, value) -> bool:
    """``fill_`` / ``zero_`` of a never-written factory's tensor on a bucket's storage (``torch.ones(t, t)``,
    ``zeros``, ``full`` at a length that keeps changing): the whole bucket takes the shared constant
    (``storage.shared_constant``: no executable), True; False where it is not such a tensor.

    ``empty_padded`` pads only the leading dim (its result stays contiguous, as CPU's). Filled here, the
    tensor moves onto a bucket padded along each of its growing dims, with the bucket's strides, as a
    bucketed op's result is: the ``tril`` of a causal mask (C++ SDPA's ``ones(t, t).tril()``) then reads one
    layout per bucket, where a leading-dim bucket gave it a new layout, and a new kernel, each token."""
    from . import _torch_hooks

    data = getattr(tensor.untyped_storage(), "_neuron", None)
    shape = _PADDED.get(data) if data is not None else None
    if (shape is None or data.buffer is not None or tensor.storage_offset() or tensor.dtype is not data.dtype
            or tensor.dim() != len(shape) or torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) > 2
            or tuple(tensor.stride()) != _storage.contiguous_strides(shape)):
        return False
    full = _grown_shape(tensor.dtype, tuple(tensor.shape))
    index = tensor.device.index or 0
    if full is not None and tuple(full) != tuple(shape) and all(f >= s for f, s in zip(full, shape)):
        bucket = _padded_tensor(tensor.shape, full, tensor.dtype, None, index, addressed=True)
        _torch_hooks.place(tensor, bucket.untyped_storage(), 0, tensor.shape, bucket.stride())
        data, shape = bucket.untyped_storage()._neuron, full
    buffer = _storage.shared_constant(data.numel, data.dtype, value, index, shape)
    if buffer is None:
        return False
    data.set(buffer)
    return True


def _grown_shape(dtype, size):
    """``size`` with every dim ``empty_padded``'s sightings saw grow at its bucket, or None."""
    from ..bucketing.sizes import round_up

    seen = EMPTY_SEEN.get((dtype, len(size)))
    if seen is None:
        return None
    first, per_dim = seen
    return tuple(round_up(n, _buckets()) if _length(sizes, n, first) else n for sizes, n in zip(per_dim, size))


for _op in (torch.ops.aten.arange.out, torch.ops.aten.arange.start_out):
    lengths.FACTORY_KERNELS[_op] = arange_kernel
