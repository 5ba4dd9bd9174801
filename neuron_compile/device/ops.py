"""Eager ops on neuron tensors: each ATen op compiled once per signature, then run on PJRT buffers.

Every op that reaches the ``neuron`` dispatch key and has no kernel of its own
in ``kernels`` lands in ``dispatch``:

    signature  op overload + per tensor (dtype, size, stride, which storage,
               the storage buffer's shape; the offset only where the op
               writes through the view) + every other argument's type and
               value: everything the executable bakes in. A view of fewer
               elements than its storage is read at a run-time offset (a 0-d input of
               the executable, ``lowering.runtime_offsets``), so a batch sliced
               at a new offset compiles nothing
    memory     a dict from signature to ``OpKernel``: the hot path
    trace      a miss traces the op with ``make_fx`` on fake tensors, under
               functionalization and our decomposition table: each input is
               its storage's buffer, viewed inside the graph when the tensor is
               not the whole buffer; an in-place or ``out=`` op returns the
               updated storages, so eager's aliasing holds (``x[0] += 1``
               rewrites the storage every view of ``x`` reads)
    compile    ``compiler.compile_graph``: the same lowering, passes, artifact
               cache (memory and disk) and executor as compiled graphs
    run        the executable on the storages' PJRT buffers; fresh outputs
               become new neuron tensors, written storages get new buffers

Ops with data-dependent output shapes or non-tensor results (``nonzero``,
``unique``, ``equal``...) run on host copies (the answer needs the data on the
host anyway). An op that does not lower raises ``LoweringError`` naming the op
and the user's line; with ``fallback="eager"`` (``NEURON_COMPILE_FALLBACK``) it
runs on host copies with one warning per op (through its decomposition where the CPU has no kernel
for it).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings

import torch

from .. import profiling as _profiling
from . import index_checks
from . import lengths as _lengths
from . import op_queue as _op_queue
from .issuers import issuer
from . import storage as _storage
from . import transfers
from .transfers import _factory_on_host, _writes, _written_positions, resize_, retype, run_on_host
from .transfers import _flat_tensors  # noqa: F401 - lengths reads it through OPS
from .opkernel import COUNTS, Leaves, OpKernel, check_same_device, leaves_of
from .storage import new_tensor

log = logging.getLogger("neuron_compile")
aten = torch.ops.aten

_KERNELS: dict = {}  # (op id, call signature) -> kernel: this generation's (see keep)
_OLDER: dict = {}  # the generation before: kernels not used since it ended, dropped when this one fills
# Kernels a generation holds. Every XLA executable holds its JIT-compiled code in 3 to 10 memory mappings
# of its own (measured: 3 for a one-fusion add, 6.7 on average over PyTorch's test_modules.py), and Linux
# refuses a process more than vm.max_map_count of them (65,530 by default): a process that kept every
# kernel it ever built reached that limit, and XLA crashed in its next compile or serialize; so did one
# holding two generations of 4,096 (64,552 mappings at the crash, about 4,900 executables). Two
# generations keep at most twice this many; a kernel in use comes back to the current generation at its
# first call after it ended, so only kernels idle for a whole generation are dropped (a later call loads
# it again from the artifact cache: no compile). With the compile cache's memory level and the fused runs
# held (op_queue.FUSED_KEPT) bounded too, test_modules.py's sample peaked at 40,057 mappings (61% of the limit).
KERNELS_KEPT = 1024
_lengths.OPS = index_checks.OPS = transfers.OPS = sys.modules[__name__]
_LOCK = threading.RLock()
_WARNED: set[str] = set()
# ops whose output shapes depend on data, learned as they fail to trace: they run on the host
_HOST_OPS: set = set()
_INDEX_CHECKS = index_checks.enabled()
_CHECKED = {id(op) for op in index_checks.RULES}  # the ops whose indices are checked, by id
_OPS: dict = {}  # id -> op, for every op a kernel of _KERNELS runs: its id names no other op while it lives


# --- dispatch --------------------------------------------------------------------------------

def dispatch(op, args, kwargs):
    ident = id(op)  # ops are keyed by id (an OpOverload's hash is a Python method); _OPS keeps each alive
    if ident in _CHECKED and _INDEX_CHECKS:  # an index out of range raises, as on CPU (bounds.py)
        index_checks.check(op, args, kwargs, COUNTS)
    leaves = leaves_of(args, kwargs)
    if leaves.retypes and not leaves.two_dtypes:  # a view(dtype) of a storage last written in another dtype
        for data, dtype in leaves.retypes:
            retype(data, dtype)
        leaves = leaves_of(args, kwargs)
    if leaves.mixed is not None or not leaves.device_seen:
        if not leaves.device_seen:  # a factory (triu_indices...): made on the host, then moved
            return _factory_on_host(op, args, kwargs)
        check_same_device(op, leaves)
    if leaves.two_dtypes:  # one storage read as two dtypes (a view(dtype) beside its base): host copies
        return run_on_host(op, args, kwargs)
    if leaves.offsets and _writes(op):
        leaves.pin_written(_written_positions(op, args, kwargs))
    key = (ident, tuple(leaves.parts))
    kernel = _KERNELS.get(key)
    if kernel is not None:
        COUNTS["op_cache_hits"] += 1
        if _profiling.STATE._is_profiler_enabled:  # torch.profiler records: a neuron::execute event
            return _profiling.execute(lambda: _run(kernel, op, args, kwargs, leaves), op, leaves)
        return kernel(leaves) if kernel.__class__ is OpKernel else kernel(op, args, kwargs, leaves)
    if op in _HOST_OPS:
        return run_on_host(op, args, kwargs)
    with _LOCK:
        kernel = known(key)
        if kernel is None and _lengths.active():  # a dim that keeps changing size: one kernel per bucket
            kernel = _lengths.kernel_for(op, args, kwargs, leaves)
        if kernel is None:
            kernel = _build(op, args, kwargs, leaves)
            if kernel is None:  # the op runs on the host (data-dependent shapes, or fallback="eager")
                return run_on_host(op, args, kwargs)
            keep(key, kernel)
            _OPS[ident] = op
    if _profiling.STATE._is_profiler_enabled:
        return _profiling.execute(lambda: _run(kernel, op, args, kwargs, leaves), op, leaves)
    return kernel(leaves) if kernel.__class__ is OpKernel else kernel(op, args, kwargs, leaves)


def known(key):
    """The kernel of ``key`` if one is held: this generation's, or the last one's, brought back into this one."""
    kernel = _KERNELS.get(key)
    if kernel is None:
        with _LOCK:
            kernel = _OLDER.pop(key, None)
            if kernel is not None:
                _KERNELS[key] = kernel
    return kernel


def keep(key, kernel) -> None:
    """Hold ``kernel`` for ``key`` in this generation; a full generation becomes the older one, and the older
    one's kernels (none used since it ended) are dropped, with the fused-run signatures that name them
    (``KERNELS_KEPT``)."""
    global _KERNELS, _OLDER
    with _LOCK:
        if len(_KERNELS) >= KERNELS_KEPT:
            dropped, _OLDER, _KERNELS = _OLDER, _KERNELS, {}
            if dropped:
                COUNTS["kernels_dropped"] += len(dropped)
                _op_queue.forget_kernels({id(k) for k in dropped.values()})
        _KERNELS[key] = kernel
    from ..runtime.executor import mapping_pressure

    pressure = mapping_pressure()  # a count once per 256 executables made, by anyone
    if pressure is not None:
        _relieve(pressure)


def _relieve(pressure: tuple) -> None:
    """The process holds more of the kernel's limit on memory mappings than its bounds foresaw
    (``runtime.executor.mapping_pressure``: compiled graphs, other devices' kernels, a workload's thousands of
    signatures): let go of every executable the device holds for reuse, its kernels, fused runs and the
    compile cache's memory level. One in use lives on where it is used; one needed again loads from the
    artifact cache (no compile). Said once as a warning, then in the log."""
    import gc

    from ..compiler import MEMORY
    from ..runtime.executor import mappings

    used, limit = pressure
    with _LOCK:
        kernels = len(_KERNELS) + len(_OLDER)
        clear_kernels()
    runs = _op_queue.drop_runs()
    MEMORY.clear()
    gc.collect()
    after = (mappings() or (used, limit))[0]
    COUNTS["kernels_dropped"] += kernels
    COUNTS["mapping_releases"] += 1
    message = (f"neuron: this process holds {used:,} memory mappings, {used / limit:.0%} of the kernel's limit "
               f"(vm.max_map_count = {limit:,}; each XLA executable holds several, and past the limit XLA crashes "
               f"the process). The device let go of the {kernels:,} kernels and {runs:,} fused runs it held for "
               f"reuse (one needed again loads from the artifact cache): {after:,} mappings now. To hold more, "
               "raise the limit (sysctl -w vm.max_map_count=262144).")
    if COUNTS["mapping_releases"] == 1:
        where = issuer()  # the user's line whose op made the executable past the mark
        if where is None:
            warnings.warn(message, stacklevel=3)
        else:
            warnings.warn_explicit(message, UserWarning, where[0].co_filename, where[1])
    else:
        log.info(message)


def clear_kernels() -> None:
    """Drop every kernel held (tests: each signature a miss again)."""
    with _LOCK:
        _KERNELS.clear()
        _OLDER.clear()


def _run(kernel, op, args, kwargs, leaves):
    return kernel(leaves) if kernel.__class__ is OpKernel else kernel(op, args, kwargs, leaves)


# --- compiled graphs on neuron tensors -------------------------------------------------------

class ExecutorAdapter:
    """How compiled graphs (``torch.compile(..., backend="neuron")``) take and give neuron tensors: a
    tensor's own storage buffer is the executable's input (no copy), a result is a neuron tensor; a CPU
    tensor the graph takes or gives crosses through the transfer API (a host copy, counted)."""

    @staticmethod
    def host_to_buffer(tensor: torch.Tensor):
        # onto the current device (a graph's CPU input meets the graph's neuron tensors there: under
        # torchrun each rank's tensors are on its current device, neuron:<LOCAL_RANK>)
        COUNTS["host_copies"] += 1
        return _storage.host_to_buffer(tensor, _storage.ordinals.current_device())

    @staticmethod
    def to_host(array) -> torch.Tensor:
        COUNTS["host_copies"] += 1
        return _storage.buffer_to_host(array, _storage.torch_dtype(array.dtype))

    @staticmethod
    def to_buffer(tensor: torch.Tensor):
        if tensor.is_conj() or tensor.is_neg():
            # a conjugate or negative view (a saved ``_conj`` of a complex multiply's backward): its
            # storage holds the base's elements, the bit says how to read them; computed on the device
            tensor = tensor.resolve_conj().resolve_neg()
        data = _storage.data_of(tensor)
        buffer = _storage.own_buffer(tensor, data)
        if buffer is not None:
            return buffer
        if (data.buffer is not None and data.dtype is tensor.dtype and tensor.numel() == data.numel
                and not tensor.storage_offset() and tensor.is_contiguous() and tensor.numel()):
            # the whole storage at another shape (a head split, a 0-d view of one element): the same memory
            from neuron_compile.runtime.executor import reshaped_buffer

            return reshaped_buffer(data.buffer, tensor.shape)
        # a view, or a storage never written: its elements, computed on the device (at its own shape)
        with _lengths.exact():
            dense = dispatch(torch.ops.aten.clone.default, (tensor.detach(),), {"memory_format": torch.contiguous_format})
        if not dense.numel():
            return _storage.host_to_buffer(torch.empty(tensor.shape, dtype=tensor.dtype), tensor.device.index)
        return _storage.data_of(dense).buffer

    @staticmethod
    def to_tensor(array) -> torch.Tensor:
        return new_tensor(array.shape, _storage.torch_dtype(array.dtype), array, index=array.device.id)


# --- building a kernel -----------------------------------------------------------------------

def _build(op, args, kwargs, leaves: Leaves) -> OpKernel | None:
    from ..options import Options
    from . import op_index
    from .trace import OpTraceError, trace_op

    options = Options.resolve()
    parts = tuple(leaves.parts)
    name = op_index.entry_name(op, parts)
    entry = op_index.load(options, name)
    if entry is not None:
        kernel = _from_index(op, args, kwargs, leaves, entry, options)
        if kernel is not _MISSING:
            return kernel
    try:
        traced = trace_op(op, args, kwargs, leaves, _written_positions(op, args, kwargs))
    except OpTraceError as exc:  # data-dependent shapes or non-tensor results: the host answers
        log.debug("%s runs on the host: %s", op, exc)
        _HOST_OPS.add(op)
        op_index.store(options, name, {"kind": "host"})
        return None
    if traced.resized:
        op_index.store(options, name, {"kind": "resize", "sizes": traced.resized})
        return ResizeOuts(traced.resized)
    if traced.by_value:
        op_index.store(options, name, {"kind": "by_value"})
        name = op_index.entry_name(op, parts, tuple(map(repr, leaves.floats)))
    kernel = _compile(op, traced, options, name, retry=lambda: trace_op(
        op, args, kwargs, leaves, _written_positions(op, args, kwargs), bake_floats=traced.by_value, wide=True))
    if kernel is not None and traced.by_value:
        return ByValue(kernel, leaves.floats)
    return kernel


_MISSING = object()


def _from_index(op, args, kwargs, leaves, entry: dict, options):
    """The kernel an index entry describes (its executable from the artifact cache), or _MISSING."""
    from . import op_index
    from .trace import trace_op

    kind = entry["kind"]
    if kind == "host":
        _HOST_OPS.add(op)
        return None
    if kind == "resize":
        return ResizeOuts(entry["sizes"])
    by_value = kind == "by_value"
    if by_value:
        entry = op_index.load(options, op_index.entry_name(op, tuple(leaves.parts), tuple(map(repr, leaves.floats))))
        if entry is None or entry["kind"] != "kernel":
            return _MISSING

    def rebuild():  # the artifact was evicted: trace again, and compile_graph's path takes over
        return trace_op(op, args, kwargs, leaves, _written_positions(op, args, kwargs), bake_floats=by_value).gm

    kernel = kernel_from_entry(op, entry, options, rebuild)
    return ByValue(kernel, leaves.floats) if by_value and kernel is not _MISSING else kernel


def kernel_from_entry(op, entry: dict, options, rebuild):
    """The OpKernel an op index entry of kind "kernel" describes, its executable from the artifact cache
    (``rebuild()`` gives the op's graph again if the artifact was evicted), or _MISSING."""
    from ..compiler import cached_executable
    from ..report import CompileReport, record

    report = CompileReport(graph=f"eager.{op}", kind="eager")
    try:
        executable = cached_executable(entry["front"], entry["plan"], entry["signature"], rebuild,
                                       report=report, options=options, aliases=entry.get("aliases", ()))
    except Exception as exc:  # the entry no longer fits what tracing gives: build as if it were absent
        log.debug("device op index entry for %s does not fit (%s): tracing again", op, exc)
        return _MISSING
    record(report)
    COUNTS["index_hits"] += 1
    return OpKernel(executable, entry["inputs"], entry["fresh"], entry["written"], entry["returns"],
                    f"eager.{op}", entry.get("donated", ()))


class ByValue:
    """At this signature the op's float arguments could not become inputs: one kernel per value."""

    __slots__ = ("kernels",)

    def __init__(self, kernel: OpKernel, floats: list):
        self.kernels = {tuple(map(repr, floats)): kernel}

    def __call__(self, op, args, kwargs, leaves):
        key = tuple(map(repr, leaves.floats))
        kernel = self.kernels.get(key)
        if kernel is None:
            from .trace import trace_op

            with _LOCK:
                from . import op_index

                traced = trace_op(op, args, kwargs, leaves, _written_positions(op, args, kwargs), bake_floats=True)
                if traced.resized:  # this value changes an out= tensor's size (arange's length): resize it
                    return ResizeOuts(traced.resized)(op, args, kwargs, leaves)
                kernel = self.kernels[key] = _compile(
                    op, traced, index_name=op_index.entry_name(op, tuple(leaves.parts), key))
            if kernel is None:
                return run_on_host(op, args, kwargs)
        return kernel(leaves)


class ResizeOuts:
    """At this signature the op resizes its ``out=`` tensors: resize them, then dispatch at the new one."""

    __slots__ = ("sizes",)

    def __init__(self, sizes: dict):
        self.sizes = sizes

    def __call__(self, op, args, kwargs, leaves):
        for position, shape in self.sizes.items():
            resize_(leaves.tensors[position], shape)
        return dispatch(op, args, kwargs)


def user_line() -> str:
    """The innermost frame of the user's code (outside torch and neuron_compile) that led to this op."""
    import sys

    frame = sys._getframe(1)
    ours = (os.sep + "torch" + os.sep, os.sep + "neuron_compile" + os.sep, "<frozen", os.sep + "jax" + os.sep)
    while frame is not None:
        path = frame.f_code.co_filename
        if not any(part in path for part in ours):
            import linecache

            code = linecache.getline(path, frame.f_lineno).strip()
            return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}: {code}"
        frame = frame.f_back
    return "<unknown>"


