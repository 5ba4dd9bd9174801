"""Where a neuron tensor's data lives: one PJRT buffer per storage, on the executor's one client.

A neuron tensor is a plain ``torch.Tensor`` whose storage's Python object
carries a ``Data``: the storage's element type, its length in elements and a
PJRT buffer (``None`` until something is written: ``torch.empty`` allocates
nothing). Views, ``.data``, ``detach()`` and ``nn.Parameter`` share the storage
object, so they share the ``Data``; an in-place op replaces ``Data.buffer`` and
every view sees the new value. A ``view(dtype)`` shares it too: a tensor that
reaches an op in a dtype other than its storage's has the storage's bytes
reinterpreted first (``transfers.retype``: one bitcast on the device; ``retype``
here, through the host, for a bool view), so a write through either dtype
reaches the other.

A storage made from Python (``torch.UntypedStorage(n, device="neuron")``,
``storage.clone()``, which ``copy.deepcopy`` of a tensor calls) is made here
(``new_storage``, ``clone_storage``): torch would make it with a C++ allocator
that a Python backend cannot register. A clone shares the buffer, which is
immutable: a copy that costs nothing.

The buffer is kept in the shape of whatever wrote the whole storage last; a
tensor whose size, stride and offset are not that shape's is read through a
view computed inside the op's executable (``ops``). A storage made for a
tensor laid out densely in another order (``channels_last``: the strides CPU
gives the result) holds its elements in memory order: the buffer is the
tensor permuted by ``memory_order``.

Data crosses to the host only here, through PJRT's transfer API
(``batched_device_put``, ``_single_device_array_to_np_array_did_copy``), never
by aliasing host memory: the same code serves a client whose memory is not the
host's.
"""

from __future__ import annotations

import collections
import functools

import torch

from .. import _profiler_hooks
from . import _torch_hooks, ordinals
from . import op_queue as _op_queue
from .op_queue import Pending as _Pending

class _Counters:
    """Bytes of the live buffers and their peak; bytes allocated and freed since the last reset."""

    __slots__ = ("live", "peak", "allocated", "freed", "recorder")

    def __init__(self):
        self.live = self.peak = self.allocated = self.freed = 0
        self.recorder = None  # memory._History while torch.neuron.memory._record_memory_history() records


_memory = _Counters()


class Data:
    """The contents of one neuron storage.

    ``_buffer`` is a PJRT buffer, None (nothing written yet), or an ``op_queue.Pending``: the result of an
    op still in the device's queue. Reading ``buffer`` runs the queue first when the value is pending (a
    host copy, a collective, anything outside the queue sees op-by-op's order); the queue itself reads
    ``_buffer``."""

    __slots__ = ("_buffer", "dtype", "numel", "nbytes", "__weakref__")

    def __init__(self, dtype: torch.dtype, numel: int, buffer=None):
        self.nbytes = 0
        self.dtype, self.numel, self._buffer = dtype, numel, None
        if buffer is not None:
            self.set(buffer)

    @property
    def buffer(self):
        buffer = self._buffer
        if buffer.__class__ is _Pending:
            buffer = self._buffer = buffer.result()
        return buffer

    def set(self, buffer) -> None:
        # the counters are updated under the GIL, without a lock: this runs once per op result
        nbytes = self.numel * self.dtype.itemsize if buffer is not None else 0
        memory = _memory
        if memory.recorder is not None:  # torch.neuron.memory records stacks (memory.py)
            memory.recorder.on_set(self, nbytes)
        memory.live += nbytes - self.nbytes
        memory.allocated += nbytes
        memory.freed += self.nbytes
        if memory.live > memory.peak:
            memory.peak = memory.live
        self._buffer, self.nbytes = buffer, nbytes

    def __del__(self, memory=_memory):
        # ``memory`` is bound here: at interpreter exit this module's globals may already be None; a Data
        # that never finished ``__init__`` (made by a tracer) holds nothing
        nbytes = getattr(self, "nbytes", 0)
        if memory.recorder is not None and nbytes:
            memory.recorder.on_free(self)
        memory.live -= nbytes
        memory.freed += nbytes


