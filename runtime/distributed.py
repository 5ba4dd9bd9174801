"""XLA executables holding collectives: one PJRT CPU client spanning the torch.distributed world.

A graph whose collectives are compiled into it (StableHLO ``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``) runs as one executable of
``world`` replicas, one per process, and XLA moves the data itself over gloo
(jaxlib's CPU collectives). What that needs, made once per process on the
first such graph, by every rank at once (as each rank compiles the same
graph):

    coordinator  jaxlib's distributed runtime service, started by rank 0 on
                 the host torch.distributed's store listens on (never on every
                 interface), on a free port; its address travels to the other
                 ranks through that store
    client       a distributed runtime client per process (heartbeats, the
                 key-value store gloo meets through), with torch.distributed's
                 timeout for the default group
    pjrt         a CPU client made with that client and gloo TCP collectives:
                 ``world`` devices, one addressable here

Graphs without collectives keep the process's own local client
(``executor._client``); buffers of the two clients are not mixed: a tensor
reaches a distributed executable through DLPack on this client's device (a
device's tensor from its local-client buffer, and its results back the same
way: ``executor.DistributedBridge``, the same host memory).

Failure: every run of a distributed executable is waited on with the group's
timeout. A peer that never joins, raises or dies makes the run raise
``CollectiveError`` naming the rank, the graph and its collectives, never hang;
after that the client is broken and every later run says so at once. A dead
peer is seen at once by a collective in flight (gloo's connection closes: the
error comes within milliseconds); the process group's collectives whose
transport to a peer failed say so too (``peer_failed``: that leaves the
client usable). Either way this process then leaves at exit without the
shutdown barrier, which would wait for the dead peer: its client is made with ``shutdown_on_destruction=False``
and ``shutdown`` skips the barrier, so the survivors exit with their error
a moment after it is raised. A slow peer is no failure: the barrier at exit
waits for every rank up to the group's timeout, and heartbeats come from
jaxlib's own threads, however long a step takes.
A peer whose heartbeats stop for ``heartbeat_s`` (the group's timeout, at most
100 s: jax's default) while no collective of this rank runs ends the other
processes too: jaxlib's coordinator reports it and every client aborts with
its message (its Python callback for it does not convert the status: none is
given). Nothing here touches the cache: an executable is stored after it
compiles, before any run.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import ipaddress
import logging
import os
import queue
import socket
import threading

import numpy as np

log = logging.getLogger("neuron_compile")

__all__ = ["CollectiveError", "DistributedTarget", "peer_failed", "target"]

_STORE_KEY = "neuron_compile/xla_coordinator"
_HEARTBEAT_S = 100  # at most: a peer silent this long is dead (jax's default; heartbeats are jaxlib's threads')


class CollectiveError(RuntimeError):
    """A run of an executable with collectives failed or timed out on this rank."""


def _torch_world():
    """(store, rank, world, timeout seconds) of torch.distributed's default group, or None.

    The one place that reads torch.distributed's private state: the default
    store (``_get_default_store``) and the timeout the default group was made
    with (its CPU backend's ``options._timeout``, or a Python group's own
    ``options._timeout``; the backend-wide default where neither can be read). tests/test_distributed_collectives.py checks
    they still exist.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    group = dist.group.WORLD
    try:
        timeout = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        # a Python group (the device's ``neuron`` one) has no C++ backend: its own ``options``, where it has them
        timeout = getattr(getattr(group, "options", None), "_timeout", None)
        timeout = timeout or c10d._get_default_timeout(dist.get_backend())
    return store, dist.get_rank(), dist.get_world_size(), timeout.total_seconds()


