"""An eager op at one signature: the call's tensors and storages (``Leaves``), and its compiled kernel.

``Leaves`` walks a call's arguments once: the tensors, the storages they read
(one slot each), 0-d CPU tensors taken as scalars, runtime floats, and the
parts of the signature (``parts``) that select a kernel, and the offsets of
views read at run time (``offsets``: a view's storage offset is an input of
the executable, not part of the signature, unless the op writes through it).
``OpKernel`` runs one executable on the slots' PJRT buffers and turns its
results into neuron tensors and new storage contents.
"""

from __future__ import annotations

import math
import zlib
from sys import getrefcount as _getrefcount

import torch

from . import op_queue as _op_queue
from . import run_offsets as _run_offsets
from . import storage as _storage
from .op_queue import Pending as _Pending
from .storage import Data, new_tensor
from .trace import RUNTIME, runtime_float

_create_empty_tensor = torch._C._acc.create_empty_tensor  # a neuron:0 tensor with no data (storage.new_tensor)

# op_compiles: kernels built by tracing (their executables may still come from the artifact cache);
# index_hits: kernels found in the persistent op index (no tracing); op_cache_hits: calls served from memory
# index_checks: index tensors read on the host to check their bounds (bounds.py)
COUNTS = {"op_compiles": 0, "index_hits": 0, "op_cache_hits": 0, "host_ops": 0, "host_copies": 0,
          "index_checks": 0, "kernels_dropped": 0, "mapping_releases": 0}


class MixedDeviceError(RuntimeError):
    pass


# --- signatures ------------------------------------------------------------------------------

def _scalar_part(value):
    if isinstance(value, float):
        return (float, repr(value))
    if isinstance(value, (bool, int, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format)):
        return (type(value), value)
    if isinstance(value, complex):
        return (complex, repr(value))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise NotImplementedError("symbolic scalars reach the neuron device only through torch.compile")
    return (type(value), repr(value))