def memory_stats() -> dict:
    """What the device knows of its memory, in ``torch.cuda.memory_stats``'s nested form: the bytes its
    buffers hold (current, peak, allocated and freed since the last reset). Nothing is cached: a buffer
    is freed when its last tensor dies, so the reserved bytes are the allocated ones."""
    memory = _memory
    held = {"all": {"current": memory.live, "peak": memory.peak, "allocated": memory.allocated,
                    "freed": memory.freed}}
    return {"allocated_bytes": held, "reserved_bytes": held}


def memory_allocated() -> int:
    return _memory.live


def max_memory_allocated() -> int:
    return _memory.peak


def reset_peak_memory_stats() -> None:
    _memory.peak = _memory.live


def reset_accumulated_memory_stats() -> None:
    _memory.allocated = _memory.freed = 0


def data_of(tensor: torch.Tensor) -> Data:
    storage = tensor.untyped_storage()
    try:
        return storage._neuron
    except AttributeError:
        raise RuntimeError(f"a neuron tensor of shape {tuple(tensor.shape)} has no data: it was not made by "
                           "neuron_compile's device") from None


def own_buffer(tensor: torch.Tensor, data: Data):
    """The storage's buffer when ``tensor`` is exactly it (same dtype and shape, contiguous, offset 0):
    what an executable can take as is; None when the tensor must be read through a view."""
    buffer = data.buffer
    return buffer if is_whole_buffer(tensor, data, buffer) else None


def is_whole_buffer(tensor: torch.Tensor, data: Data, buffer) -> bool:
    """``tensor`` is exactly ``buffer`` (its storage's buffer, or a queued op's pending result: both have
    a shape): same dtype and shape, contiguous, offset 0."""
    return (buffer is not None and data.dtype is tensor.dtype and buffer.shape == tensor.shape
            and not tensor.storage_offset() and tensor.is_contiguous())


def contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def memory_order(shape, stride) -> tuple | None:
    """The dims from outermost to innermost in memory when ``stride`` lays a tensor out densely, without
    overlap, in another order than the contiguous one (``channels_last``...): ``tensor.permute(order)`` is
    then contiguous, its elements the storage's in order. None for a contiguous layout (size-1 dims'
    strides do not count, as for ``is_contiguous``), for one with gaps or overlaps, and for no elements."""
    order = dense_order(shape, stride)
    if order is None:
        return None
    moving = [d for d in order if shape[d] != 1]
    return None if moving == sorted(moving) else order


def dense_order(shape, stride) -> tuple | None:
    """The dims from outermost to innermost in memory when ``stride`` lays ``shape``'s elements out densely
    without overlap (the contiguous layout included); None otherwise, and for no elements."""
    shape, stride = tuple(shape), tuple(stride)
    if 0 in shape:
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))  # stable: ties keep their order
    step = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != step:
            return None
        step *= shape[d]
    return order


def storage_extent(shape, stride, offset: int = 0) -> int:
    """Elements a storage needs to hold a tensor of this size, stride and offset."""
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def new_tensor(shape, dtype: torch.dtype, buffer=None, stride=None, offset: int = 0,
               addressed: bool = False, index: int = 0) -> torch.Tensor:
    """A neuron tensor on ``neuron:index``, on a fresh storage holding ``buffer`` (on PJRT device ``index``,
    or nothing yet). ``addressed``: the storage gets an address and a size of its own
    (``_torch_hooks.addressed_tensor``), as a factory's result must: a model's parameters and buffers are
    made by factories and copies. A tensor on a device other than 0 is always addressed (torch's one
    constructor of an unaddressed device tensor makes it on ``neuron:0``)."""
    shape = tuple(shape)
    if addressed or index:
        stride = contiguous_strides(shape) if stride is None else tuple(stride)
        numel = storage_extent(shape, stride, offset)
        tensor = _torch_hooks.addressed_tensor(shape, stride, offset, numel * dtype.itemsize, dtype, index)
    elif stride is None and not offset:
        tensor = _torch_hooks.empty_tensor(shape, dtype)
        numel = tensor.numel()
    else:
        numel = storage_extent(shape, stride, offset)
        tensor = _torch_hooks.empty_tensor((numel,), dtype)
        _torch_hooks.meta_redispatch(torch.ops.aten.set_.source_Storage_storage_offset, tensor,
                                     tensor.untyped_storage(), offset, shape, stride)
    tensor.untyped_storage()._neuron = Data(dtype, numel, buffer)
    return tensor


