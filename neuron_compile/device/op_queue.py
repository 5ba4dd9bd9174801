"""Adaptive eager execution: eager ops are queued in stream order, and runs of them that repeat are fused.

TorchNeuron's "Adaptive Eager Execution", on our executor. An eager op whose
kernel is an executable already built (``opkernel.OpKernel``) is not run when
it is issued: its parameters (PJRT buffers, or ``Pending`` results of ops queued
before it) go into one process-wide queue, and its results are ``Pending``
values whose shapes are known. A neuron storage holding a ``Pending`` is a
tensor like any other; the op returns at once.

The queue runs (``flush``) when

    a value is read   anything that reads a storage's ``buffer`` (``.cpu()``,
                      ``.item()``, ``print``, an index check, a collective, an op
                      that cannot be queued) runs the queue first
                      (``storage.Data.buffer``): every reader sees op-by-op's
                      values, in op-by-op's order
    a buffer is taken an op that writes its input buffer in place (donation)
    it is full        ``LIMIT`` ops (a bound: 1,024). The cut goes where the ops say
                      (``run_cuts.cut_at``), so a loop that never reads is cut at the same op each
                      turn and its runs repeat
    a chunk ends      asynchronous client, ``CHUNK`` ops or more queued: before an op whose
                      kernel pair hashes to a multiple of ``CHUNK`` (``run_cuts``), so a
                      loop's runs repeat however long its turn; XLA computes the run while
                      the host issues the next
    synchronize       ``torch.neuron.synchronize()``, ``torch.accelerator.synchronize()``

A run's signature is its ops' kernels in order, how each parameter is wired
(a buffer from outside the run, or result ``o`` of the run's op ``c``), and
which results are still referenced when it runs (``getrefcount``: a result only
the run itself reads never becomes a buffer once fused). A run is executed op by
op until its signature has been seen ``REPEATS`` times (a training or sampling
loop); then ``fusion.build`` joins its ops' StableHLO modules into one, compiled
on a background thread (no call waits on it), and from the next occurrence on the
run is one executable call. A run whose module fails to compile keeps running
op by op, with one warning naming it. A view's offset is a parameter of its op's
executable; the offsets a run's first two sightings share are constants of its
fused module (``run_offsets``: XLA then reads those views as static slices inside
their readers, GPT-2's fused run took 0.93x the time), and one that moves later
sends the run op by op once while it is built again reading that offset at run
time.

Numbers: XLA fuses across a run's ops (a multiply and an add become a fused
multiply-add, an elementwise op is computed inside the reduction it feeds), so
fused results may differ from op by op's in the last bits, within op by op's
own distance to CPU (``benchmarks/opinfo_fusion.py``; the README's "Numbers";
XLA CPU drops optimization barriers before fusing, so they cannot keep ops
apart). A run that computes in float64 is never fused (``_double``): float64 is
what numerical checks run in, and they compare two passes bit for bit.
``NEURON_COMPILE_EAGER_FUSION=0``, ``NEURON_LAUNCH_BLOCKING=1`` and
``torch.use_deterministic_algorithms(True)`` run every op when issued, as before.

An op that fails when its run executes raises at that synchronization, naming
the op and the line of the user's code that issued it (recorded when queued).
The device's client dispatches asynchronously (``runtime/executor.asynchronous``):
a run returns before XLA has computed it, and a read of its results (or
``synchronize``) waits, so XLA computes while the host issues what follows. An
index check on values a queued op computes runs at the next host read or
``synchronize`` (``settle``), not where the queue runs unread.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import warnings
from sys import getrefcount

import torch

from .. import _profiler_hooks as _hooks
from ..runtime.devices import queues_eager_ops
from . import run_cuts as _cuts
from . import run_offsets as _offsets
from .issuers import describe
from .issuers import issuer as _issuer

log = logging.getLogger("neuron_compile")

LIMIT = 1024  # ops a run holds at most: past it the queue runs (see the module docstring)
REPEATS = 2  # a run is fused from its REPEATS-th sighting on (built then, used from the next)
_SIGNATURES = 4096  # run signatures remembered at most (sightings of runs that never repeat are forgotten)
# fused executables held at most: past it the older half is let go (a run met again is sighted and built
# anew, its executable then loaded from the artifact cache). Each XLA CPU executable holds 3-10 memory
# mappings, and a process may hold no more than vm.max_map_count (65,530): PyTorch's test_modules.py
# reached it holding ~5,000 kernels and fused runs, and crashed inside XLA (ops.KERNELS_KEPT)
FUSED_KEPT = 512

LOCK = threading.RLock()
_RECORDS: list = []  # (kernel, params, pendings, issuer) in stream order
_CHECKS: list = []  # checks to run at the next synchronization (defer_check)
CHECKS_HELD = 64  # deferred checks kept past a run at most: a loop that never reads runs them at its runs
_RUNS: dict = {}  # run signature -> sightings (int), _BUILDING, _FAILED or a fusion.FusedRun
_SIGHTED: dict = {}  # run signature -> its views' offsets at its first sighting (run_offsets.of_run)
_BUILDING, _FAILED = "building", "failed"
COUNTS = {"queued_ops": 0, "runs": 0, "fused_runs": 0, "fused_builds": 0, "fused_failures": 0, "fused_dropped": 0,
          "executables": 0, "op_by_op_runs": 0, "fused_rebuilt": 0, "host_reads": 0,
          "synchronizations": 0}


ENABLED = queues_eager_ops()  # NEURON_COMPILE_EAGER_FUSION on, NEURON_LAUNCH_BLOCKING off


def active() -> bool:
    """Eager ops are queued now: fusion on, not launch-blocking, not deterministic mode."""
    return ENABLED and not torch.are_deterministic_algorithms_enabled()


def set_enabled(enabled: bool) -> None:
    """Queue and fuse eager ops (True) or run each when issued (False); the queue runs first."""
    global ENABLED
    synchronize()
    ENABLED = bool(enabled)


class Pending:
    """The result of a queued op: its shape now, its PJRT buffer once the queue has run."""

    __slots__ = ("shape", "value")

    def __init__(self, shape):
        self.shape = shape
        self.value = None

    def result(self):
        if self.value is None:
            flush()
        value = self.value
        if value is None or value.__class__ is _Lost:  # None: never queued, or its run never ran (a bug of ours)
            raise (value or _Lost("neuron_compile: a queued op's result was read before its run ran, and the queue "
                                  "holds no op computing it. This is a bug of neuron_compile; "
                                  "NEURON_COMPILE_EAGER_FUSION=0 avoids it.")).error()
        return value


class _Lost:
    """Where a result should be but is not: its op failed, or (a bug of ours) a fused run dropped it."""

    __slots__ = ("message",)

    def __init__(self, message):
        self.message = message  # the text, or what makes it when it is read (most lost results never are)

    def error(self) -> RuntimeError:
        return RuntimeError(self.message if isinstance(self.message, str) else self.message())


def enqueue(kernel, params: list, shapes: tuple) -> tuple:
    """Queue ``kernel`` on ``params`` (PJRT buffers or ``Pending`` results); its results, pending. The
    caller holds ``LOCK`` until the results are in their storages (a run's liveness counts them there)."""
    queued = len(_RECORDS)
    if queued >= LIMIT:
        _cut(kernel)  # the run is full: the ops before the cut run, those after it wait with this one
    elif queued >= _cuts.CHUNK and _cuts.chunk_ends(_RECORDS[-1][0], kernel):
        _flush_locked()  # dispatched: XLA computes the ops queued so far while this one and the next are issued
    pendings = tuple([Pending(shape) for shape in shapes])
    _RECORDS.append((kernel, params, pendings, _issuer()))
    COUNTS["queued_ops"] += 1
    return pendings


_UNQUEUED = None  # the thread whose ops run when issued inside ``unqueued()``


@contextlib.contextmanager
def unqueued():
    """Ops this thread issues in here run when issued, and the queue is left as it holds: an index check
    reading a resident batch of ids (cloned on the device first, ``transfers.alone``) would otherwise run
    the whole queue and cut the run being gathered in two (every step of a language model, twice)."""
    global _UNQUEUED
    with LOCK:  # no other thread queues meanwhile (its op would wait for the lock anyway)
        before, _UNQUEUED = _UNQUEUED, threading.get_ident()
        try:
            yield
        finally:
            _UNQUEUED = before


def beside() -> bool:
    """This thread is inside ``unqueued()``: its ops and host reads leave the queue as it is."""
    return _UNQUEUED is not None and _UNQUEUED == threading.get_ident()


def queueing() -> bool:
    """This thread's ops go to the queue now: ``active()`` and not inside ``unqueued()``."""
    return ENABLED and not beside() and active()


def computing(tensor) -> bool:
    """``tensor``'s storage holds the pending result of an op still queued."""
    buffer = tensor.untyped_storage()._neuron._buffer
    return buffer.__class__ is Pending and buffer.value is None


def defer_check(check) -> None:
    """Run ``check()`` (an index check on values a queued op computes) at the next synchronization: a host
    read or ``synchronize()``, after the queue has run (``settle``). Not at a run the host does not wait
    for (a donation, a full queue): reading the values there would wait for XLA to compute them."""
    _CHECKS.append(check)


def flush() -> None:
    """Run every queued op (fused where its run has been built)."""
    if _RECORDS:
        with LOCK:
            _flush_locked()


def settle() -> None:
    """What a host read does first: run the queue, then the index checks deferred to it (``defer_check``),
    which raise there."""
    if _RECORDS:
        flush()
    _run_checks()


def _run_checks() -> None:
    """The deferred index checks, in the order deferred; one that raises leaves the rest for the next."""
    while _CHECKS:
        _CHECKS.pop(0)()


def synchronize() -> None:
    """Wait for every op issued so far: the queue runs, its deferred index checks raise, and XLA finishes
    what it was given (an asynchronous client returns before: ``executor.asynchronous``)."""
    COUNTS["synchronizations"] += 1
    settle()
    from ..runtime import executor  # (not at import: the device's registration stays free of jaxlib)

    executor.synchronize()


def pending() -> int:
    """Ops queued and not yet run."""
    return len(_RECORDS)


def reset() -> None:
    """Run the queue and forget every run signature (``neuron_compile.reset()``). Fused runs waiting to be
    built are dropped with their signatures; the build under way and whole ops' (which their sightings
    wait for) are waited for, at most ``EXIT_WAIT_S``: a compile finishing after the reset counted as the
    next test's (a whole LBFGS op built after its test had ended made a compile count 2 where 1 was due)."""
    flush()
    with _jobs_ready:
        _jobs[:] = [job for job in _jobs if callable(job)]
    deadline = time.monotonic() + EXIT_WAIT_S
    while not _idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    _RUNS.clear()
    _SIGHTED.clear()


# --- running a run ---------------------------------------------------------------------------

def _cut(kernel) -> None:
    """Run the first ops of a full queue: up to the cut that ``run_cuts.cut_at`` picks (where the ops say),
    the rest stay queued."""
    records = _RECORDS
    cut = _cuts.cut_at(records, kernel)
    kept = records[cut:]
    del records[cut:]
    checks = _CHECKS[:]  # an index check may read an op still queued after the cut: they run at the next run
    _CHECKS.clear()
    try:
        _flush_locked()
    finally:  # an op before the cut that failed fails those after it that read it, when they run
        records.extend(kept)
        _CHECKS[:0] = checks


def _flush_locked() -> None:
    records = list(_RECORDS)
    _RECORDS.clear()
    if not records:
        return
    COUNTS["runs"] += 1
    if _hooks.STATE._is_profiler_enabled:  # torch.profiler records: the run, fused or op by op, as one event
        with _hooks.event("neuron::queue_run", (), {"ops": len(records)}):
            _run_records(records)
    else:
        _run_records(records)
    if len(_CHECKS) > CHECKS_HELD:  # a loop that never reads: its checks run here, waiting for their values
        _run_checks()


def _run_records(records: list) -> None:
    if len(records) == 1:  # nothing to join (a sync right after one op): no signature to take
        _run_op_by_op(records)
        return
    calls, externals, uses = _wiring(records)
    live = _live(records, uses)  # here, not in _wiring: its loop variables hold results while it runs
    key = (calls, live)
    run = _RUNS.get(key)
    if run is not None and run.__class__ is not int and run not in (_BUILDING, _FAILED):
        if run.baked and not _offsets.hold(run.baked, externals):
            # an offset its build took as a constant moved: op by op this time, and built again with the
            # offsets that held as constants, the rest read at run time; a second move, every offset at run
            # time (a run is built at most three times)
            _RUNS[key] = _BUILDING
            COUNTS["fused_rebuilt"] += 1
            _run_op_by_op(records)
            held = None if run.rebuilds else _offsets.held(run.baked, externals)
            _build_later(key, records, live, held, run.rebuilds + 1)
            return
        try:
            _run_fused(run, records, externals, live)
            return
        except Exception as exc:  # noqa: BLE001 - XLA refused it at run time: op by op from now on
            _RUNS[key] = _FAILED
            COUNTS["fused_failures"] += 1
            _warn_failed([r[0] for r in records], [r[3] for r in records], exc)
    _run_op_by_op(records)
    if run is None or run.__class__ is int:
        seen = (run or 0) + 1
        if len(_RUNS) >= _SIGNATURES:
            for k in [k for k, v in _RUNS.items() if v.__class__ is int]:
                del _RUNS[k]
                _SIGHTED.pop(k, None)
        if seen >= REPEATS and len(records) > 1:
            first = _SIGHTED.pop(key, None)
            if _double(records):
                _RUNS[key] = _FAILED  # kept op by op, never built (see _double)
                COUNTS["op_by_op_runs"] += 1
            else:
                _RUNS[key] = _BUILDING
                _build_later(key, records, live, _offsets.held(first.items(), externals) if first else None)
        else:
            _RUNS[key] = seen
            if seen == 1:
                offsets = _offsets.of_run(calls, externals)
                if offsets:
                    _SIGHTED[key] = offsets


def forget_kernels(idents: set) -> None:
    """Forget the run signatures that call a kernel of ``idents`` (``ops.keep`` dropped them): their sightings
    and fused executables, which would otherwise hold the kernels' executables (runs being built stay).
    Without the queue's lock: ``ops.keep`` calls this holding the kernels' lock, which a thread holding the
    queue's lock may be waiting for (a deferred index check building a kernel). A run in use elsewhere lives
    on where it is used; the builder thread writes ``_RUNS`` without the lock too."""
    for key, value in list(_RUNS.items()):  # a snapshot, taken under the GIL in one call
        if value != _BUILDING and any(id(kernel) in idents for kernel, _ in key[0]):
            _RUNS.pop(key, None)
            _SIGHTED.pop(key, None)


def drop_runs() -> int:
    """Forget every run signature and fused executable but the runs being built (``ops._relieve``: the
    process nears its limit on memory mappings); how many fused executables were let go. A run met again is
    sighted and built anew, its executable loaded from the artifact cache."""
    dropped = 0
    for key, value in list(_RUNS.items()):  # a snapshot (the builder thread writes _RUNS too)
        if value != _BUILDING:
            dropped += value.__class__ is not int and value != _FAILED
            _RUNS.pop(key, None)
            _SIGHTED.pop(key, None)
    COUNTS["fused_dropped"] += dropped
    return dropped


def _double(records: list) -> bool:
    """A run that computes in float64 stays op by op: float64 is the dtype of numerical checks
    (``torch.autograd.gradcheck`` runs a backward twice and wants the same bits), and a fused run's
    results differ from op by op's in the last bits (XLA contracts a multiply and an add into an FMA),
    so a check whose first pass ran op by op and second fused failed (PyTorch's test_modules.py, GRU).
    A run computes in float64 where an op makes a float64 result or reads a float64 buffer from outside
    the run: an in-place op (``add_``, a gradient's accumulation) makes no result of its own, it writes
    its operand's storage. (A 0-d float64 buffer alone does not count: a number a float32 op takes.)"""
    import numpy

    for kernel, params, _, _ in records:
        for _, dtype, _ in kernel.fresh:
            if dtype is torch.float64:
                return True
        for value in params:
            if value.__class__ is Pending:
                value = value.value  # an earlier run's result (one of this run's is checked where it is made)
            if getattr(value, "dtype", None) == numpy.float64 and value.shape:
                return True
    return False


def _wiring(records: list) -> tuple:
    """The run's calls (kernel, parameter references: a number among the outside parameters, or the
    (call, output) of an earlier result), its parameters from outside the run, and how many times the run
    reads each of its results."""
    where: dict[int, tuple] = {}
    uses: dict[tuple, int] = {}
    externals: list = []
    calls = []
    for c, (kernel, params, pendings, _) in enumerate(records):
        refs = []
        for value in params:
            if value.__class__ is Pending:
                ref = where.get(id(value))
                if ref is not None:
                    uses[ref] = uses.get(ref, 0) + 1
                    refs.append(ref)
                    continue
                value = value.value  # an earlier run's result (an op queued after a cut reads it): its buffer
            refs.append(len(externals))
            externals.append(value)
        for o, result in enumerate(pendings):
            where[id(result)] = (c, o)
        calls.append((kernel, tuple(refs)))
    return tuple(calls), externals, uses


def _live(records: list, uses: dict) -> tuple:
    """The results something outside the run still holds, each a (call, output) pair."""
    live = []
    for c in range(len(records)):
        pendings = records[c][2]
        for o in range(len(pendings)):
            # the record's tuple, getrefcount's argument, and each parameter slot of the run reading it:
            # anything more is a storage (or a caller) that still holds it. (No loop variable may hold the
            # result here, nor enumerate, which keeps its last item.)
            if getrefcount(pendings[o]) > 2 + uses.get((c, o), 0):
                live.append((c, o))
    return tuple(live)


def _run_op_by_op(records: list) -> None:
    for position, (kernel, params, pendings, issuer) in enumerate(records):
        values = [p.value if p.__class__ is Pending else p for p in params]
        try:
            if _hooks.STATE._is_profiler_enabled:
                with _hooks.event("neuron::queued_op", (), {"op": kernel.name}):
                    results = kernel.execute(values)
            else:
                results = kernel.execute(values)
        except Exception as exc:
            _fail(records[position:], f"{kernel.name} (queued at {describe(issuer)}) failed when the device's "
                                      f"queue ran: {exc}")
            raise RuntimeError(f"neuron: the queued op {kernel.name}, issued at {describe(issuer)}, failed: "
                               f"{exc}\n(NEURON_LAUNCH_BLOCKING=1 runs every op when issued, so the error is "
                               "raised at the op itself)") from exc
        for pending_result, value in zip(pendings, results):
            pending_result.value = value
    COUNTS["executables"] += len(records)


def _run_fused(run, records: list, externals: list, live: tuple) -> None:
    if _hooks.STATE._is_profiler_enabled:
        with _hooks.event("neuron::fused_run", (), {"ops": run.ops, "results": run.count}):
            results = run.execute(externals)
    else:
        results = run.execute(externals)
    COUNTS["fused_runs"] += 1
    COUNTS["executables"] += 1
    for (c, o), value in zip(live, results):
        records[c][2][o].value = value
    lost = None
    for kernel, _, pendings, issuer in records:
        for result in pendings:
            if result.value is None:  # nothing outside the run held it when it ran: it never became a buffer
                if lost is None:
                    lost = _Lost(lambda name=kernel.name, issuer=issuer: (
                        f"neuron_compile: a result of {name} (issued at {describe(issuer)}) was not kept by its "
                        "fused run, but is read now. This is a bug of neuron_compile; NEURON_COMPILE_EAGER_FUSION=0 "
                        "avoids it."))
                result.value = lost


def _fail(records: list, message: str) -> None:
    lost = _Lost(message)
    for _, _, pendings, _ in records:
        for result in pendings:
            if result.value is None:
                result.value = lost


# --- building a fused run in the background ----------------------------------------------------

_worker: threading.Thread | None = None
_jobs: list = []  # fused runs to build, and other builds (``build_later``: whole ops' kernels)
_running = 0  # jobs popped and not done
_jobs_ready = threading.Condition(threading.Lock())
_closing = False
EXIT_WAIT_S = 60.0


def _build_later(key, records: list, live: tuple, baked: dict | None, rebuilds: int = 0) -> None:
    """Build the run's fused executable on the background thread, ``baked`` offsets as constants (``run_offsets``);
    the run stays op by op till then. ``rebuilds``: its builds before this one (an offset taken as a
    constant moved)."""
    build_later((key, live, [record[3] for record in records], baked, rebuilds))


def build_later(job) -> None:
    """Run ``job`` on the background thread: a fused run's (key, live, issuers, baked, rebuilds), or a callable
    (an op's kernel, ``whole_ops``: it handles its own failures), which goes before the fused runs waiting
    (they hold the decomposition it replaces: a cold LBFGS fit compiled its recursion's for seconds)."""
    global _worker
    with _jobs_ready:
        if _closing:
            return
        if callable(job):
            _jobs.insert(next((i for i, queued in enumerate(_jobs) if not callable(queued)), len(_jobs)), job)
        else:
            _jobs.append(job)
        _jobs_ready.notify()
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, name="neuron-fusion", daemon=True)
            _worker.start()


