"""The reference executor: StableHLO compiled and run by XLA through jaxlib's PJRT CPU client.

Design notes
------------
* We talk to a PJRT CPU client of our own made by ``jaxlib.xla_client``, not
  to ``jax.numpy``: jax canonicalizes int64 to int32 unless
  ``jax_enable_x64`` is on, and flipping that global behind the user's back is
  not ours to do.
  ``_jax.dlpack_managed_tensor_to_buffer`` builds a PJRT buffer from a DLPack
  capsule *without* that canonicalization, so int64 token ids stay int64, and it
  shares memory with the torch tensor (zero copy on the CPU).
* jaxlib's C++ imports ``jax`` (about 0.3 s) the first time it wraps a DLPack
  tensor or returns a result. XLA's compile and deserialize release the GIL, so
  each runs while that import goes on in a thread (``_while_importing_jax``),
  which hides all or part of it (0.25 s of a GPT-2 cold start here).
* Outputs come back through DLPack too (``torch.from_dlpack``): the torch tensor
  keeps the XLA buffer alive, no copy.
* An ``XlaExecutable`` knows nothing about torch.fx or Dynamo; it takes the
  StableHLO text (or a serialized executable) and a list of tensors. The
  backend decides which graph inputs and outputs reach it.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import jaxlib
import torch
from jaxlib import _jax, xla_client
from torch.utils.dlpack import from_dlpack as _from_capsule

from . import distributed as collectives
from .devices import env_flag, local_device_count, queues_eager_ops
from .lapack import ready_lapack
from .xla_logs import quiet_runtime_logs

__all__ = ["XlaExecutable", "XlaCompileError", "platform_description"]


class XlaCompileError(RuntimeError):
    """XLA refused to compile a StableHLO module."""


_client_lock = threading.Lock()
_CLIENT = None
_ASYNCHRONOUS = False  # how _CLIENT dispatches (asynchronous(), read when it is made)
_HOST_CLIENT = None  # CPU tensors' executables (_host_client)
_HOST_DEVICE = None


# --- memory mappings: the kernel's limit on them bounds the executables a process can hold ---------------

# Each XLA CPU executable holds 3 to 10 memory mappings of its own (its JIT code and data), and Linux refuses
# a process more than vm.max_map_count of them (65,530 by default). Past that the next mmap inside XLA fails
# and XLA's error path crashes the process (SIGSEGV, no message): PyTorch's test_modules.py did so at 64,552.
# Whoever holds executables for reuse bounds them by count; ``mapping_pressure`` is the measured check
# behind those bounds, for what holds more than they foresee.
MAPPINGS_HIGH = 0.75  # the share of the limit past which ``mapping_pressure`` reports
MAPPINGS_EVERY = 256  # executables made between two counts of the process's mappings
_MADE = 0  # executables made in this process (compiled, loaded, or loaded again on another device)
_counted_at = 0


def _made_one() -> None:
    global _MADE
    _MADE += 1


def mappings() -> tuple[int, int] | None:
    """(memory mappings this process holds, the kernel's limit on them), or None where Linux's /proc does not
    say (another OS)."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            limit = int(f.read())
        count = 0
        with open("/proc/self/maps", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                count += chunk.count(b"\n")
    except (OSError, ValueError):
        return None
    return count, limit


def mapping_pressure(force: bool = False) -> tuple[int, int] | None:
    """(mappings, limit) when this process holds more than ``MAPPINGS_HIGH`` of the kernel's limit on memory
    mappings, else None. Counted once per ``MAPPINGS_EVERY`` executables made (a count reads /proc/self/maps:
    milliseconds at tens of thousands of mappings); ``force``: count now."""
    global _counted_at
    if not force and _MADE - _counted_at < MAPPINGS_EVERY:
        return None
    _counted_at = _MADE
    counted = mappings()
    if counted is None or counted[0] <= MAPPINGS_HIGH * counted[1]:
        return None
    return counted


def asynchronous() -> bool:
    """Whether the device's client returns from an execution before XLA has run it (PJRT's asynchronous
    CPU client: the work goes to XLA's threads, its results are buffers that a host read, a
    ``block_until_ready`` or a later execution consuming them waits for).

    On (the default) while the device queues and fuses its eager ops (``device/op_queue.py``): the host then
    issues the next ops, a step's optimizer included, while XLA computes a fused run. Off with
    ``NEURON_LAUNCH_BLOCKING=1`` (every op completes where it is issued, for debugging) and with eager
    fusion off (``NEURON_COMPILE_EAGER_FUSION=0``: op by op, as before); ``NEURON_COMPILE_ASYNC_DISPATCH``
    =0/1 decides alone where set. Read once, when the client is made. Executables run on CPU tensors
    (``torch.compile`` on the host) use a synchronous client of their own (``_host_client``) either way:
    their caller waits for the results at once, and an asynchronous client's hand-off to its worker thread
    cost those calls 30-50 us each (a 2-layer MLP: about 150 us against 100 us)."""
    if os.environ.get("NEURON_COMPILE_ASYNC_DISPATCH") is not None:
        return env_flag("NEURON_COMPILE_ASYNC_DISPATCH", False)
    return queues_eager_ops()


def is_asynchronous() -> bool:
    """Whether the device's client (made now if it is not yet) dispatches asynchronously: ``asynchronous()``
    as read when the client was made."""
    _client()
    return bool(_ASYNCHRONOUS)


def _client():
    """The process's PJRT CPU client for the device's buffers and executables (``asynchronous()`` says how
    it dispatches). Made under a lock: two threads compiling their first graphs at once must not make two
    clients, whose buffers and executables do not mix."""
    global _CLIENT, _ASYNCHRONOUS
    if _CLIENT is None:
        with _client_lock:
            if _CLIENT is None:
                quiet_runtime_logs()  # PJRT logs two INFO lines when a client starts
                # one PJRT CPU device per neuron device index (runtime/devices.py: NEURON_DEVICE_COUNT, or
                # one per torchrun local rank); neuron:i's buffers live on device i
                _ASYNCHRONOUS = asynchronous()  # decided once: the client's, whatever the environment says later
                _CLIENT = xla_client.make_cpu_client(asynchronous=_ASYNCHRONOUS, num_devices=local_device_count())
    return _CLIENT


def _host_client():
    """The client executables run on for CPU tensors (their buffers are the tensors' own memory, through
    DLPack): synchronous, since the caller waits for every result at once and inline dispatch is the
    shortest call (a small graph's latency). The device's client itself when that one is synchronous too."""
    global _HOST_CLIENT, _HOST_DEVICE
    if _HOST_CLIENT is None:
        client = _client()
        with _client_lock:
            if _HOST_CLIENT is None:
                if _ASYNCHRONOUS:
                    client = xla_client.make_cpu_client(asynchronous=False, num_devices=1)
                _HOST_DEVICE = client.local_devices()[0]
                _HOST_CLIENT = client
    return _HOST_CLIENT


def _host_device():
    if _HOST_DEVICE is None:
        _host_client()
    return _HOST_DEVICE


def synchronize() -> None:
    """Wait until XLA has run every execution dispatched so far on the device's client (an asynchronous
    client returns before): ``torch.neuron.synchronize()``'s last step."""
    if _ASYNCHRONOUS and _CLIENT is not None:
        for array in _CLIENT.live_arrays():
            array.block_until_ready()


@functools.lru_cache(maxsize=None)
def _device(index: int = 0):
    devices = _client().local_devices()
    if not 0 <= index < len(devices):
        raise RuntimeError(f"neuron device {index} is out of range: this process has {len(devices)} neuron "
                           f"device(s) (NEURON_DEVICE_COUNT sets how many)")
    return devices[index]


@functools.lru_cache(maxsize=None)
def _device_list(index: int = 0):
    return xla_client.DeviceList((_device(index),))


@functools.lru_cache(maxsize=None)
def _options_on(index: int):
    """Compile options that place a one-device executable on PJRT device ``index`` (a device list alone
    does not: XLA assigns replica 0 to device 0 unless the assignment says otherwise)."""
    import numpy as np

    options = xla_client.CompileOptions()
    options.device_assignment = xla_client.DeviceAssignment.create(np.array([[index]], dtype=np.int32))
    return options


def device_index_of(buffer) -> int:
    """The local device index a PJRT buffer lives on (its neuron device index)."""
    return buffer.device.id


_jax_lock = threading.Lock()
_jax_thread: threading.Thread | None = None


def _import_jax() -> None:
    try:
        importlib.import_module("jax")
    except Exception:  # the first hand-off imports it again and raises there, where it is ours to report
        pass


def _while_importing_jax(work):
    """``work()`` (an XLA call that releases the GIL) while jax imports on a thread, once per process.

    The first DLPack hand-off would import jax anyway. Every caller joins the
    thread before it returns, so no hand-off, which only follows a compile or a
    deserialize, ever meets a half-imported jax.
    """
    global _jax_thread
    with _jax_lock:
        if _jax_thread is None and "jax" not in sys.modules:
            _jax_thread = threading.Thread(target=_import_jax, name="neuron_compile-import-jax")
            _jax_thread.start()
        thread = _jax_thread
    try:
        return work()
    finally:
        if thread is not None:
            thread.join()


def _compile_options():
    return xla_client.CompileOptions()


@functools.lru_cache(maxsize=1)
def platform_description() -> dict:
    """What the executor runs on: a cache-key part and a manifest field."""
    client = _client()
    return {
        "platform": client.platform,
        "platform_version": client.platform_version,
        "device_kind": _device().device_kind,
        "jaxlib": jaxlib.__version__,
    }


_to_dlpack = torch._C._to_dlpack

# Devices whose tensors already live in this client's buffers (the ``neuron`` device registers itself):
# device type -> an adapter with ``to_buffer(tensor)`` (the tensor's own PJRT buffer, no copy),
# ``to_tensor(array)`` (a device tensor holding an XLA result), ``host_to_buffer(tensor)`` and
# ``to_host(array)`` (copies through PJRT's transfer API). An executable that runs on such a device
# takes its tensors' buffers as they are and returns device tensors; a CPU tensor crosses in or out
# by a transfer, as it would to memory that is not the host's.
DEVICE_ADAPTERS: dict = {}


def register_device_adapter(device_type: str, adapter) -> None:
    DEVICE_ADAPTERS[device_type] = adapter


def _adapter(device_type: str):
    adapter = DEVICE_ADAPTERS.get(device_type)
    if adapter is None:
        # a device made in Python registers its adapter at its first op; a compiled graph that makes the
        # device's tensors from none (factories alone) can come first: torch's device module readies it
        init = getattr(getattr(torch, device_type, None), "_lazy_init", None)
        if init is not None:
            init()
            adapter = DEVICE_ADAPTERS.get(device_type)
    if adapter is None:
        raise RuntimeError(f"a {device_type} tensor reached the XLA executor: only CPU tensors and "
                           f"tensors of {sorted(DEVICE_ADAPTERS) or 'no device'} can be its inputs")
    return adapter


def _to_buffer(tensor: torch.Tensor):
    if tensor.device.type != "cpu":
        return _adapter(tensor.device.type).to_buffer(tensor)
    return dlpack_buffer(tensor, _HOST_DEVICE or _host_device())


def input_converter(device: str):
    """How an executable that runs on ``device`` takes a tensor: as its buffer (a CPU tensor's memory on
    the host, a device tensor's own buffer); on a device, a CPU tensor (a 0-d scalar, a tensor the graph
    moves onto the device) crosses through the device's transfer API."""
    if device == "cpu":
        return _to_buffer
    host_to_buffer = _adapter(device).host_to_buffer

    def convert(tensor: torch.Tensor):
        return host_to_buffer(tensor) if tensor.device.type == "cpu" else _to_buffer(tensor)

    return convert


def result_converter(device: str, where: str):
    """How an XLA result of an executable that runs on ``device`` becomes a tensor on ``where`` (its
    device, or the host through the device's transfer API)."""
    if device == "cpu":
        return _to_tensor
    adapter = _adapter(device)
    return adapter.to_host if where == "cpu" else adapter.to_tensor


class DistributedBridge:
    """How an executable with collectives (on the distributed client, ``collectives.py``) takes and gives a
    device's tensors: a tensor's own buffer on the local client crosses to the distributed client's device
    through DLPack, and each result crosses back to the local device the inputs were on. Both clients are
    PJRT CPU clients of this process, so each crossing aliases the same host memory: no copy, no host
    transfer (a CPU input or output still crosses through the device's transfer API, counted)."""

    __slots__ = ("target", "adapter", "index")

    def __init__(self, target, device: str):
        self.target, self.adapter, self.index = target, _adapter(device), 0

    def to_buffer(self, tensor: torch.Tensor):
        if tensor.device.type == "cpu":
            return dlpack_buffer(tensor, self.target.device)
        self.index = tensor.device.index or 0  # the results go back where the inputs are
        return _across(self.adapter.to_buffer(tensor), self.target.device)

    def result(self, where: str):
        def convert(array):
            local = _across(array, _device(self.index))
            return self.adapter.to_host(local) if where == "cpu" else self.adapter.to_tensor(local)

        return convert


def _across(array, device):
    """``array`` as a buffer on ``device`` of another PJRT CPU client: the same memory, through DLPack."""
    return _jax.dlpack_managed_tensor_to_buffer(_jax.buffer_to_dlpack_managed_tensor(array), device, None, None, 1)


def reshaped_buffer(array, shape):
    """``array``'s elements at another ``shape`` (the same count, row-major): a buffer of the same host
    memory, through DLPack both ways (PJRT CPU buffers are never written in place, so sharing is safe; the
    new buffer keeps the old one's memory alive). A copy costs a compiled op; this, two DLPack crossings."""
    host = _from_capsule(_jax.buffer_to_dlpack_managed_tensor(array)).view(tuple(shape))
    return _jax.dlpack_managed_tensor_to_buffer(_to_dlpack(host), array.devices().pop(), None, None, 1)


def dlpack_buffer(tensor: torch.Tensor, device):
    """A PJRT buffer on ``device`` sharing a CPU tensor's memory where PJRT can."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    # Device type 1 is kDLCPU; copy=None lets PJRT alias the torch storage when
    # it is suitably aligned and copy otherwise. torch._C._to_dlpack skips the
    # Python checks of Tensor.__dlpack__ (2 us a tensor), which we made above.
    return _jax.dlpack_managed_tensor_to_buffer(_to_dlpack(tensor), device, None, None, 1)


def _to_tensor(array) -> torch.Tensor:
    # straight from the PJRT buffer to a DLPack capsule: no jax.Array method (and so no
    # `import jax`) on the way, and 8 us less per output than torch.from_dlpack(array)
    try:
        return _from_capsule(_jax.buffer_to_dlpack_managed_tensor(array))
    except Exception:
        if array.size != 0:
            raise
        # DLPack of a zero-size XLA buffer is not always exportable; nothing to share anyway.
        import numpy as np

        return torch.from_numpy(np.asarray(array).copy())


_REPLICAS = re.compile(r"mhlo\.num_replicas = (\d+)")


def replicas_of(stablehlo_text: str) -> int:
    """How many processes a module runs on: its ``mhlo.num_replicas`` (1 unless it holds collectives)."""
    found = _REPLICAS.search(stablehlo_text[:4096])
    return int(found.group(1)) if found else 1


@dataclass
class XlaExecutable:
    """One compiled XLA executable for a static-shape StableHLO module.

    ``target`` is None for the process's local client, or a
    ``collectives.DistributedTarget`` for a module of several replicas (one per
    torch.distributed rank), which compiles, loads and runs on that client.
    """

    loaded: object
    compile_seconds: float = 0.0
    _outputs: int | None = None  # how many results the executable has, learned on the first run
    target: object = None
    what: str = "the executable"  # names it in a distributed failure: its graph and collectives
    _on_devices: dict | None = None  # device index -> the same executable loaded on that PJRT device
    _on_host: object = None  # the same executable loaded on the host client (``loaded_on_host``)
    _serialized: bytes | None = None  # what it was loaded from (an executable loaded from bytes does not
    # serialize again into bytes that load: "Function wrapped_iota not found")
    # the StableHLO it was compiled from: the text, or a callable giving it (an artifact's portable bytecode,
    # decoded on first use): what fused runs of eager ops (neuron_compile.device.fusion) are built from
    source: object = field(default=None, repr=False)

    def __post_init__(self):
        _made_one()

    def stablehlo(self) -> str | None:
        """The StableHLO text this executable was compiled from, when it is known."""
        if callable(self.source):
            self.source = self.source()
        return self.source

    def loaded_on(self, index: int):
        """The executable loaded on PJRT device ``index`` (neuron:``index``'s buffers): device 0's is
        ``loaded``; another's is device 0's, serialized and loaded again with that device assigned (under a
        millisecond, once per device), so the artifact cache keeps one entry whatever the device."""
        if not index:
            return self.loaded
        if self.target is not None:
            raise RuntimeError(f"{self.what} runs on every rank's device 0 of the distributed client; "
                               f"it cannot run on neuron:{index}")
        if self._on_devices is None:
            self._on_devices = {}
        loaded = self._on_devices.get(index)
        if loaded is None:
            loaded = self._on_devices[index] = self._loaded_again(_client(), _device_list(index),
                                                                  _options_on(index))
        return loaded

    def _loaded_again(self, client, devices, options):
        """``loaded`` serialized (or the bytes it was loaded from) and loaded on ``client``'s ``devices``."""
        data = self._serialized if self._serialized is not None else _client().serialize_executable(self.loaded)
        loaded = client.deserialize_executable(data, devices, options)
        _made_one()
        return loaded

    @classmethod
    def compile(cls, stablehlo_text: str) -> "XlaExecutable":
        start = time.perf_counter()
        if "lapack_" in stablehlo_text:
            ready_lapack()
        replicas = replicas_of(stablehlo_text)
        target = collectives.target(replicas) if replicas > 1 else None
        try:
            if target is not None:
                loaded = _while_importing_jax(lambda: target.compile(stablehlo_text))
            else:
                loaded = _while_importing_jax(
                    lambda: _client().compile_and_load(stablehlo_text, _device_list(), _compile_options()))
        except Exception as exc:  # jaxlib raises XlaRuntimeError
            raise XlaCompileError(str(exc)) from exc
        return cls(loaded, time.perf_counter() - start, target=target, source=stablehlo_text)

    def serialize(self) -> bytes:
        if self.target is not None:
            return self.target.serialize(self.loaded)
        return bytes(_client().serialize_executable(self.loaded))

    @classmethod
    def deserialize(cls, data: bytes, replicas: int = 1) -> "XlaExecutable":
        start = time.perf_counter()
        if b"lapack_" in data:
            ready_lapack()
        if replicas > 1:
            target = collectives.target(replicas)
            loaded = _while_importing_jax(lambda: target.deserialize(data))
            return cls(loaded, time.perf_counter() - start, target=target)
        loaded = _while_importing_jax(lambda: _client().deserialize_executable(data, _device_list(), _compile_options()))
        return cls(loaded, time.perf_counter() - start, _serialized=bytes(data))

    def to_buffer(self, tensor: torch.Tensor):
        return _to_buffer(tensor) if self.target is None else dlpack_buffer(tensor, self.target.device)

    def loaded_on_host(self):
        """The executable loaded on the host client (``_host_client``: CPU tensors' buffers): ``loaded``
        where the device's client is that client, else ``loaded`` serialized and loaded there, once."""
        if self._on_host is None:
            client = _host_client()
            self._on_host = self.loaded if client is _client() else self._loaded_again(
                client, xla_client.DeviceList((_host_device(),)), _compile_options())
        return self._on_host

    def run_buffers(self, buffers: list, index: int | None = None) -> list:
        """Execute on PJRT buffers; returns one XLA array per output. ``index``: the PJRT device to run on
        (None: the first buffer's, device 0 with no buffer; CPU tensors' buffers run on the host client)."""
        if self.target is not None:
            return self.target.run(lambda: self._run(buffers), self.what)
        if index is None:
            if buffers:
                device = buffers[0].device
                if device is _HOST_DEVICE and _HOST_CLIENT is not _CLIENT:
                    return self._run(buffers, 0, self.loaded_on_host())
                index = device.id
            else:
                index = 0
        return self._run(buffers, index)

    def _run(self, buffers: list, index: int = 0, loaded=None) -> list:
        count = self._outputs
        if loaded is None:
            loaded = self.loaded if not index else self.loaded_on(index)
        if count is None:
            results = loaded.execute_sharded(buffers).disassemble_into_single_device_arrays()
            self._outputs = len(results)
        else:
            # the same arrays, 11 us sooner per call here (jaxlib 0.10.2): the full disassembly goes
            # through a slower path than the prefix one, even when the prefix is every output
            results = loaded.execute_sharded(buffers).disassemble_prefix_into_single_device_arrays(count)
        return [per_device[0] for per_device in results]

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_to_tensor(a) for a in self.run_buffers([self.to_buffer(t) for t in tensors])]


to_buffer = _to_buffer
to_tensor = _to_tensor


class PersistentBuffers:
    """PJRT buffers of the tensors that stay the same from call to call (parameters), made once.

    Converting every parameter on every call dominates small graphs (6 us per
    tensor against 5 us for the whole XLA execute). A buffer is reused only if
    it is provably current: the same tensor object (a weak reference, so a
    recycled ``id`` never matches), the same storage address and the same
    version counter, which every in-place update (an optimizer step, ``p.data``
    surgery, ``copy_``) bumps. Anything else is converted afresh. Only
    parameters and other leaves that require grad are kept: activations change
    every call and holding on to them would only keep memory alive. An
    executable on a device also keeps its 0-d CPU inputs (``keep_host_inputs``):
    each is a transfer to the device, and a scalar a model on a device hands its
    graph from the host is a constant; a larger CPU tensor crosses every call (a
    write through ``.data`` or a numpy array behind it does not bump its version).
    """

    __slots__ = ("_entries", "_convert", "_keep_host")

    def __init__(self, convert=None, keep_host_inputs: bool = False):
        self._entries: dict[int, tuple] = {}
        self._convert = convert or _to_buffer  # a distributed executable's buffers live on its own client
        self._keep_host = keep_host_inputs

    def get(self, position: int, tensor: torch.Tensor):
        entry = self._entries.get(position)
        if entry is not None:
            ref, version, pointer, buffer = entry
            if ref() is tensor and tensor._version == version and tensor.data_ptr() == pointer:
                return buffer
        buffer = self._convert(tensor)
        # a device tensor is its buffer already, and its data_ptr() tells nothing: never kept (so the
        # device check stays off the path of a kept parameter, taken every call)
        if tensor.device.type == "cpu" and ((self._keep_host and tensor.dim() == 0)
                                            or isinstance(tensor, torch.nn.Parameter)
                                            or (tensor.requires_grad and tensor.is_leaf)):
            self._entries[position] = (weakref.ref(tensor), tensor._version, tensor.data_ptr(), buffer)
        return buffer