def device_index(device) -> int:
    """The neuron device index a factory's ``device=`` names (the current device when it names none, as on
    CUDA), checked against the device count: an index out of range is an error naming it."""
    if device is None:
        return ordinals.current_device()
    device = torch.device(device)
    if device.type != "neuron" or device.index is None:
        return ordinals.current_device()
    return ordinals.check_index(device.index)


def check_device(device) -> None:
    if device is not None:
        device_index(device)


# --- storages made from Python (``_torch_hooks.make_storages_with``) ---------------------------

def new_storage(nbytes: int, device=None) -> torch.UntypedStorage:
    """``torch.UntypedStorage(nbytes, device="neuron")``: an addressed storage of ``nbytes`` bytes that
    reads as zeros until written (torch leaves a new storage's bytes undefined)."""
    index = device_index(device)
    if nbytes < 0:
        raise RuntimeError(f"torch.UntypedStorage(): a storage of {nbytes} bytes (a size must be at least 0)")
    storage = _torch_hooks.addressed_storage(nbytes, index)
    storage._neuron = Data(torch.uint8, nbytes)
    return storage


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """``storage.clone()`` (and so ``copy.deepcopy`` of a tensor): a new addressed storage holding the
    same buffer. Buffers are immutable (a write gives its storage a new one), so sharing one is a copy;
    the size is the data's, which an op's result storage does not report (its ``nbytes()`` is 0)."""
    data = storage_data(storage)
    copy = _torch_hooks.addressed_storage(max(storage.nbytes(), data.numel * data.dtype.itemsize),
                                          storage.device.index or 0)
    copy._neuron = Data(data.dtype, data.numel, data.buffer)
    return copy


def byteswap_storage(storage: torch.UntypedStorage, element_size: int) -> None:
    """``storage.byteswap(dtype)``: reverse the bytes of each ``element_size``-byte element, on a host copy
    (torch's C++ kernel would dereference the storage's address, which is not memory)."""
    data = storage_data(storage)
    if data.buffer is None or element_size == 1:
        return
    host = buffer_to_host(data.buffer, data.dtype).reshape(-1).view(torch.uint8)
    swapped = host.reshape(-1, element_size).flip(1).reshape(-1)
    data.set(host_to_buffer(swapped.view(data.dtype).reshape(data.buffer.shape), data.buffer.device.id))


def storage_data(storage: torch.UntypedStorage) -> Data:
    try:
        return storage._neuron
    except AttributeError:
        raise RuntimeError(f"a neuron storage of {storage.nbytes()} bytes has no data: it was not made by "
                           "neuron_compile's device (a slice of a neuron storage is not supported)") from None


# --- host <-> device -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _put_parts(index: int = 0):
    import jax
    import jax.core
    from jax.sharding import SingleDeviceSharding
    from jaxlib import _jax

    from neuron_compile.runtime.executor import _device

    device = _device(index)
    # jax turns 64-bit values into 32-bit ones unless x64 is on: on for our transfers only, never globally
    return device, SingleDeviceSharding(device), jax.core.ShapedArray, _jax, jax.enable_x64


def _numpy_dtype(dtype: torch.dtype):
    if dtype == torch.bfloat16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    return torch.empty((), dtype=dtype).numpy().dtype


def host_to_buffer(tensor: torch.Tensor, index: int = 0):
    if _profiler_hooks.STATE._is_profiler_enabled:  # torch.profiler records: a neuron::host_to_device event
        with _profiler_hooks.event("neuron::host_to_device", (tensor,), {"bytes": tensor.numel() * tensor.element_size()}):
            return _host_to_buffer(tensor, index)
    return _host_to_buffer(tensor, index)