class Leaves:
    """The tensors of one call, in argument order, and the storages they read."""

    __slots__ = ("tensors", "datas", "slots", "host", "parts", "device_seen", "mixed", "floats", "two_dtypes",
                 "retypes", "offsets", "index", "sizes")

    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.datas: list[Data] = []  # one per storage slot
        self.slots: dict[int, int] = {}  # storage identity -> slot
        self.host: list[torch.Tensor] = []  # 0-d CPU tensors (scalars, as CUDA takes them)
        self.parts: list = []
        self.device_seen = False
        self.mixed = None  # a CPU tensor that is not a 0-d scalar
        self.floats: list[float] = []  # runtime float arguments (trace.runtime_float), in order
        self.two_dtypes = False  # a storage read as two dtypes (one slot has one dtype): run on the host
        self.retypes: list = []  # (Data, dtype): storages to reinterpret before the op (then walk again)
        # views read at a run-time offset (the executable's ("offset", k) inputs): [part index, tensor, offset]
        self.offsets: list = []
        self.index = None  # the neuron device index of the first neuron tensor (where the op runs)
        self.sizes = None  # a bucketed kernel's true sizes (``lengths``): a buffer, its ("sizes",) input

    def visit(self, value):
        if isinstance(value, torch.Tensor):
            # get_device(): the index of a tensor on an accelerator, -1 on the CPU or meta (``device.type``
            # builds a string each call: a third of this walk's cost on a warm op)
            index = value.get_device()
            if index >= 0 and (not _ACCELERATORS or value.device.type == "neuron"):
                if self.index != index:
                    if self.index is None:
                        self.index = index
                    elif self.mixed is None:
                        self.mixed = value  # another neuron device: an error, as across CUDA devices
                self.device_seen = True
                storage = value.untyped_storage()
                ident = storage._cdata
                slot = self.slots.get(ident)
                seen = slot is not None
                if not seen:
                    slot = self.slots[ident] = len(self.datas)
                    try:
                        self.datas.append(storage._neuron)
                    except AttributeError:
                        raise RuntimeError("a neuron tensor without data reached an op") from None
                data = self.datas[slot]
                dtype = value.dtype
                if data.dtype is not dtype or self.retypes:
                    # the dtype the slot's first reader wants (``ops.dispatch`` reinterprets the storage
                    # before the op); a second reader in another dtype sends the op to the host
                    first = next((dt for d, dt in self.retypes if d is data), data.dtype)
                    if first is not dtype:
                        if seen:
                            self.two_dtypes = True
                        else:
                            self.retypes.append((data, dtype))
                buffer = data._buffer  # a queued op's pending result too: its shape is known (op_queue)
                shape = value.shape
                # the storage's whole buffer (storage.is_whole_buffer, inlined: this runs for every tensor
                # of every op)
                if (buffer is not None and data.dtype is dtype and buffer.shape == shape
                        and not value.storage_offset() and value.is_contiguous()):
                    self.parts.append((dtype, shape, slot))
                else:
                    offset = value.storage_offset()
                    stride = value.stride()
                    if 1 in shape:  # a size-1 dim's stride addresses nothing (a view's may hold a length)
                        stride = tuple(0 if n == 1 else st for n, st in zip(shape, stride))
                    # a view of fewer elements than its storage may sit anywhere in it: its offset is an
                    # input of the executable, not part of the signature (pin_written: unless the op writes
                    # through it). Offset 0 too, so that a loop's first slice shares the kernel of the rest
                    if offset or value.numel() < data.numel:
                        self.offsets.append([len(self.parts), value, offset])
                        offset = RUNTIME
                    self.parts.append((dtype, shape, stride, offset, slot,
                                       data.numel if buffer is None else buffer.shape))
                self.tensors.append(value)
                return
            if value.dim() == 0 and not value.requires_grad:
                self.host.append(value)
                self.tensors.append(value)
                self.parts.append(("host", value.dtype))
                return
            self.mixed = value
            self.tensors.append(value)
            self.parts.append(("cpu", value.dtype, value.shape))
            return
        if isinstance(value, (list, tuple)):
            self.parts.append(("[",))
            for item in value:
                self.visit(item)
            self.parts.append(("]",))
            return
        if runtime_float(value):
            self.parts.append(_FLOAT)
            self.floats.append(value)
            return
        self.parts.append(_scalar_part(value))

    def pin_written(self, positions) -> None:
        """An op that writes storages: views of those read at their offsets as constants of the executable
        (its graph writes through them; only reads take a run-time offset)."""
        written = {self.slots.get(self.tensors[p].untyped_storage()._cdata) for p in positions
                   if self.tensors[p].device.type == "neuron"}
        kept = []
        for entry in self.offsets:
            index, _, offset = entry
            part = self.parts[index]
            if part[4] in written:
                self.parts[index] = part[:3] + (offset,) + part[4:]
            else:
                kept.append(entry)
        self.offsets = kept


_FLOAT = ("f",)
# accelerators other than ours this torch build has (a CUDA build): a tensor's get_device() then does not
# say it is a neuron tensor, its device's type does
_ACCELERATORS = torch.backends.cuda.is_built() or hasattr(torch, "xpu") and torch.xpu._is_compiled()


def leaves_of(args, kwargs) -> Leaves:
    leaves = Leaves()
    visit = leaves.visit
    for value in args:
        visit(value)
    if kwargs:
        for name, value in kwargs.items():
            leaves.parts.append(name)
            visit(value)
    return leaves


def check_same_device(op, leaves: Leaves) -> None:
    if leaves.mixed is not None:
        raise MixedDeviceError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"neuron:{leaves.index or 0} and {leaves.mixed.device}! (when checking arguments for {op})")


# --- kernels ---------------------------------------------------------------------------------

