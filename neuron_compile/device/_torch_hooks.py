"""Every private or experimental torch API the ``neuron`` device stands on, and nothing else.

torch 2.13 has no public way to make a device in Python. What we use (each checked by
``tests/test_device_hooks.py``, which fails loudly if torch changes it):

* ``torch.utils.backend_registration._setup_privateuseone_for_python_backend``: renames PrivateUse1 to
  ``neuron``, generates ``Tensor.neuron()`` and friends, registers the device module, a Python hook and a
  device guard;
* ``torch._C._acc.create_empty_tensor``: a plain ``torch.Tensor`` on ``neuron:0`` with a 0-byte storage, whose
  Python storage object carries our PJRT buffer;
* ``OpOverload.redispatch`` (and its ``_handle.redispatch_boxed``) to the Meta key: view ops change metadata
  only;
* ``torch.UntypedStorage.__new__`` (over ``torch._C.StorageBase.__new__``), ``clone``, ``new`` and
  ``_byteswap``: storages of the device made from Python (``copy.deepcopy`` of a tensor clones its storage),
  which torch would make with a C++ allocator a Python backend cannot register;
* ``torch._C._dispatch_has_computed_kernel_for_dispatch_key``: whether an op can run on host copies;
* ``torch._C._construct_storage_from_data_pointer``: a storage with a unique, never dereferenced address, so
  ``data_ptr()`` tells storages apart;
* the dispatcher's keyset and exclude guards, to run autocast kernels;
* ``Tensor._reduce_ex_internal`` (``torch.save`` through a CPU copy, as for XLA),
  ``torch.serialization.register_package`` (``map_location="neuron"``), ``torch._tensor_str._tensor_str``
  (printing from one CPU copy, as for XLA);
* a PrivateUse1 kernel of ``aten::_has_compatible_shallow_copy_type`` (what ``.data =`` and ``Module.to``
  ask): CPU and neuron tensors are compatible, as CPU and CUDA ones are;
* the ``torch._C._accelerator_*`` bindings behind ``torch.accelerator.synchronize`` and its memory functions
  (a Python backend can register neither the device guard's synchronize nor a C++ ``DeviceAllocator`` they
  need);
* ``torch._TorchCompileInductorWrapper.__call__``: what ``torch.compile(model)`` with no backend named
  (Inductor) runs; a graph on neuron tensors goes to our backend instead (torch 2.13 has no public hook for a
  device's default compiler);
* for ``collectives/process_group.py``: ``Backend.register_backend`` (extended API: a
  ``_DistributedBackendOptions``) with a creator returning a Python ``ProcessGroup`` subclass, which torch
  makes the whole group, reached from C++ through the ``PyProcessGroup`` trampoline;
  ``torch.distributed._Work`` subclasses (``wait``, ``get_future`` through ``PyWork``); the option structs of
  ``torch._C._distributed_c10d``; ``UntypedStorage.resize_`` (FSDP2 frees storages; torch sends PrivateUse1's
  to a C++ hook Python cannot implement); ``torch._C._ForceDispatchKeyGuard`` (an op traced from inside
  DTensor's dispatch); ``torch._dynamo.disable`` (C++ calls our Python inside a compiled region; Dynamo's skip
  folders for the whole compile stack are ``neuron_compile/dynamo_skips.py``'s).
"""

from __future__ import annotations

import contextlib
import functools
import operator

import torch

NAME = "neuron"
PRIVATE_KEY = "PrivateUse1"
AUTOCAST_KEY = "AutocastPrivateUse1"

META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def setup_backend(backend_module) -> None:
    """Rename PrivateUse1 to ``neuron`` and register the module, hook and guard torch expects."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME, backend_module=backend_module, hook=_Hook(),
                                            device_guard=_Guard())


class _Hook(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def backward_on_calling_thread() -> None:
    """Run this thread's backward passes on the thread itself (``torch.autograd.set_multithreading_enabled(False)``,
    a thread-local setting). The autograd engine keeps one worker queue per device index of each device type,
    as many as the device guard's ``deviceCount()``, which the Python guard of ``torch/csrc/acc`` fixes at 1:
    a backward on ``neuron:1`` tripped the engine's internal assert (``device_ready_queues_``). With
    multithreading off, the engine runs every node in the caller's queue, as it does for CPU tensors."""
    torch._C._set_multithreading_enabled(False)