def _host_to_buffer(tensor: torch.Tensor, index: int = 0):
    """Copy a CPU tensor into a new PJRT buffer of its shape on PJRT device ``index`` (``neuron:index``'s;
    PJRT's transfer API: a real copy)."""
    tensor = tensor.detach().resolve_conj().resolve_neg().contiguous()
    if tensor.dtype == torch.bfloat16:
        array = tensor.view(torch.int16).numpy().view(_numpy_dtype(torch.bfloat16))
    else:
        array = tensor.numpy()
    return _put(array, index)


def _put(array, index: int = 0, aval=None, wide: bool = True):
    """A numpy array into a new PJRT buffer on device ``index`` (PJRT's transfer API: a copy); ``aval`` its
    ShapedArray where the caller keeps one, ``wide`` whether jax's x64 must be on (64-bit elements)."""
    device, sharding, shaped, _jax, x64 = _put_parts(index)
    if aval is None:
        aval = shaped(array.shape, array.dtype)
    semantics = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
    if wide:
        with x64(True):
            return _jax.batched_device_put(aval, sharding, [array], [device], True, True, semantics)
    return _jax.batched_device_put(aval, sharding, [array], [device], True, True, semantics)


# Python numbers a 0-d buffer takes straight from numpy, as ``torch.tensor(value, dtype=dtype)`` converts them (one
# rounding to the dtype): (numpy dtype, the number types taken, whether the transfer needs jax's x64 on). Half
# types are left to torch, which rounds a double through float32
_NUMBERS = {torch.float32: ("float32", (float, int), False), torch.float64: ("float64", (float, int), True),
            torch.int64: ("int64", (int,), True), torch.int32: ("int32", (int,), False),
            torch.bool: ("bool", (bool,), False)}
_SHAPED: dict = {}  # numpy dtype name -> the 0-d ShapedArray of the transfer


def scalar_buffer(value, dtype: torch.dtype, index: int = 0):
    """A 0-d buffer holding the Python number ``value`` as ``dtype`` on PJRT device ``index``: what
    ``host_to_buffer(torch.tensor(value, dtype=dtype))`` makes, without the tensor on the way (a runtime
    float, a view's offset: measured 13.4 us that way, 4.5 us this one)."""
    import numpy as np

    number = _NUMBERS.get(dtype)
    array = None
    # (numpy warns where a float overflows float32, where torch makes an infinity; NaN, an int past int64's
    # range and the other dtypes go through torch too, for its values and errors)
    if (number is not None and value.__class__ in number[1] and not _profiler_hooks.STATE._is_profiler_enabled
            and (dtype is not torch.float32 or -3.4028234663852886e38 <= value <= 3.4028234663852886e38)):
        try:
            array = np.asarray(value, number[0])
        except OverflowError:
            pass
    if array is None:
        return host_to_buffer(torch.tensor(value, dtype=dtype), index)
    aval = _SHAPED.get(number[0])
    if aval is None:
        aval = _SHAPED[number[0]] = _put_parts(index)[2]((), array.dtype)
    return _put(array, index, aval, number[2])


