"""Host transfers of neuron tensors: copies to and from the host, writes into device storages, ops run on
host copies, and a storage's dtype or size changed in place.

``to_host``/``from_host`` copy a tensor (its whole storage, or a view cloned alone first: ``alone``);
``copy_into`` writes a CPU tensor into a neuron one; ``run_on_host`` runs an op on host copies and
writes back what its schema says it wrote (ops with data-dependent shapes, ``fallback="eager"``);
``retype`` and ``resize_`` change a storage's dtype or size, keeping its bytes or elements.
Each host copy counts in ``COUNTS["host_copies"]``.

``ops`` (which imports this module) sets itself as ``OPS``: the dispatcher a partial copy or a bitcast
goes through, and ``user_line`` for errors.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .. import profiling as _profiling
from . import _torch_hooks
from . import lengths as _lengths
from . import op_tracking as _op_tracking
from . import storage as _storage
from .opkernel import COUNTS
from .storage import new_tensor

aten = torch.ops.aten
OPS = None  # ``ops`` sets itself here


def retype(data, dtype: torch.dtype) -> None:
    """Reinterpret a storage's bytes as ``dtype`` (a tensor reaching an op in a dtype other than its
    storage's: a ``view(dtype)``, or its base after one; ``torch.load`` rebuilds float tensors on the
    uint8 storages it restored): on the device, one compiled bitcast of the whole storage
    (``view_copy.dtype``), where its bytes make whole elements of ``dtype`` and that is not bool (a PJRT
    bool holds 0 or 1: the host checks the bytes); otherwise through the host (``storage.retype``)."""
    nbytes = data.numel * data.dtype.itemsize
    if data.buffer is None or nbytes % dtype.itemsize or dtype == torch.bool:
        if data.buffer is not None:
            COUNTS["host_copies"] += 2
        _storage.retype(data, dtype)
        return
    flat = new_tensor(data.buffer.shape, data.dtype, data.buffer, index=data.buffer.device.id).reshape(-1)
    with _lengths.exact():
        buffer = _storage.data_of(OPS.dispatch(aten.view_copy.dtype, (flat, dtype), {})).buffer
    data.dtype, data.numel = dtype, nbytes // dtype.itemsize
    data.set(buffer)


def to_host(value, counter: str | None = "host_copies"):
    """A CPU copy of a neuron tensor, with the same size, stride and offset (its whole storage comes over);
    ``counter``: the ``COUNTS`` entry it adds one to (None: the caller counts it as something else)."""
    if not (isinstance(value, torch.Tensor) and value.device.type == "neuron"):
        return value
    data = _storage.data_of(value)
    if data.dtype is not value.dtype:
        retype(data, value.dtype)
    if counter:
        COUNTS[counter] += 1
    if data.buffer is None:
        flat = torch.zeros(data.numel, dtype=data.dtype)
    else:
        flat = _storage.buffer_to_host(data.buffer, data.dtype).reshape(-1)
    out = flat.as_strided(value.shape, value.stride(), value.storage_offset())
    if value.requires_grad:
        out.requires_grad_(True)
    return out


_ALONE = 1024  # a storage of more elements (and over twice the view's): the view comes to the host alone
# the dtypes whose clone lowers everywhere (Torch-MLIR imports no uint16/32/64; complex and float8 are not ours)
_CLONED = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                     torch.int16, torch.int8, torch.uint8, torch.bool})


def alone(x):
    """``x`` for a copy to the host: a view of a storage much larger than itself (``cache[0, 0, 0, 0].item()``,
    ``logits[:, -1].cpu()``, a batch of ids sliced from a resident corpus for its index check) cloned alone
    on the device first, its offset a run-time input (one executable for every position). ``to_host`` brings
    a whole storage over: 16 MiB for one float took milliseconds."""
    if x.dtype in _CLONED and not x.requires_grad and _storage.data_of(x).numel > max(_ALONE, 2 * x.numel()):
        return OPS.dispatch(aten.clone.default, (x,), {})
    return x


def run_on_host(op, args, kwargs):
    """Run ``op`` on host copies; write back what it wrote, return its results on the device."""
    if _profiling.STATE._is_profiler_enabled and _profiling.outside_host_fallback():
        return _profiling.host_fallback(run_on_host, op, args, kwargs)
    COUNTS["host_ops"] += 1
    _op_tracking.on_host(op)
    host_op = _on_host(op)
    host_args, host_kwargs = tree_map(to_host, (args, kwargs))
    with torch.no_grad():
        result = host_op(*host_args, **host_kwargs)
    if result is NotImplemented:  # a decomposition that declines these arguments (_on_host's CPU stand-in)
        raise NotImplementedError(f"neuron: {op} does not lower, and its decomposition, run on the host in its "
                                  f"place, declines these arguments. Called at {OPS.user_line()}.")
    # arguments the schema says are written go back to their neuron tensors
    flat_dev = _flat_tensors(args, kwargs)
    flat_host = _flat_tensors(host_args, host_kwargs)
    written = _written_positions(op, args, kwargs)
    for position in written:
        dst, src = flat_dev[position], flat_host[position]
        if dst.shape != src.shape:
            resize_(dst, src.shape)
        copy_into(dst, src)
    host_to_dev = {id(h): d for h, d in zip(flat_host, flat_dev)}
    index = next((t.device.index for t in flat_dev if t.device.type == "neuron"), 0)

    def back(value):
        if isinstance(value, torch.Tensor):
            same = host_to_dev.get(id(value))
            if same is not None:
                return same
            return from_host(value, index)
        return value

    return tree_map(back, result)


@functools.lru_cache(maxsize=None)
def _on_host(op):
    """What runs ``op`` on CPU tensors: the op, or where the CPU has no kernel for it (an op of CUDA's
    only) its decomposition, which runs op by op on the CPU."""
    if _torch_hooks.has_cpu_kernel(op):
        return op
    from .trace import _wide_table

    decomposition = _wide_table().get(op)
    if decomposition is None:
        raise NotImplementedError(
            f"neuron: {op} cannot run on the device (it does not lower) nor on the host (the CPU has no kernel "
            f"for it and no decomposition is known). Called at {OPS.user_line()}. Register a decomposition for it "
            "(torch._decomp.register_decomposition) or avoid the op.")
    return decomposition


def _factory_on_host(op, args, kwargs):
    kwargs = dict(kwargs)
    index = _storage.device_index(kwargs.get("device"))
    if "device" in kwargs:
        kwargs["device"] = torch.device("cpu")
    result = op(*args, **kwargs)
    return tree_map(lambda v: from_host(v, index) if isinstance(v, torch.Tensor) else v, result)


def from_host(value: torch.Tensor, index: int = 0, addressed: bool = False) -> torch.Tensor:
    """A copy on ``neuron:index`` of a CPU tensor, with its strides when it is laid out densely
    (``channels_last``). ``addressed``: as ``storage.new_tensor``'s (a copy ``.to`` makes)."""
    COUNTS["host_copies"] += 1
    value = value.detach()
    order = _storage.memory_order(value.shape, value.stride())
    if order is not None:
        return new_tensor(value.shape, value.dtype, _storage.host_to_buffer(value.permute(order), index),
                          stride=value.stride(), addressed=addressed, index=index)
    return new_tensor(value.shape, value.dtype, _storage.host_to_buffer(value, index) if value.numel() else None,
                      addressed=addressed, index=index)