def empty_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor on ``neuron:0`` with no data (its storage is ours to fill; other devices'
    tensors are made by ``addressed_tensor``)."""
    tensor = torch._C._acc.create_empty_tensor(list(shape), dtype)
    if 0 in shape and len(shape) > 1:  # it strides a zero-size dim 0 (2x0x3: (0, 3, 1)); CPU's: (3, 3, 1)
        strides = torch.empty(tuple(shape), device="meta").stride()
        meta_redispatch(torch.ops.aten.set_.source_Storage_storage_offset, tensor, tensor.untyped_storage(), 0,
                        list(shape), list(strides))
    return tensor


def meta_redispatch(op, *args, **kwargs):
    """Run ``op``'s Meta kernel on neuron tensors: a view op makes a neuron view of the same storage."""
    return op.redispatch(META, *args, **kwargs)


def meta_redispatcher(op):
    """``meta_redispatch`` for one op: its boxed call, without ``OpOverload.redispatch``'s two frames."""
    return functools.partial(op._handle.redispatch_boxed, META)


_next_address = 1 << 44


def addressed_tensor(shape, stride, offset: int, nbytes: int, dtype: torch.dtype, index: int = 0) -> torch.Tensor:
    """A neuron tensor on a storage of ``nbytes`` at a fake address of its own (never dereferenced: our
    data is in PJRT), so that ``data_ptr()`` and ``untyped_storage().nbytes()`` tell storages apart as
    on CUDA (safetensors and transformers' ``save_pretrained`` find tied weights by them). Such a
    storage is not resizable: the Meta ``set_`` takes it only at an empty size, then ``as_strided_``
    (which checks the bounds) gives the tensor its shape. About 10 us, against 1 us for
    ``empty_tensor``: kept for tensors made by factories and copies, not every op result."""
    fresh = empty_tensor((0,), dtype) if not index else meta_redispatch(torch.ops.aten.alias.default,
                                                                        _seed(index, dtype))
    return place(fresh, addressed_storage(nbytes, index), offset, shape, stride)


def addressed_storage(nbytes: int, index: int = 0) -> torch.UntypedStorage:
    """A ``neuron:index`` storage of ``nbytes`` at a fake address of its own (``addressed_tensor``), not
    resizable."""
    global _next_address
    address = _next_address
    _next_address += (nbytes + 127) // 64 * 64  # 64-byte aligned and at least 64 bytes apart
    return torch._C._construct_storage_from_data_pointer(address, _device(index), nbytes)


@functools.lru_cache(maxsize=None)
def _device(index: int = 0) -> torch.device:
    return torch.device(NAME, index)  # only once PrivateUse1 is renamed


# --- tensors on neuron:1, neuron:2... ---------------------------------------------------------
# ``torch._C._acc.create_empty_tensor`` makes its tensors on ``neuron:0`` only, and the Meta ``set_`` refuses
# a storage of another device than the tensor's. One tensor per device index is made through DLPack:
# torch's ``fromDLPack`` maps DLPack's ``kDLExtDev`` to PrivateUse1 (``getATenDevice`` in
# ``aten/src/ATen/DLConvertor.cpp``) and wraps the data pointer with ``from_blob``, allocating nothing and
# dispatching to no kernel of ours. That seed holds no elements at a fake address (never dereferenced);
# every other tensor of the index is a Meta ``alias`` of it, ``set_`` onto a storage of its own.

_DLPACK_EXT_DEV = 12  # DLDeviceType kDLExtDev
_SEEDS: list = []  # the DLPack structs behind the seeds: kept for the life of the process