def buffer_to_host(buffer, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor with a copy of a PJRT buffer's contents. Like a device-to-host copy on CUDA it
    synchronizes: every op queued before it runs first (``op_queue``), whether or not it computes this
    buffer, so a loop's runs start again at the same op each step (a ``loss.item()`` whose value an
    earlier run computed would otherwise leave the backward queued into the next step's run). Inside
    ``op_queue.unqueued()`` (an index check's read of resident values) the queue is left as it is."""
    _op_queue.COUNTS["host_reads"] += 1
    if (_op_queue._RECORDS or _op_queue._CHECKS) and not _op_queue.beside():
        _op_queue.settle()
    if _profiler_hooks.STATE._is_profiler_enabled:  # a neuron::device_to_host event
        with _profiler_hooks.event("neuron::device_to_host", None, {"bytes": buffer.size * dtype.itemsize}):
            return _buffer_to_host(buffer, dtype)
    return _buffer_to_host(buffer, dtype)


def resident_extremes(tensor: torch.Tensor, exempt: int | None = None, low: int = 0) -> tuple[int, int] | None:
    """The smallest and largest of an integer neuron tensor's values (``exempt`` ones counted as ``low``), read
    where its storage's buffer lies: no device op, and no copy of the storage where the client's memory is the
    host's (PJRT's transfer API says whether it copied). For index checks, which run beside the device's
    queue: the buffer must be resident (not a queued op's pending result), and nothing is flushed. None where
    the storage is read in another dtype (the caller takes the general way)."""
    import numpy as np

    data = data_of(tensor)
    buffer = data._buffer
    if data.dtype is not tensor.dtype or buffer is None or not tensor.numel():
        return None
    if buffer.__class__ is _Pending:  # a queued op's result whose run has run, or not yet, or failed
        buffer = buffer.value
        if buffer is None or not hasattr(buffer, "_single_device_array_to_np_array_did_copy"):
            return None
    array = _host_array(buffer)[0]
    if array.shape == tensor.shape and tensor.is_contiguous() and not tensor.storage_offset():
        view = array  # the tensor is its storage's buffer (ids, labels)
    else:
        flat = np.ascontiguousarray(array).reshape(-1)  # (the buffer's own array is C-ordered: a view)
        view = np.ndarray(tuple(tensor.shape), flat.dtype, flat, tensor.storage_offset() * flat.itemsize,
                          tuple(st * flat.itemsize for st in tensor.stride()))
    if exempt is not None:
        view = np.where(view == exempt, low, view)
    return int(view.min()), int(view.max())  # read while the buffer is held (the array may alias it)


def buffer_number(buffer, dtype: torch.dtype):
    """The one element of a one-element buffer as a Python number (``.item()``): ``buffer_to_host``'s copy
    (and its synchronization) without a tensor made on the way; None for a dtype whose numbers numpy gives
    back otherwise than torch (``_NUMBERS`` lists those it gives alike)."""
    if dtype not in _NUMBERS:
        return None
    _op_queue.COUNTS["host_reads"] += 1
    if (_op_queue._RECORDS or _op_queue._CHECKS) and not _op_queue.beside():
        _op_queue.settle()
    if _profiler_hooks.STATE._is_profiler_enabled:  # a neuron::device_to_host event
        with _profiler_hooks.event("neuron::device_to_host", None, {"bytes": dtype.itemsize}):
            return _number(buffer)
    return _number(buffer)


def _number(buffer):
    return _host_array(buffer)[0].reshape(-1)[0].item()  # read while the buffer is held (the array may alias it)


def _host_array(buffer):
    """``buffer``'s elements as a numpy array, and whether PJRT copied them: where it did not, the array is the
    buffer's own memory, to be read only while the buffer is held and never written."""
    with _put_parts()[4](True):
        try:
            return buffer._single_device_array_to_np_array_did_copy()
        except Exception as exc:
            if type(exc).__name__ != "XlaRuntimeError":
                raise
            # XLA ran the executable after the op returned (runtime/executor.asynchronous): its failure
            # surfaces at this read, where the op's name is no longer known
            raise RuntimeError("neuron: an operation computing this value failed when XLA ran it, after it was "
                               "issued (the device's ops run asynchronously). Rerun with NEURON_LAUNCH_BLOCKING=1 "
                               f"to raise where the failing op is issued, naming it. XLA said: {exc}") from exc


def _buffer_to_host(buffer, dtype: torch.dtype) -> torch.Tensor:
    import numpy as np

    array, did_copy = _host_array(buffer)
    if not did_copy or not array.flags.writeable:
        array = np.array(array)
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if dtype == torch.bool and array.dtype != np.bool_:
        array = array.astype(np.bool_)
    return torch.from_numpy(array)


def zeros_buffer(numel: int, dtype: torch.dtype, index: int = 0):
    """Zeros for a storage never written (an executable reads it: ``contiguous()``'s or an ``out=``'s fresh
    destination, every call): the kept ``shared_constant`` up to 4 MiB, a new buffer above."""
    buffer = shared_constant(numel, dtype, 0, index)
    return buffer if buffer is not None else host_to_buffer(torch.zeros(numel, dtype=dtype), index)


_CONSTANTS: collections.OrderedDict = collections.OrderedDict()  # (numel, dtype, index, repr(value)) -> buffer
_CONSTANT_BYTES, _CONSTANTS_BYTES = 4 << 20, 64 << 20  # the largest one kept, and all of them together
_constants_held = 0


def shared_constant(numel: int, dtype: torch.dtype, value, index: int = 0, shape: tuple | None = None):
    """A buffer of ``numel`` copies of ``value`` that storages may share, or None above 4 MiB: PJRT buffers
    are never written in place (an op's results are new buffers), so a storage filled whole takes this
    one, with no executable run and nothing allocated (``torch.zeros``, ``ones``, ``full``, autograd's zero
    gradients of a model's unused outputs and its ones for ``loss.backward()``, each step). The most
    recently used are kept, up to 64 MiB of them.

    ``shape``: the buffer's shape (flat by default), the filled tensor's where it covers its storage
    contiguously: an op then reads the storage as its own buffer, not through a reshape, and may take it
    in place (donation: an optimizer's moments made by ``zeros_like``, a static KV cache's ``zeros``)."""
    global _constants_held
    nbytes = numel * dtype.itemsize
    if nbytes > _CONSTANT_BYTES:
        return None
    shape = (numel,) if shape is None else tuple(shape)
    key = (shape, dtype, index, repr(value))
    buffer = _CONSTANTS.pop(key, None)
    if buffer is None:
        buffer = host_to_buffer(torch.full(shape, value, dtype=dtype), index)
        _constants_held += nbytes
    _CONSTANTS[key] = buffer
    while _constants_held > _CONSTANTS_BYTES:
        (_, d, _, _), old = _CONSTANTS.popitem(last=False)
        _constants_held -= old.size * d.itemsize
    return buffer


def retype(data: Data, dtype: torch.dtype) -> None:
    """Reinterpret a storage's bytes as ``dtype``, through the host (``transfers.retype`` does it on the device
    where it can). A tail shorter than one ``dtype`` element is padded with zero bytes, so that no byte
    is lost (the storage grows by less than one element)."""
    nbytes = data.numel * data.dtype.itemsize
    numel = -(-nbytes // dtype.itemsize)
    if data.buffer is None:
        data.dtype, data.numel = dtype, numel
        return
    host = buffer_to_host(data.buffer, data.dtype).reshape(-1).view(torch.uint8)
    if dtype == torch.bool and bool((host > 1).any()):
        raise RuntimeError(f"a bool view of {data.dtype} data whose bytes are not all 0 or 1: the device's bool "
                           "elements hold 0 or 1 only (the bytes would change); compare instead (x != 0)")
    if numel * dtype.itemsize != nbytes:
        host = torch.cat([host, host.new_zeros(numel * dtype.itemsize - nbytes)])
    data.dtype, data.numel = dtype, numel
    data.set(host_to_buffer(host.view(dtype), data.buffer.device.id))


@functools.lru_cache(maxsize=None)
def torch_dtype(numpy_dtype) -> torch.dtype:
    import numpy as np

    if str(numpy_dtype) == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype=numpy_dtype)).dtype


def resize_storage(storage, nbytes: int):
    """``storage.resize_(nbytes)`` on a neuron storage, as FSDP2 uses it: ``resize_(0)`` frees the data (the
    PJRT buffer; the storage keeps its extent, since torch may skip the resize back when the byte size
    it reads already matches), any other size resizes a storage that holds no data."""
    data = getattr(storage, "_neuron", None)
    if data is None:
        raise RuntimeError("resize_ of a neuron storage that was not made by neuron_compile's device")
    numel = int(nbytes) // data.dtype.itemsize
    if nbytes == 0:
        data.set(None)
    elif data.buffer is None:
        data.numel = numel
    elif numel != data.numel:
        raise NotImplementedError(f"resize_ of a neuron storage holding data from {data.numel} to {numel} "
                                  f"elements of {data.dtype} (only freeing, resize_(0), and resizing an "
                                  "empty storage are supported)")
    return storage