def _store_host(store) -> str:
    """The address the store's server listens on (a PrefixStore wraps it), else MASTER_ADDR."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", None) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    return socket.gethostbyname(host) if host != "localhost" else "127.0.0.1"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class DistributedTarget:
    """This process's share of a distributed PJRT CPU client: what executables with collectives
    compile for, load with and run on."""

    def __init__(self, rank: int, world: int, timeout_s: float, store):
        from jaxlib import _jax, xla_client

        from .xla_logs import quiet_runtime_logs

        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.broken: str | None = None  # why later runs raise at once
        self.peer_lost: str | None = None  # why the exit skips the shutdown barrier (and ``broken``)
        host = _store_host(store)
        seconds = max(1, int(timeout_s))
        self.heartbeat_s = heartbeat = max(1, min(seconds, _HEARTBEAT_S))
        quiet_runtime_logs()  # the coordinator's INFO lines stay off the user's terminal
        self.service = None
        if rank == 0:
            address = f"{host}:{_free_port(host)}"
            self.service = _jax.get_distributed_runtime_service(
                address, world, heartbeat_timeout=heartbeat, shutdown_timeout=seconds)
            store.set(_STORE_KEY, address)
        address = store.get(_STORE_KEY).decode()
        # shutdown_on_destruction=False: the shutdown barrier is ``shutdown``'s to run, or to skip after a peer
        # died (the default runs it from the destructor too, where it waits the whole timeout for the dead)
        self.client = _jax.get_distributed_runtime_client(
            address, rank, init_timeout=seconds, shutdown_timeout=seconds, heartbeat_timeout=heartbeat,
            shutdown_on_destruction=False, use_compression=True)
        self.client.connect()
        # gloo listens where this rank's torch.distributed traffic goes: loopback stays loopback
        local = ipaddress.ip_address(host).is_loopback
        collectives = _jax.make_gloo_tcp_collectives(distributed_client=self.client,
                                                     hostname=host if local else None)
        self.pjrt = xla_client.make_cpu_client(asynchronous=False, distributed_client=self.client,
                                               node_id=rank, num_nodes=world, collectives=collectives)
        self.devices = sorted(self.pjrt.devices(), key=lambda d: d.process_index)
        self.device = self.pjrt.local_devices()[0]
        self.device_list = xla_client.DeviceList(tuple(self.devices))
        self._worker = _Worker(f"neuron_compile-collectives-rank{rank}")
        atexit.register(self.shutdown)

    # -- compile and load

    def compile_options(self):
        from jaxlib import xla_client

        options = xla_client.CompileOptions()
        options.num_replicas = self.world
        options.num_partitions = 1
        # replica i is rank i's device
        options.device_assignment = xla_client.DeviceAssignment.create(np.array([[d.id] for d in self.devices]))
        return options

    def compile(self, text: str):
        return self.pjrt.compile_and_load(text, self.device_list, self.compile_options())

    def deserialize(self, data: bytes):
        return self.pjrt.deserialize_executable(data, self.device_list, self.compile_options())

    def serialize(self, loaded) -> bytes:
        return bytes(self.pjrt.serialize_executable(loaded))

    # -- run

    def run(self, work, what: str):
        """``work()`` (an execute) on the worker thread, waited on with the group's timeout."""
        if self.broken:
            raise CollectiveError(f"rank {self.rank}: {what} cannot run: the distributed XLA client broke "
                                  f"earlier ({self.broken})")
        done = self._worker.submit(work)
        if not done.wait(self.timeout_s):
            self.broken = f"{what} timed out after {datetime.timedelta(seconds=self.timeout_s)}"
            raise CollectiveError(
                f"rank {self.rank} of {self.world}: {what} did not complete within "
                f"{datetime.timedelta(seconds=self.timeout_s)} (torch.distributed's timeout for the default "
                f"group): a peer never joined it, raised or died. Later runs of executables with collectives "
                f"raise at once; look at the other ranks' logs for the first error.")
        if done.error is not None:
            # a collective that failed (gloo's connection to a dead peer closed, ranks out of step) leaves XLA's
            # gloo context unusable: later runs raise at once, and the exit skips the barrier
            self.broken = f"{what} failed: {done.error}"
            raise CollectiveError(f"rank {self.rank} of {self.world}: {what} failed: {done.error}") from done.error
        return done.value

    def shutdown(self) -> None:
        """Leave the distributed runtime (at exit): the client's shutdown is a barrier of every rank, run
        only while the world is whole. After a failure (``broken``, ``peer_lost``) nothing is shut down: the
        barrier would wait the group's timeout for a peer that is gone, and stopping rank 0's coordinator under
        its own live client makes that client abort (SIGABRT, seconds later). So the coordinator is also
        kept from the interpreter's teardown, which would destroy it before the client (executables hold
        the client): the process is ending, and its threads end with it."""
        client, service = getattr(self, "client", None), getattr(self, "service", None)
        if self.broken or self.peer_lost:
            log.debug("rank %d leaves the distributed XLA client without its shutdown barrier: %s", self.rank,
                      self.broken or self.peer_lost)
            if service is not None:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(service))  # never destroyed: see above
            return
        self.client = self.service = None
        from .xla_logs import quiet_runtime_logs

        quiet_runtime_logs()  # the coordinator's goodbye lines (INFO) stay off the terminal
        if client is not None:
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001 - a peer already gone: nothing left to wait for
                pass
        if service is not None:
            service.shutdown()


class _Done:
    __slots__ = ("event", "value", "error")

    def __init__(self):
        self.event, self.value, self.error = threading.Event(), None, None

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)


class _Worker:
    """One daemon thread running the distributed executes: a stuck collective leaves the caller
    free to raise (and the process free to exit)."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def submit(self, work) -> _Done:
        done = _Done()
        self._jobs.put((work, done))
        return done

    def _loop(self) -> None:
        while True:
            work, done = self._jobs.get()
            try:
                done.value = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                done.error = exc
            # before the caller wakes: the job (its input buffers) is not this thread's to keep until the next
            # one (a device tensor's buffer crossed to this client counts a reference more while it lives,
            # and a buffer with another holder is copied before an executable may take it: donation)
            work = None
            done.event.set()
            done = None


_TARGET: DistributedTarget | None = None
_LOCK = threading.Lock()


def peer_failed(reason: str) -> None:
    """A collective of this process lost a peer (torch.distributed's, outside any executable: its
    connection closed, or it timed out): the world may no longer be whole, so the exit skips the shutdown
    barrier (``shutdown``); executables still run (one whose peer is gone fails at once). Nothing happens
    where no distributed client was made."""
    if _TARGET is not None and not _TARGET.peer_lost:
        _TARGET.peer_lost = reason


def target(replicas: int) -> DistributedTarget:
    """The distributed client for executables of ``replicas`` replicas, made on first use.

    Raises ``CollectiveError`` when torch.distributed is not initialized or its
    world is not ``replicas`` processes (an artifact compiled for another world).
    """
    global _TARGET
    with _LOCK:
        if _TARGET is None:
            world = _torch_world()
            if world is None:
                raise CollectiveError(f"an executable of {replicas} replicas needs torch.distributed initialized "
                                      f"with {replicas} processes (dist.init_process_group under torchrun)")
            store, rank, size, timeout_s = world
            if size != replicas:
                raise CollectiveError(f"an executable of {replicas} replicas cannot run in a world of {size}")
            _TARGET = DistributedTarget(rank, size, timeout_s, store)
        elif _TARGET.world != replicas:
            raise CollectiveError(f"an executable of {replicas} replicas cannot run in a world of {_TARGET.world}")
        return _TARGET