def _compile(op, traced, options=None, index_name: str | None = None, retry=None) -> OpKernel | None:
    from ..options import Options
    from ..compiler import compile_graph, xla_aliases
    from ..lowering import LoweringError
    from ..report import CompileReport, record
    from . import op_index

    options = options or Options.resolve()
    name = f"eager.{op}"
    report = CompileReport(graph=name, kind="eager")
    donate = donated_storages(traced)
    pairs = {i: o for i, o, _ in donate}
    try:
        executable = compile_graph(traced.gm, report=report, options=options, donate=pairs or None)
    except LoweringError as exc:
        if retry is not None:  # decomposed further by torch's own table, it may lower
            try:
                wider = retry()
            except Exception:
                wider = None
            if wider is not None and wider.gm is not None and not wider.resized:
                log.debug("%s did not lower (%s); retrying with every decomposition torch registers", op,
                          exc.args[0].splitlines()[0])
                try:
                    return _compile(op, wider, options, index_name)
                except LoweringError:
                    pass
        line = user_line()
        if options.fallback == "eager":
            if str(op) not in _WARNED:
                _WARNED.add(str(op))
                warnings.warn(f"neuron: {op} does not lower (called at {line}); it runs on the host from now on "
                              "(fallback='eager')", stacklevel=2)
            _HOST_OPS.add(op)
            return None
        if exc.source is None:
            exc.source = line
        exc.args = (f"{exc.args[0]}\nThe eager op {op} was called at {line}",) + exc.args[1:]
        raise
    record(report)
    COUNTS["op_compiles"] += 1
    donated = _donated_slots(executable, donate)
    if index_name is not None and executable.front is not None:
        op_index.store(options, index_name, {
            "kind": "kernel", "front": executable.front, "plan": executable.plan, "signature": executable.signature,
            "inputs": traced.inputs, "fresh": traced.fresh, "written": traced.written, "returns": traced.returns,
            "aliases": xla_aliases(executable.plan, pairs), "donated": donated})
    return OpKernel(executable, traced.inputs, traced.fresh, traced.written, traced.returns, name, donated)