class OpKernel:
    """One op at one signature: which buffers feed the executable and what its results become."""

    __slots__ = ("executable", "inputs", "fresh", "written", "returns", "name", "_run", "_direct", "_count",
                 "_scalars", "_donated", "_queueable", "shapes", "_plain", "token")

    def __init__(self, executable, inputs, fresh, written, returns, name, donated=()):
        from ..compiler import FROM_XLA

        self.executable = executable
        self.inputs = inputs  # per graph input: ("slot", k), ("host", k), ("offset", k) or ("float", k, dtype)
        self.fresh = fresh  # per fresh output: (shape, dtype, strides or None for contiguous)
        # the fresh outputs as ``_finish`` makes them on neuron:0 when all are contiguous with elements
        # (``storage.new_tensor``'s common case, inlined): (size list, dtype, element count) each
        self._plain = (tuple((list(shape), dtype, math.prod(shape)) for shape, dtype, _ in fresh)
                       if all(stride is None and 0 not in shape for shape, _, stride in fresh) else None)
        self.written = written  # storage slots the op writes, in output order after the fresh ones
        self.returns = returns  # how to rebuild the op's return value (see rebuild)
        self.name = name
        # what the kernel is, as a number every process computes alike (op_queue chooses where to cut a full
        # queue by it: the same ops give the same cuts, and so the same runs, in any process)
        self.token = zlib.crc32(repr((name, fresh, inputs)).encode())
        plan = executable.plan
        self._run = executable.xla.loaded.execute_sharded if executable.xla is not None else None
        # the common case: every parameter a storage slot, a view's run-time offset (written ~k), a runtime
        # float (written (k, dtype): an alpha, a learning rate) or a 0-d CPU tensor (written (k,): a wrapped
        # number, ``x * 0.5``), every result straight from XLA, in order
        direct = (self._run is not None and all(entry[0] in ("slot", "offset", "float", "host") for entry in inputs)
                  and all(kind == FROM_XLA and value == i for i, (kind, value) in enumerate(plan.outputs)))
        self._direct = (tuple(inputs[i][1] if inputs[i][0] == "slot" else ~inputs[i][1] if inputs[i][0] == "offset"
                              else inputs[i][1:2] if inputs[i][0] == "host" else inputs[i][1:]
                              for i in plan.tensor_args) if direct else None)
        self._scalars = direct and any(entry[0] != "slot" for entry in inputs)  # any parameter but a buffer
        self._count = plan.num_xla_outputs
        self._donated = tuple(donated)  # slots whose buffers the executable takes (``ops.donated_storages``)
        # the op may wait in the device's queue (``op_queue``): one executable on plain parameters, taking no
        # buffer in place, on the local client; ``shapes`` (its results' shapes) is learned on its first run
        self._queueable = direct and not self._donated and executable.xla.target is None
        self.shapes = None

    def __call__(self, leaves: Leaves):
        datas = leaves.datas
        slots = self._direct
        index = leaves.index
        if self.shapes is not None and not index and _op_queue.queueing():
            with _op_queue.LOCK:
                params = self._params(leaves, slots, True)
                if params is not None:
                    return self._finish(_op_queue.enqueue(self, params, self.shapes), leaves, None)
        if self._donated:
            _op_queue.flush()  # a queued op may still read the buffer the executable takes
            for s in self._donated:  # a buffer the executable takes must be this storage's alone
                if _getrefcount(datas[s].buffer) > 2 and datas[s].buffer is not None:
                    _unshare(datas[s], index or 0)
        if slots is not None:
            params = self._params(leaves, slots, False)
            if params is not None:
                try:
                    run = self._run if not index else self.executable.xla.loaded_on(index).execute_sharded
                    results = [r[0] for r in run(params).disassemble_prefix_into_single_device_arrays(self._count)]
                except (AttributeError, TypeError, ValueError):  # a storage never written (buffer None)
                    results = self._slow(leaves)
                else:
                    if self._queueable and self.shapes is None:
                        self.shapes = tuple(r.shape for r in results)
            else:
                results = self._slow(leaves)
                if self._queueable and self.shapes is None:  # every result is an XLA result, in order
                    self.shapes = tuple(r.shape for r in results)
        else:
            results = self._slow(leaves)
        return self._finish(results, leaves, index)

    def _params(self, leaves: Leaves, slots: tuple, queued: bool) -> list | None:
        """The executable's parameters (None where a storage holds nothing yet). ``queued``: a storage's
        pending result is taken as it is (``op_queue``); otherwise reading it runs the queue."""
        datas = leaves.datas
        if queued:
            buffers = []
            for i in slots:
                if i.__class__ is int and i >= 0:
                    buffer = datas[i]._buffer
                    if buffer is None:  # never written (torch.empty): unspecified contents, zeros (as _slow)
                        data = datas[i]
                        buffer = _storage.zeros_buffer(data.numel, data.dtype)
                        data.set(buffer)
                    elif buffer.__class__ is _Pending and buffer.value is not None:  # its run has run
                        buffer = datas[i].buffer
                    buffers.append(buffer)
                else:
                    buffers.append(None)
            if not self._scalars:
                return buffers
        else:
            buffers = [datas[i].buffer if i.__class__ is int and i >= 0 else None for i in slots]
            if not self._scalars and any(b is None for b in buffers):
                return None
        if self._scalars:  # a view's offset (~k), a float ((k, dtype)), a 0-d CPU tensor ((k,))
            offsets, floats, host, device = leaves.offsets, leaves.floats, leaves.host, leaves.index or 0
            for position, i in enumerate(slots):
                if i.__class__ is int:
                    if i < 0:
                        buffers[position] = _scalar_buffer(offsets[~i][2], torch.int64, device)
                    elif buffers[position] is None:
                        return None
                elif len(i) == 2:
                    buffers[position] = _scalar_buffer(floats[i[0]], i[1], device)
                else:
                    buffers[position] = _host_scalar_buffer(host[i[0]], device)
        return buffers

    def execute(self, params: list) -> list:
        """Run the executable on device 0's ``params``; its results (the queue runs a queued op so)."""
        return [r[0] for r in self._run(params).disassemble_prefix_into_single_device_arrays(self._count)]

    def _finish(self, results: list, leaves: Leaves, index):
        """The op's results into new tensors and written storages; the op's return value."""
        datas = leaves.datas
        plain = self._plain
        if not index and plain is not None:
            fresh = []
            for (sizes, dtype, numel), buffer in zip(plain, results):
                tensor = _create_empty_tensor(sizes, dtype)
                tensor.untyped_storage()._neuron = Data(dtype, numel, buffer)
                fresh.append(tensor)
        elif not index:
            fresh = [new_tensor(shape, dtype, buffer, stride) for (shape, dtype, stride), buffer in zip(self.fresh, results)]
        else:
            fresh = [new_tensor(shape, dtype, buffer, stride, index=index)
                     for (shape, dtype, stride), buffer in zip(self.fresh, results)]
        if self.written:
            for slot, buffer in zip(self.written, results[len(self.fresh):]):
                if buffer is not None:
                    datas[slot].set(buffer)
        returns = self.returns
        if returns[0] == "fresh":
            return fresh[returns[1]]
        return rebuild(returns, fresh, leaves.tensors)

    def _slow(self, leaves: Leaves) -> list:
        params = []
        datas = leaves.datas
        device = leaves.index or 0
        for entry in self.inputs:
            kind, index = entry[0], entry[1]
            if kind == "slot":
                data = datas[index]
                buffer = data.buffer
                if buffer is None:  # never written (torch.empty): its contents are unspecified; zeros
                    # (its own when the executable takes it: the kept constant is every storage's)
                    buffer = (_storage.host_to_buffer(torch.zeros(data.numel, dtype=data.dtype), device)
                              if index in self._donated else _storage.zeros_buffer(data.numel, data.dtype, device))
                    data.set(buffer)
                params.append(buffer)
            elif kind == "host":  # a 0-d CPU tensor: its value's buffer, kept as a runtime float's is
                params.append(_host_scalar_buffer(leaves.host[index], device))
            elif kind == "offset":
                params.append(_scalar_buffer(leaves.offsets[index][2], torch.int64, device))
            elif kind == "sizes":
                params.append(leaves.sizes)
            else:
                params.append(_scalar_buffer(leaves.floats[index], entry[2], device))
        return run_executable(self.executable, params, device)