def _dlpack_types():
    import ctypes

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                    ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("byte_offset", ctypes.c_uint64)]

    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    class DLManagedTensor(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", deleter)]

    return ctypes, DLDevice, DLDataType, DLTensor, DLManagedTensor, deleter


@functools.lru_cache(maxsize=None)
def _seed(index: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An empty tensor on ``neuron:index`` of ``dtype`` (see above): what new tensors of that index alias."""
    if dtype is not torch.float32:
        return meta_redispatch(torch.ops.aten.view.dtype, _seed(index, torch.float32), dtype)  # no elements: any dtype
    ctypes, DLDevice, DLDataType, DLTensor, DLManagedTensor, deleter = _dlpack_types()
    shape, strides = (ctypes.c_int64 * 1)(0), (ctypes.c_int64 * 1)(1)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(ctypes.c_void_p(1 << 40), DLDevice(_DLPACK_EXT_DEV, index), 1,
                                 DLDataType(2, 32, 1), shape, strides, 0)  # float32, shape (0,)
    managed.manager_ctx, managed.deleter = None, deleter()  # nothing to free: the struct lives on
    _SEEDS.append((managed, shape, strides))
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    tensor = torch._C._from_dlpack(capsule_new(ctypes.addressof(managed), b"dltensor", None))
    backward_on_calling_thread()
    if tensor.device != torch.device(NAME, index):
        raise RuntimeError(f"torch's DLPack import made a tensor on {tensor.device} for neuron:{index}: "
                           "torch changed how it maps DLPack's kDLExtDev to PrivateUse1")
    return tensor


def place(tensor: torch.Tensor, storage: torch.UntypedStorage, offset: int, shape, stride) -> torch.Tensor:
    """``tensor.set_(storage, offset, shape, stride)`` through the Meta kernels, for any neuron storage:
    the Meta ``set_`` takes a storage that is not resizable only at an empty size, so such a storage is
    set at size 0 first and ``as_strided_`` (which checks the bounds) gives the shape."""
    set_ = torch.ops.aten.set_.source_Storage_storage_offset
    if storage.resizable():
        return meta_redispatch(set_, tensor, storage, offset, tuple(shape), tuple(stride))
    meta_redispatch(set_, tensor, storage, 0, (0,), (1,))
    return meta_redispatch(torch.ops.aten.as_strided_.default, tensor, tuple(shape), tuple(stride), offset)


def make_storages_with(new_storage, clone_storage, byteswap_storage) -> None:
    """Storages of the device made from Python: ``torch.UntypedStorage(n, device="neuron")`` is
    ``new_storage(n, device)``, ``storage.clone()`` ``clone_storage(storage)``, ``storage.new()``
    ``new_storage(0)``, ``storage._byteswap(size)`` ``byteswap_storage(storage, size)``.

    torch makes a device's storage with the device's C++ allocator (``c10::GetAllocator``), which a
    Python backend cannot register: PrivateUse1's is null, and each of these dereferenced it (a
    segfault), as ``_byteswap`` dereferences the storage's (fake) address. Every Python path that makes
    a storage for a device goes through them: ``Tensor.__deepcopy__`` and ``copy.copy``/``deepcopy`` of a
    storage (``clone``), ``storage.to(device=...)``, ``TypedStorage(..., device=...)`` and
    ``_new_shared`` (the constructor). A sequence (``torch.UntypedStorage([1, 2], device="neuron")``)
    is checked and converted by torch's CPU constructor, then copied over."""
    storage_class = torch.UntypedStorage
    if getattr(storage_class.__new__, "_neuron", False):
        return
    construct = torch._C.StorageBase.__new__  # THPStorage_pynew
    clone, new, byteswap = storage_class.clone, storage_class.new, storage_class._byteswap

    def __new__(cls, *args, device=None, **kwargs):
        if device is None or torch.device(device).type != NAME:
            return construct(cls, *args, device=device, **kwargs)
        if cls is not storage_class or kwargs or len(args) > 1:
            raise TypeError(f"{cls.__name__}(*args, device={str(device)!r}, **{kwargs}): a neuron storage is "
                            "made as torch.UntypedStorage(), (size) or (sequence), with device= only")
        if not args:
            return new_storage(0, device)
        try:
            size = operator.index(args[0])
        except TypeError:  # not a size: a sequence of bytes
            host = construct(cls, args[0])
            return new_storage(host.nbytes(), device).copy_(host)
        return new_storage(size, device)

    def clone_(self):
        return clone_storage(self) if self.device.type == NAME else clone(self)

    def new_(self):
        return new_storage(0) if self.device.type == NAME else new(self)

    def _byteswap(self, element_size):
        return byteswap_storage(self, element_size) if self.device.type == NAME else byteswap(self, element_size)

    __new__._neuron = True
    storage_class.__new__ = staticmethod(__new__)
    for name, fn in (("clone", clone_), ("new", new_), ("_byteswap", _byteswap)):
        fn.__name__, fn.__doc__ = name, getattr(storage_class, name).__doc__
        setattr(storage_class, name, fn)


def has_cpu_kernel(op) -> bool:
    """Whether the dispatcher has something to run ``op`` with on CPU tensors (its own CPU kernel, a
    composite, a fallback): ``_thnn_fused_lstm_cell`` has CUDA's only."""
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), "CPU")