def _work() -> None:
    global _running
    while True:
        with _jobs_ready:
            while not _jobs:
                if _closing or not _jobs_ready.wait(timeout=60.0):
                    return
            job = _jobs.pop(0)
            _running += 1
        try:
            job() if callable(job) else _build_run(*job)
        finally:
            with _jobs_ready:
                _running -= 1


def _build_run(key, live, issuers, baked, rebuilds) -> None:
    from . import fusion

    try:
        run = fusion.build(key[0], live, baked)
        run.rebuilds = rebuilds
    except Exception as exc:  # noqa: BLE001 - any failure: the run stays op by op, said once
        _RUNS[key] = _FAILED
        COUNTS["fused_failures"] += 1
        _warn_failed([kernel for kernel, _ in key[0]], issuers, exc)
        return
    COUNTS["fused_builds"] += 1
    _RUNS[key] = run
    built = [k for k, v in list(_RUNS.items()) if v.__class__ is run.__class__]  # oldest first
    if len(built) > FUSED_KEPT:  # (this thread alone puts runs in; a run in use lives on where it is used)
        for k in built[:len(built) // 2]:
            _RUNS.pop(k, None)
        COUNTS["fused_dropped"] += len(built) // 2


@atexit.register
def _close() -> None:
    """At exit: builds not started are dropped, the one under way is waited for (a thread killed inside
    XLA's compiler aborts the process), for at most ``EXIT_WAIT_S``: a build that never ends (the client
    it compiles with torn down under it) must not keep the process from exiting."""
    global _closing
    with _jobs_ready:
        _closing = True
        _jobs.clear()
        _jobs_ready.notify_all()
    worker = _worker
    if worker is not None and worker.is_alive():
        worker.join(EXIT_WAIT_S)
        if worker.is_alive():
            warnings.warn(f"neuron: a fused run's build was still running {EXIT_WAIT_S:.0f} s after exit began; "
                          "exiting without it", stacklevel=1)


def signatures() -> int:
    """Run signatures sighted so far (benchmarks: a step that sights none is in the steady state)."""
    return len(_RUNS)


def wait_for_builds(timeout: float = 120.0) -> None:
    """Wait until every fused run (and whole op) queued for building is built (tests and benchmarks: a steady
    state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _idle() and not any(v == _BUILDING for v in list(_RUNS.values())):
            return
        time.sleep(0.01)
    raise TimeoutError("fused runs still building")


def _idle() -> bool:
    """No build waiting and none under way on the background thread."""
    with _jobs_ready:
        return not _jobs and not _running


def _warn_failed(kernels: list, issuers: list, exc: Exception) -> None:
    names = [kernel.name for kernel in kernels]
    first = next((i for i in issuers if i is not None), None)
    warnings.warn(f"neuron: a run of {len(names)} eager ops ({', '.join(names[:4])}{'...' if len(names) > 4 else ''}; "
                  f"first issued at {describe(first)}) could not be fused ({str(exc).splitlines()[0][:300]}); "
                  "it runs op by op", stacklevel=2)