_SCALARS: dict = {}


def _unshare(data: Data, index: int) -> None:
    """Give ``data`` a copy of its buffer, which another storage or the kept constants also hold (buffers
    are immutable, so storages share them: ``torch.zeros``, a storage's clone): an executable that takes
    its parameter's buffer (donation) must not take theirs.

    A reference may also be one jaxlib has yet to drop: a buffer released off the GIL (the DLPack import
    through which a compiled graph's collectives read a device tensor, freed by PJRT's thread after the
    run) queues its Python reference until ``collect_garbage`` (which jax otherwise runs at Python's next
    garbage collection). Those go first; only a holder that remains costs a copy."""
    from jaxlib import _jax

    _jax.collect_garbage()
    if _getrefcount(data.buffer) <= 2:  # the storage's and getrefcount's argument
        return
    buffer = data.buffer
    data.set(_storage.host_to_buffer(_storage.buffer_to_host(buffer, data.dtype).reshape(buffer.shape), index))


def _host_scalar_buffer(tensor: torch.Tensor, index: int = 0):
    try:
        value = tensor.item()
    except (RuntimeError, TypeError):  # a dtype item() does not give back (complex32)
        return _storage.host_to_buffer(tensor, index)
    return _scalar_buffer(value, tensor.dtype, index)