def fallback_library(handler) -> torch.library.Library:
    """Send every ATen op that has no neuron kernel of its own to ``handler(op, *args, **kwargs)``."""
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(handler, PRIVATE_KEY)
    return lib


def exclude_autocast():
    """A guard under which autocast kernels call through to the backend (as C++ autocast kernels do)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))


def save_through_cpu() -> None:
    """``torch.save`` a neuron tensor as PyTorch saves an XLA one: a CPU copy plus the device it came
    from, rebuilt by ``torch._utils._rebuild_device_tensor_from_cpu_tensor`` (which honours
    ``map_location`` and is allowed under ``weights_only=True``). torch takes that path only for
    tensors without a storage; ours have one (it carries the PJRT buffer)."""
    original = torch.Tensor._reduce_ex_internal
    if getattr(original, "_neuron", False):
        return

    def _reduce_ex_internal(self, proto):
        if self.device.type == NAME:
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.cpu(), self.dtype, str(self.device), self.requires_grad))
        return original(self, proto)

    _reduce_ex_internal._neuron = True
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal


class _AutocastLibrary:
    """Autocast kernels for ``AutocastPrivateUse1``, over a fallthrough for every other op."""

    def __init__(self):
        self._fallthrough = torch.library.Library("_", "IMPL")
        self._fallthrough.fallback(torch.library.fallthrough_kernel, AUTOCAST_KEY)
        self._kernels = torch.library.Library("aten", "IMPL")

    def impl(self, op, fn, key):
        self._kernels.impl(op, fn, key)


def autocast_library() -> _AutocastLibrary:
    return _AutocastLibrary()


def load_onto_device() -> None:
    """``torch.load(..., map_location="neuron")``: restore a storage onto the device by copying its bytes
    into a neuron tensor. torch's generic path makes ``torch.UntypedStorage(n, device="neuron")``, which
    needs a C++ allocator we do not have (it segfaults)."""
    import torch.serialization as serialization

    def tag(obj):
        return None  # what we save is a CPU copy (save_through_cpu): torch's own tags apply

    def restore(obj, location):
        if not str(location).startswith(NAME):
            return None
        host = torch.empty(0, dtype=torch.uint8).set_(obj.cpu() if obj.device.type != "cpu" else obj)
        return host.to(torch.device(location)).untyped_storage()  # an index out of range raises there

    serialization.register_package(5, tag, restore)


# the backends torch lets ``tensor.data = other`` cross between (``TensorImpl::has_compatible_shallow_copy_type``)
_DENSE_DEVICES = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", NAME})


def data_moves_across_devices() -> torch.library.Library:
    """``tensor.data = other`` between a CPU (or any dense) tensor and a neuron one, as between CPU and CUDA.

    ``Variable.set_data`` (the ``.data`` setter) and ``nn.Module._apply`` ask the op
    ``aten::_has_compatible_shallow_copy_type``, whose composite kernel admits only CPU, CUDA and a few
    other dense backends (a fixed list in ``TensorImpl``) and refuses PrivateUse1: ``p.data =
    p.to("neuron")`` raised "incompatible tensor type", FSDP2 failed moving parameters to the current
    accelerator, and ``Module.to("neuron")`` made new Parameter objects. torch's documented way out
    (``TensorImpl.h``; PyTorch's OpenReg backend does it) is a PrivateUse1 kernel of that op: ours gives
    the dense rule with ``neuron`` in the list. Then ``Module.to`` moves each parameter in place as for
    CUDA (``param.data = ...``: same object, tied weights stay tied, ``.grad`` moved too)."""
    def _has_compatible_shallow_copy_type(self, other) -> bool:
        return (self.layout == other.layout == torch.strided
                and self.device.type in _DENSE_DEVICES and other.device.type in _DENSE_DEVICES)

    library = torch.library.Library("aten", "IMPL")
    library.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, PRIVATE_KEY)
    return library


def print_through_cpu() -> None:
    """Format a neuron tensor's values from one CPU copy, as torch does for XLA: printing runs a dozen
    ops (abs, isfinite, masked_select...) on the tensor, each of which would be compiled for the device.
    The suffixes (``device='neuron:0'``, ``grad_fn=...``) still come from the neuron tensor."""
    import torch._tensor_str as tensor_str

    original = tensor_str._tensor_str
    if getattr(original, "_neuron", False):
        return

    def _tensor_str(self, indent):
        if self.device.type == NAME:
            self = self.detach().cpu()
        return original(self, indent)

    _tensor_str._neuron = True
    tensor_str._tensor_str = _tensor_str


def route_default_compiler(compiler) -> None:
    """``torch.compile(model)`` (backend "inductor", the default) compiles a graph that holds a tensor on
    ``neuron`` with ``compiler(gm, example_inputs, inductor_config=...)``; every other graph still goes to Inductor.

    torch 2.13 offers a device no public way to choose its default compiler: Inductor's
    ``register_backend_for_device`` plugs a device into Inductor's own code generation (a scheduling
    and a wrapper codegen per device), not a whole-graph compiler. ``torch.compile`` wraps the
    "inductor" name in ``_TorchCompileInductorWrapper`` and calls it with Dynamo's graph, so that
    call is where the graph's device is known. Inductor cannot compile a neuron graph at all (it
    fails with ``KeyError: 'neuron'``), so nothing that worked is taken away. Inductor's options and
    mode do not apply to our compiler: they are passed on so that it can say it ignores them.

    A graph is on ``neuron`` when an input is, or when it makes a neuron tensor from no neuron input
    (MPT's alibi bias: factories with ``device=neuron``): Dynamo records each node's fake value under
    ``node.meta["example_value"]``.
    """
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    if getattr(original, "_neuron", False):
        return

    def on_device(value) -> bool:
        if isinstance(value, (tuple, list)):
            return any(map(on_device, value))
        return isinstance(value, torch.Tensor) and value.device.type == NAME

    def __call__(self, model_, inputs_, *args, **kwargs):
        if on_device(list(inputs_)) or any(on_device(n.meta.get("example_value")) for n in model_.graph.nodes):
            return compiler(model_, inputs_, inductor_config=self.config)
        return original(self, model_, inputs_, *args, **kwargs)

    __call__._neuron = True
    __call__.__doc__ = original.__doc__
    wrapper.__call__ = __call__


# the bindings torch.accelerator's functions call (torch/accelerator/__init__.py and memory.py), and the
# device module function that answers each for neuron
ACCELERATOR_BINDINGS = {
    "_accelerator_setDeviceIndex": "set_device",
    "_accelerator_getDeviceIndex": "current_device",
    "_accelerator_exchangeDevice": "_exchange_device",
    "_accelerator_maybeExchangeDevice": "_exchange_device",
    "_accelerator_synchronizeDevice": "synchronize",
    "_accelerator_isAllocatorInitialized": None,
    "_accelerator_getDeviceStats": "memory_stats_as_nested_dict",
    "_accelerator_emptyCache": "empty_cache",
    "_accelerator_emptyHostCache": None,
    "_accelerator_resetPeakStats": "reset_peak_memory_stats",
    "_accelerator_resetAccumulatedStats": "reset_accumulated_memory_stats",
    "_accelerator_getMemoryInfo": "mem_get_info",
}


def route_accelerator_to(backend_module) -> None:
    """``torch.accelerator.synchronize()`` and its memory functions (``memory_allocated``, ``memory_stats``,
    ``empty_cache``, ``get_memory_info``...) answer from the device module when the accelerator is neuron.

    torch 2.13's C++ behind them (``torch/csrc/DeviceAccelerator.cpp``) asks the device guard to
    synchronize (the Python ``DeviceGuard`` of ``torch._C._acc`` does not implement it: "Backend doesn't
    support synchronizing all streams on device") and ``c10::GetAllocator`` for a ``DeviceAllocator``
    (none a Python backend can register: an internal assert; ``emptyHostCache`` segfaults). torch's
    The current device index (``set_device_index``, ``current_device_index``, ``device_index``) goes the
    same way: the Python device guard's ``setDevice`` is a no-op and its ``getDevice`` always 0
    (``torch/csrc/acc``), so ``set_device_index(1)`` was accepted and forgotten. torch's
    Python functions call these bindings through ``torch._C`` on every call, so they are what is
    replaced: device-index parsing and ``memory_stats``' flattening stay torch's own. Any other
    accelerator still reaches the original binding."""
    for binding, function in ACCELERATOR_BINDINGS.items():
        original = getattr(torch._C, binding)
        if getattr(original, "_neuron", False):
            continue
        answer = getattr(backend_module, function) if function else _accelerator_default(binding)
        routed = functools.partial(_route_accelerator, original, answer)
        routed._neuron = True
        setattr(torch._C, binding, routed)


def _accelerator_default(binding):
    if binding == "_accelerator_isAllocatorInitialized":
        return lambda: True  # our memory counters are there from the start
    return lambda: None  # emptyHostCache: no pinned-memory cache (``pin_memory_as_copy``)


def _route_accelerator(original, answer, *args):
    accelerator = torch._C._accelerator_getAccelerator()
    if accelerator is not None and accelerator.type == NAME:
        return answer(*args)
    return original(*args)


# --- torch.distributed (``collectives/process_group.py``) ----------------------------------------------------
# ``Backend.register_backend`` is torch's (experimental) third-party backend API; with
# ``extended_api=True`` the creator gets a ``_DistributedBackendOptions`` (store, group_rank,
# group_size, timeout, group_id, global_ranks_in_group). A creator that returns a Python
# ``ProcessGroup`` subclass makes that object the whole group (``_new_process_group_helper``'s
# "subclass of ProcessGroup" branch): its Python methods are the collectives, reached from C++
# (DDP's reducer, ``_broadcast_coalesced``) through the ``PyProcessGroup`` trampoline; a Python
# ``Work`` (``torch.distributed._Work``) is reached through ``PyWork`` (``wait``, ``get_future``).
# The option structs (``AllgatherOptions``...) live in ``torch._C._distributed_c10d``.

# (``object`` in a torch built without distributed: the classes exist, ``register`` registers nothing)
PythonWork = getattr(torch.distributed, "_Work", object)
PythonProcessGroup = getattr(torch.distributed, "ProcessGroup", object)


def register_process_group_backend(name: str, creator, devices) -> None:
    """``init_process_group(name)``: ``creator(options, backend_options)`` builds the group; ``name`` is also
    the default backend of the device ``name`` (``init_process_group()`` with the accelerator ``name``)."""
    backend = torch.distributed.Backend
    if backend._plugins.get(name.upper()) is not None:
        return
    backend.register_backend(name, creator, extended_api=True, devices=list(devices))


def backend_options(options) -> tuple:
    """(store, rank, size, timeout, group name, global ranks) from a ``_DistributedBackendOptions``."""
    return (options.store, options.group_rank, options.group_size, options.timeout, options.group_id,
            options.global_ranks_in_group)


def run_eagerly(fn):
    """``fn`` wrapped so that Dynamo never compiles its frame, even when C++ calls it from inside a compiled
    function (``torch._dynamo.disable``; importing Dynamo costs about a second, paid at the first process
    group: DDP and FSDP2 import it anyway)."""
    import torch._dynamo

    return torch._dynamo.disable(fn)


def collective_options(kind: str):
    """A fresh ``torch._C._distributed_c10d.<kind>Options()`` (``AllgatherOptions`` is not in torch.distributed)."""
    return getattr(torch._C._distributed_c10d, f"{kind}Options")()


def resize_storage_through(handler) -> None:
    """``storage.resize_(nbytes)`` on a neuron storage calls ``handler(storage, nbytes)``. torch sends it to
    ``PrivateUse1HooksInterface::resizePrivateUse1Bytes``, which a Python backend cannot implement
    (``torch._C._acc.PrivateUse1Hooks`` has is_available, has_primary_context and is_built only); FSDP2
    frees and re-allocates each unsharded parameter's storage with it (``_fsdp_param.free_storage``)."""
    original = torch.UntypedStorage.resize_
    if getattr(original, "_neuron", False):
        return

    def resize_(self, size):
        if self.device.type == NAME:
            return handler(self, size)
        return original(self, size)

    resize_._neuron = True
    resize_.__doc__ = original.__doc__
    torch.UntypedStorage.resize_ = resize_


def pin_memory_as_copy() -> None:
    """``Tensor.pin_memory()`` when it pins for the neuron device (``DataLoader(pin_memory=True)``,
    Trainer's default ``dataloader_pin_memory``): a copy in ordinary host memory.

    torch pins through a host allocator that only a C++ ``PrivateUse1HooksInterface`` can provide
    (``getPinnedMemoryAllocator``; without it every pin raises); our transfers go through PJRT from
    any host memory, so page-locked memory would buy nothing. ``is_pinned()`` stays False: the copy
    is not pinned."""
    original = torch.Tensor.pin_memory
    if getattr(original, "_neuron", False):
        return

    def pin_memory(self, device=None):
        if device is None:
            accelerator = torch.accelerator.current_accelerator()
            for_neuron = accelerator is not None and accelerator.type == NAME
        else:
            for_neuron = torch.device(device).type == NAME
        if for_neuron and self.device.type == "cpu":
            return self.clone()
        return original(self) if device is None else original(self, device)

    pin_memory._neuron = True
    pin_memory.__doc__ = original.__doc__
    torch.Tensor.pin_memory = pin_memory


# the dispatcher's thread-local key sets of top-level code (this module is imported by ``import torch``)
_PLAIN_DISPATCH = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


def plain_dispatch():
    """A guard under which the dispatcher's thread-local include and exclude sets are top-level code's.
    An op reaching the device from inside a tensor subclass's ``__torch_dispatch__`` (DTensor runs the
    local op so: FSDP2's optimizer step) comes with every key above the backend excluded, Functionalize
    and PythonTLSSnapshot included: ``make_fx`` under ``functionalize`` would then trace nothing. Anywhere
    else (inference mode, autocast) the sets are left as they are."""
    if not torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Functionalize):
        return contextlib.nullcontext()
    return torch._C._ForceDispatchKeyGuard(*_PLAIN_DISPATCH)


# the in-place collective ops every C++ ``ProcessGroup`` (gloo's...) sends its collectives through
# (``torch/csrc/distributed/c10d/Ops.cpp``: one kernel per device type, CPU's calls the group's CPU backend)
C10D_COLLECTIVES = ("allreduce_", "allreduce_coalesced_", "broadcast_", "allgather_", "_allgather_base_",
                    "allgather_into_tensor_coalesced_", "allgather_coalesced_", "reduce_scatter_",
                    "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "reduce_", "gather_", "scatter_",
                    "alltoall_base_", "alltoall_", "send", "recv_", "recv_any_source_", "barrier")

CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def collectives_on_device_through(handler) -> torch.library.Library | None:
    """A C++ process group's collectives on neuron tensors call ``handler(op, *args, **kwargs)``.

    ``init_process_group("gloo")`` builds a C++ ``ProcessGroup`` whose only backends are for CPU (and
    CUDA); its methods call the dispatcher ops ``c10d::allreduce_``..., whose PrivateUse1 kernels ask the
    group for a PrivateUse1 backend, which gloo is not: "No backend type associated with device type
    neuron". Ours replace those kernels (torch registers them in C++; ``torch.library`` overrides them, with a
    warning we silence), so DDP's reducer and FSDP2 on neuron tensors over a gloo group reach ``handler``,
    which runs the CPU kernel (``redispatch_cpu``) on host copies. A Python ``ProcessGroup`` subclass (our
    ``NeuronProcessGroup``) overrides the methods and never reaches these ops."""
    if not torch.distributed.is_available():
        return None
    import warnings

    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for name in C10D_COLLECTIVES:
            op = getattr(torch.ops.c10d, name).default
            library.impl(name, functools.partial(handler, op), PRIVATE_KEY)
    return library


def redispatch_cpu(op, *args, **kwargs):
    """``op``'s CPU kernel (the group's CPU backend: gloo) on host tensors."""
    return op.redispatch(CPU_KEYS, *args, **kwargs)