def _flat_tensors(args, kwargs) -> list:
    """The call's tensors in the order ``opkernel.Leaves`` visits them (positional, then kwargs)."""
    return [v for v in tree_leaves((list(args), list(kwargs.values()))) if isinstance(v, torch.Tensor)]


@functools.lru_cache(maxsize=None)
def _writes(op) -> bool:
    """The op's schema marks an argument written (an in-place or ``out=`` op)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def _written_positions(op, args, kwargs) -> list[int]:
    """Positions (among the call's tensors, flattened) of the arguments the schema marks written."""
    positions, index = [], 0
    schema_args = op._schema.arguments
    for position, argument in enumerate(schema_args):
        if argument.kwarg_only:
            value = kwargs.get(argument.name, argument.default_value if argument.has_default_value() else None)
        elif position < len(args):
            value = args[position]
        else:
            value = kwargs.get(argument.name)
        count = (1 if isinstance(value, torch.Tensor) else
                 sum(isinstance(v, torch.Tensor) for v in value) if isinstance(value, (list, tuple)) else 0)
        if argument.alias_info is not None and argument.alias_info.is_write:
            positions.extend(range(index, index + count))
        index += count
    return positions


# --- writing into neuron tensors ---------------------------------------------------------

def whole(tensor: torch.Tensor, data) -> bool:
    """``tensor`` covers its whole storage, contiguously from element 0, in the storage's dtype."""
    return (tensor.dtype is data.dtype and tensor.storage_offset() == 0 and tensor.is_contiguous()
            and tensor.numel() == data.numel)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a neuron ``dst`` and a CPU ``src`` (broadcast and cast like copy_)."""
    if dst.numel() == 0:
        return
    host = src.detach().to(dst.dtype).expand(dst.shape).contiguous()
    index = dst.device.index
    buffer = _storage.host_to_buffer(host, index)
    COUNTS["host_copies"] += 1
    data = _storage.data_of(dst)
    if whole(dst, data):
        data.set(buffer)
    else:
        OPS.dispatch(aten.copy_.default, (dst, new_tensor(dst.shape, dst.dtype, buffer, index=index)), {})


def resize_(tensor: torch.Tensor, size, memory_format=None) -> torch.Tensor:
    size = tuple(size)
    data = _storage.data_of(tensor)
    if data.dtype is not tensor.dtype:  # sizes below count elements of the tensor's dtype
        retype(data, tensor.dtype)
    stride = (_storage.contiguous_strides(size) if memory_format in (None, torch.contiguous_format, torch.preserve_format)
              else torch.empty(size, device="meta", memory_format=memory_format).stride())
    offset = tensor.storage_offset()
    needed = _storage.storage_extent(size, stride, offset)
    if needed > data.numel:
        # growing keeps the old elements first, as resize_ does
        old = to_host(tensor.as_strided((data.numel,), (1,), 0)) if data.buffer is not None else None
        data.numel = needed
        if old is not None:
            grown = torch.zeros(needed, dtype=data.dtype)
            grown[: old.numel()] = old
            data.set(_storage.host_to_buffer(grown, tensor.device.index))
        else:
            data.set(None)
    storage = tensor.untyped_storage()
    if not storage.resizable() and needed * data.dtype.itemsize > storage.nbytes():
        # an addressed storage has a fixed size: the tensor moves to a larger one holding the same data
        moved = _storage.new_tensor(size, tensor.dtype, stride=stride, offset=offset, addressed=True,
                                    index=tensor.device.index)
        storage = moved.untyped_storage()
        storage._neuron = data
    return _torch_hooks.place(tensor, storage, offset, size, stride)