def _scalar_buffer(value: float, dtype: torch.dtype, index: int = 0):
    """A 0-d buffer holding a runtime float or a 0-d CPU tensor's value (the last few hundred are kept: a
    learning rate, a model's constant scalars recur). Keyed by ``repr``: -0.0 is not 0.0, NaN finds itself."""
    key = (repr(value), dtype, index)
    buffer = _SCALARS.get(key)
    if buffer is None:
        if len(_SCALARS) > 512:
            _SCALARS.clear()
            _run_offsets.forget()
        buffer = _SCALARS[key] = _storage.scalar_buffer(value, dtype, index)
        if dtype is torch.int64 and value.__class__ is int:  # a view's offset, maybe: a fused run reads it
            _run_offsets.remember(buffer, value)
    return buffer


def run_executable(executable, params: list, index: int = 0) -> list:
    """``compiler.Executable`` on PJRT buffers of device ``index`` (its plan picks the parameters and places
    the results)."""
    from ..compiler import CONSTANT, EMPTY, FROM_ARG, FROM_XLA

    plan = executable.plan
    if executable.xla is not None:
        results = executable.xla.run_buffers([params[i] for i in plan.tensor_args], index)
    else:
        results = []
    out = []
    for kind, value in plan.outputs:
        if kind == FROM_XLA:
            out.append(results[value])
        elif kind == FROM_ARG:
            out.append(params[value])
        elif kind == EMPTY:
            out.append(None)  # a zero-size result holds nothing
        elif kind == CONSTANT:
            out.append(value)
        else:
            raise NotImplementedError(f"an eager op's graph returned a view ({kind})")
    return out


def rebuild(returns, fresh: list, tensors: list):
    kind, value = returns
    if kind == "fresh":
        return fresh[value]
    if kind == "arg":
        return tensors[value]
    if kind == "tuple":
        return tuple(rebuild(r, fresh, tensors) for r in value)
    if kind == "list":
        return [rebuild(r, fresh, tensors) for r in value]
    return value  # "const"