# an op that overwrites storages of at least this many bytes in all donates their buffers to XLA, which then
# writes the new contents in place (a large ``add_``, ``copy_``, ``index_put_``, an optimizer step's parameters):
# no new buffers a call. Below it a fresh buffer costs about what the donation saves. A storage the graph reads
# at another shape than its buffer's (an optimizer moment made by ``zeros_like``, held flat) is not donated: XLA
# ran AdamW's fused step 1.2x slower with those donated, 1.4x faster with only the parameters.
DONATE_BYTES = 1 << 20


def _donated_slots(executable, donate: list) -> list:
    """The slots whose buffers the executable takes (the pairs ``xla_aliases`` kept)."""
    from ..compiler import xla_aliases

    if executable.xla is None:
        return []
    return [slot for i, o, slot in donate if xla_aliases(executable.plan, {i: o})]


_RESHAPES = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default,
             torch.ops.aten.as_strided.default)


def donated_storages(traced) -> list:
    """(graph input, graph output, storage slot) for each storage the op overwrites and reads at its buffer's
    shape, when those storages hold ``DONATE_BYTES`` or more: the buffers its executable may write in place."""
    nodes = traced.gm.graph.nodes
    placeholders = [n for n in nodes if n.op == "placeholder"]
    results = next(n for n in reversed(nodes) if n.op == "output").args[0]
    pairs, size = [], 0
    for w, slot in enumerate(traced.written):
        if ("slot", slot) not in traced.inputs:
            continue
        position = traced.inputs.index(("slot", slot))
        old, new = placeholders[position].meta.get("val"), getattr(results[len(traced.fresh) + w], "meta", {}).get("val")
        if old is None or new is None or old.shape != new.shape or old.dtype != new.dtype:
            continue  # XLA aliases a result to a parameter of the same shape and dtype only
        if any(user.target in _RESHAPES for user in placeholders[position].users):
            continue  # read at another shape: XLA copies around the reshape (slower than a fresh buffer)
        size += old.numel() * old.element_size()
        pairs.append((position, len(traced.fresh) + w, slot))
    return pairs if size >= DONATE_BYTES else []
