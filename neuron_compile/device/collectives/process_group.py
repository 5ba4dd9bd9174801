"""torch.distributed on neuron tensors: the ``neuron`` process-group backend, collectives through XLA or gloo.

``register()`` (run by the device's registration at ``import torch``) only
names the backend: ``torch.distributed.Backend.register_backend("neuron", ...)``
for the devices ``neuron`` and ``cpu``, and ``neuron`` becomes the default
backend of the ``neuron`` device. Nothing connects until
``init_process_group``; then

    dist.init_process_group("neuron")                 # neuron and CPU tensors
    dist.init_process_group()                         # the same: neuron is the accelerator
    dist.init_process_group("cpu:gloo,neuron:neuron")  # the same group again (see below)

build a ``NeuronProcessGroup``: a Python ``ProcessGroup`` holding a
``ProcessGroupGloo`` made from the same store, rank, size and timeout.

In a group whose size divides the world (the whole world, a DeviceMesh dim's
subgroup), an all-reduce, all-gather (into one tensor), reduce-scatter (from
one tensor), broadcast or all-to-all (even splits) of neuron tensors, and
their coalesced batches (``_coalescing_manager``, DDP's ``_broadcast_coalesced``;
one executable a batch), runs as XLA's collective on
the distributed PJRT client (``runtime/distributed.py``, the one compiled
graphs' collectives use): each buffer crosses there and back through DLPack,
the same host memory, and the result is written by a device copy
(``collectives/xla.py``; ``NEURON_COMPILE_DEVICE_COLLECTIVES=0`` turns it off).
Every other collective copies the neuron tensors it reads to the host (one PJRT transfer
per tensor), runs gloo's collective on the host copies, and returns a ``Work``
whose ``wait(timeout)`` waits for gloo, then writes the results back into the
neuron tensors in place (``tensor.copy_(host)``, one transfer per tensor). CPU
tensors go to gloo as they are. gloo's collective runs on its own threads, so
an ``async_op=True`` collective overlaps the caller's work until ``wait()``.

torch makes a backend that is a ``ProcessGroup`` the whole group, so the
``"cpu:gloo,neuron:neuron"`` form ends with the same group as ``"neuron"``
(CPU tensors go through this group's gloo; the gloo torch built first is
dropped).

What gloo lacks, the group adds: ``ReduceOp.AVG`` (FSDP2's default for float32
gradients) is a gloo SUM divided by the group size on the host; ``PREMUL_SUM``
(FSDP2's with a gradient divide factor) multiplies the input by its factor on
the device, then SUMs; every reduction's op is checked against its dtypes
first (``reduce_ops``: bitwise ops for integers, PREMUL_SUM for floats); the
``*_coalesced`` tensor variants are one gloo collective per pair. Failures
never hang: gloo's collectives time out after the group's timeout
(``init_process_group(timeout=...)``, or ``wait(timeout)``), and every error
is a ``RuntimeError`` naming the collective, the rank, the group size and the
group. A collective that fails while waiting on its peers (a dead peer closes
gloo's connections at once) tells ``runtime.collectives.peer_failed``, so the
process exits without the distributed XLA client's shutdown barrier, which
would wait the group's timeout for the dead. A C++ group's collectives on
neuron tensors (``init_process_group("gloo")``) are ``collectives/staged.py``'s.

What DDP and FSDP2 ask of the device besides collectives: ``storage.resize_``
(FSDP2 frees each unsharded parameter with ``resize_(0)``: here it drops the
PJRT buffer, ``storage.resize_storage``), streams and events (``module``: torch.cpu's
no-ops, the device runs in order), tracing an op called from inside DTensor's
``__torch_dispatch__`` (``trace``: ``_torch_hooks.plain_dispatch``). The first
group makes its methods, and every frame of the eager ops' compile stack
(``neuron_compile.dynamo_skips.COMPILE_STACK``: ``neuron_compile``'s but the CLI's, ``runtime``,
``passes``, ``torch_mlir``, jax; the backend hides that too), run without
Dynamo: DDP's reducer calls them from C++ inside a compiled forward, and
Dynamo would compile each frame (a 3x slower step).

A torch.distributed or Dynamo private API used here goes through ``_torch_hooks``.
"""

from __future__ import annotations

import datetime

import torch

from .. import _torch_hooks
from . import reduce_ops, xla as xla_collectives
from .. import storage as _storage
from .staged import is_neuron as _is_neuron
from .staged import peer_failed, premul_sum_on_cpp_groups, staged_collective

NAME = _torch_hooks.NAME


_c10d_library = None


def register() -> None:
    """Name the ``neuron`` backend (cheap: dictionary entries in torch.distributed, nothing connects), and
    let C++ groups (``init_process_group("gloo")``) serve neuron tensors through host copies, PREMUL_SUM
    included (``collectives/staged.py``)."""
    global _c10d_library
    if torch.distributed.is_available() and torch.distributed.is_gloo_available():
        _torch_hooks.register_process_group_backend(NAME, create, devices=[NAME, "cpu"])
        _c10d_library = _torch_hooks.collectives_on_device_through(staged_collective)
        premul_sum_on_cpp_groups()
    _torch_hooks.resize_storage_through(_storage.resize_storage)  # one attribute: FSDP2 frees storages with it


def create(options, backend_options=None) -> "NeuronProcessGroup":
    """The backend's creator (torch's extended API): a group over ``options``' store, rank, size and timeout."""
    store, rank, size, timeout, name, ranks = _torch_hooks.backend_options(options)
    return NeuronProcessGroup(store, rank, size, timeout=timeout, group_name=name, global_ranks=ranks)


class _Staging:
    """Host copies of one collective's neuron tensors, and the writes back once it finished."""

    def __init__(self):
        self.writes = []  # (tensor to write, host tensor with its result)
        self.divide = None  # AVG done as SUM: each written tensor is divided by this

    def read(self, tensor):
        """A host tensor holding ``tensor``'s values (``tensor`` itself when it is on the host)."""
        if not _is_neuron(tensor):
            return tensor
        with torch.no_grad():
            return tensor.detach().cpu().contiguous()

    def write(self, tensor):
        """A host tensor the collective writes ``tensor``'s new value into."""
        if not _is_neuron(tensor):
            if self.divide is not None:
                self.writes.append((tensor, tensor))
            return tensor
        host = torch.empty(tuple(tensor.shape), dtype=tensor.dtype)
        self.writes.append((tensor, host))
        return host

    def read_write(self, tensor):
        """A host tensor holding ``tensor``'s values that the collective overwrites with its result."""
        if not _is_neuron(tensor):
            if self.divide is not None:
                self.writes.append((tensor, tensor))
            return tensor
        host = self.read(tensor)
        self.writes.append((tensor, host))
        return host

    def finish(self) -> None:
        with torch.no_grad():
            for tensor, host in self.writes:
                if self.divide is not None:
                    if host.is_floating_point() or host.is_complex():
                        host.div_(self.divide)
                    else:
                        host.div_(self.divide, rounding_mode="trunc")
                if tensor is not host:
                    tensor.copy_(host)


class NeuronWork(_torch_hooks.PythonWork):
    """One collective: gloo's works on the host copies, and the writes back into the neuron tensors.

    ``wait(timeout)`` (or ``get_future()``, which DDP's reducer calls) waits for gloo, then writes the
    results back, once; a failure is raised again by every later call.
    """

    def __init__(self, group, collective: str, works, staging: _Staging, result):
        super().__init__()
        self._group, self._collective = group, collective
        self._works, self._staging, self._result = works, staging, result
        self._done, self._error = False, None

    def _complete(self, timeout=None) -> None:
        if self._error is not None:
            raise self._error
        if self._done:
            return
        try:
            for work in self._works:
                if timeout:
                    work.wait(timeout)
                else:
                    work.wait()
            self._staging.finish()
        except Exception as error:  # noqa: BLE001 - any failure becomes the collective's error
            self._error = self._group._error(self._collective, error)
            peer_failed(str(self._error))
            raise self._error from error
        self._done = True
        self._works = self._staging = None

    def wait(self, timeout=None) -> bool:
        if isinstance(timeout, datetime.timedelta) and timeout <= datetime.timedelta(0):
            timeout = None  # torch's kNoTimeout: the group's own timeout applies
        self._complete(timeout)
        return True

    def get_future(self):
        self._complete()
        future = torch.futures.Future()
        future.set_result(self._result)
        return future

    def is_completed(self) -> bool:
        return self._done or (self._error is None and all(w.is_completed() for w in self._works))

    def is_success(self) -> bool:
        return self._done

    def exception(self):
        return self._error

    def result(self):
        self._complete()
        return self._result

    def synchronize(self) -> None:
        self._complete()


_hidden = False


def _hide_from_dynamo() -> None:
    """Make every method C++ calls back into (DDP's reducer rebuilds its buckets with a broadcast from
    inside a compiled forward) run eagerly, and skip every frame of the eager ops' compile stack (which
    that C++ reaches too, through the device's kernels): Dynamo would otherwise compile each of them."""
    global _hidden
    if _hidden:
        return
    from ...dynamo_skips import hide_compile_stack_from_dynamo

    hide_compile_stack_from_dynamo()
    for cls in (NeuronProcessGroup, NeuronWork):
        for name, value in list(vars(cls).items()):
            if callable(value) and not name.startswith("__") and not isinstance(value, type):
                setattr(cls, name, _torch_hooks.run_eagerly(value))
    _hidden = True


def _avg(opts) -> bool:
    return opts.reduceOp.op == torch.distributed.ReduceOp.AVG


class NeuronProcessGroup(_torch_hooks.PythonProcessGroup):
    """A process group for neuron and CPU tensors over an internal gloo group on the same store."""

    def __init__(self, store, rank: int, size: int, timeout=datetime.timedelta(minutes=30), group_name="",
                 global_ranks=None):
        super().__init__(rank, size)
        _hide_from_dynamo()
        self._rank, self._size, self._timeout = rank, size, timeout
        self._name, self._desc = group_name, ""
        self._coalesced = None  # the works issued inside _coalescing_manager
        prefixed = torch.distributed.PrefixStore("neuron-gloo/", store)
        try:
            self._gloo = torch.distributed.ProcessGroupGloo(prefixed, rank, size, timeout=timeout)
        except Exception as error:  # noqa: BLE001
            raise self._error("connecting (gloo)", error) from error
        if group_name:
            self._gloo.options.group_name = group_name
        if global_ranks is not None:
            self._gloo.options.global_ranks_in_group = list(global_ranks)
        self._global_ranks = None if global_ranks is None else list(global_ranks)

    # --- what torch asks of a group ----------------------------------------------------------

    def getBackendName(self) -> str:
        return NAME

    @property
    def options(self):
        """gloo's options, as a C++ backend's: ``_timeout`` is the group's (``runtime.collectives`` reads it)."""
        return self._gloo.options

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    # a backend-less ProcessGroup keeps its name in its backends: we keep it here
    def setGroupName(self, name: str) -> None:
        self._name = name
        self._gloo.options.group_name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return f"NeuronProcessGroup(rank={self._rank}, size={self._size}, name={self._name!r})"

    def _error(self, collective: str, error: Exception) -> RuntimeError:
        where = f" of group {self._name!r}" if self._name else ""
        return RuntimeError(f"torch.distributed neuron backend: {collective} failed on rank {self._rank} "
                            f"(world size {self._size}{where}, timeout {self._timeout}): {error}")

    def _run(self, collective: str, launch, result, staging: _Staging | None = None) -> NeuronWork:
        """Start gloo's collective(s) (``launch(staging)`` returns its works), a Work that finishes it."""
        staging = staging or _Staging()
        try:
            works = launch(staging)
        except Exception as error:  # noqa: BLE001
            raise self._error(collective, error) from error
        return self._issued(NeuronWork(self, collective, works if isinstance(works, list) else [works], staging,
                                        result))

    def _issued(self, work: NeuronWork) -> NeuronWork:
        """``work``, kept among the coalesced ones inside ``_coalescing_manager`` (whose last Work waits on all)."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # torch's _coalescing_manager: the work it waits on is end_coalescing's, so that one waits on all
    def _start_coalescing(self, device=None) -> None:
        self._coalesced = []

    def _end_coalescing(self, device=None) -> NeuronWork:
        works, self._coalesced = self._coalesced or [], None
        return NeuronWork(self, "coalesced collectives", works, _Staging(), [])

    def _on_device(self, tensors, opts=None) -> str | None:
        """The reduction XLA runs itself on these tensors (``collectives/xla.run``; ``""``: a gather, no
        ``opts``), or None (gloo, staged): neuron tensors of a dtype XLA reduces, in a group whose size
        divides the world (``_replica_groups``), with ``NEURON_COMPILE_DEVICE_COLLECTIVES`` not ``0``."""
        import os

        if (not tensors or os.environ.get("NEURON_COMPILE_DEVICE_COLLECTIVES") == "0"
                or self._size < 2 or self._replica_groups() is None):
            return None
        op = "" if opts is None else xla_collectives.reduction(opts.reduceOp.op)
        for tensor in tensors:
            if (not _is_neuron(tensor) or tensor.dtype not in xla_collectives.DTYPES or tensor.numel() == 0
                    or (op == "avg" and not tensor.is_floating_point())):
                return None
        return op

    def _replica_groups(self) -> list | None:
        """This group's ranks (in group-rank order) first, then the rest of the world in groups of its size
        (XLA wants every replica in a group; only this group's ranks meet), or None where the world does
        not split so."""
        from ...lowering.functional_collectives import layout_of

        ranks = list(self._global_ranks or range(self._size))
        if not torch.distributed.is_initialized() or len(ranks) != self._size:
            return None
        return layout_of(ranks, torch.distributed.get_world_size())

    def _on_xla(self, collective: str, calls, op, result) -> NeuronWork:
        """Run ``(kind, source, output)`` collectives with XLA as one executable (``collectives/xla.run``): a
        finished Work (one of the coalesced ones inside ``_coalescing_manager``)."""
        try:
            xla_collectives.run(calls, op or None, self._replica_groups())
        except Exception as error:  # noqa: BLE001 - names the collective, the rank and the group
            raise self._error(f"{collective} (XLA, on the device's buffers)", error) from error
        return self._issued(NeuronWork(self, collective, [], _Staging(), result))

    def _reduction(self, collective: str, opts, tensors, inputs, in_place: bool) -> tuple:
        """``opts`` (a reduction's), its op checked against ``tensors``' dtypes (``reduce_ops.check``), and
        ``inputs``: a PREMUL_SUM becomes a SUM of ``inputs`` multiplied by its factor (in place, or copies
        where the collective only reads them). Returns (opts, inputs)."""
        red_op = opts.reduceOp.op
        try:
            reduce_ops.check(red_op, tensors)
        except TypeError as error:
            raise self._error(collective, error) from error
        if red_op != torch.distributed.ReduceOp.PREMUL_SUM:
            return opts, inputs
        factor = opts.reduceOp.factor
        opts.reduceOp = torch.distributed.ReduceOp.SUM
        return opts, [reduce_ops.premultiply(t, factor, in_place) for t in inputs]

    def _reduce_staging(self, opts) -> tuple:
        """A staging for a reduction; AVG (which gloo lacks) becomes SUM, divided by the size afterwards."""
        staging = _Staging()
        if _avg(opts):
            staging.divide = self._size
            opts.reduceOp = torch.distributed.ReduceOp.SUM
        return staging, opts

    # --- collectives -------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts, tensors = self._reduction("allreduce", opts or _torch_hooks.collective_options("Allreduce"), tensors,
                                        tensors, in_place=True)
        op = self._on_device(tensors, opts)
        if op is not None:  # XLA's own all_reduce on the tensors' buffers: no host copy
            return self._on_xla("allreduce", [("all_reduce", t, t) for t in tensors], op, tensors)
        staging, opts = self._reduce_staging(opts)
        return self._run("allreduce", lambda s: self._gloo.allreduce([s.read_write(t) for t in tensors], opts),
                         tensors, staging)

    def allreduce_coalesced(self, tensors, opts=None):
        opts, tensors = self._reduction("allreduce_coalesced",
                                        opts or _torch_hooks.collective_options("AllreduceCoalesced"), tensors,
                                        tensors, in_place=True)
        op = self._on_device(tensors, opts)
        if op is not None:
            return self._on_xla("allreduce_coalesced", [("all_reduce", t, t) for t in tensors], op, tensors)
        staging, opts = self._reduce_staging(opts)
        return self._run("allreduce_coalesced",
                         lambda s: self._gloo.allreduce_coalesced([s.read_write(t) for t in tensors], opts),
                         tensors, staging)

    def reduce(self, tensors, opts=None):
        opts, tensors = self._reduction("reduce", opts or _torch_hooks.collective_options("Reduce"), tensors, tensors,
                                        in_place=True)
        staging, opts = self._reduce_staging(opts)
        return self._run("reduce", lambda s: self._gloo.reduce([s.read_write(t) for t in tensors], opts),
                         tensors, staging)

    def broadcast(self, tensors, opts=None):
        opts = opts or _torch_hooks.collective_options("Broadcast")
        if self._on_device(tensors) is not None and opts.rootTensor == 0:  # every rank takes the root's rows
            return self._on_xla("broadcast", [(("broadcast", opts.rootRank), t, t) for t in tensors], None, tensors)
        root = opts.rootRank == self._rank

        def launch(s):
            return self._gloo.broadcast([s.read_write(t) if root else s.write(t) for t in tensors], opts)

        return self._run("broadcast", launch, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _torch_hooks.collective_options("Allgather")

        def launch(s):
            return self._gloo.allgather([[s.write(o) for o in outs] for outs in output_tensors],
                                        [s.read(t) for t in input_tensors], opts)

        return self._run("allgather", launch, output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts or _torch_hooks.collective_options("Allgather")

        def launch(s):
            return self._gloo.allgather_coalesced([[s.write(o) for o in outs] for outs in output_lists],
                                                  [s.read(t) for t in input_tensors], opts)

        return self._run("allgather_coalesced", launch, output_lists)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or _torch_hooks.collective_options("Allgather")
        if self._on_device([output, input]) is not None and output.numel() == input.numel() * self._size:
            return self._on_xla("all_gather_into_tensor", [("all_gather", input, output)], None, [output])
        return self._run("all_gather_into_tensor",
                         lambda s: self._gloo._allgather_base(s.write(output), s.read(input), opts), [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _torch_hooks.collective_options("Allgather")
        if (self._on_device(list(outputs) + list(inputs)) is not None
                and all(o.numel() == i.numel() * self._size for o, i in zip(outputs, inputs))):
            return self._on_xla("all_gather_into_tensor_coalesced",
                                [("all_gather", i, o) for o, i in zip(outputs, inputs)], None, outputs)

        def launch(s):
            return [self._gloo._allgather_base(s.write(o), s.read(i), opts) for o, i in zip(outputs, inputs)]

        return self._run("all_gather_into_tensor_coalesced", launch, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or _torch_hooks.collective_options("ReduceScatter")
        sizes = [len(ins) for ins in input_lists]
        inputs = [t for ins in input_lists for t in ins]
        opts, flat = self._reduction("reduce_scatter", opts, list(output_tensors) + inputs, inputs, in_place=False)
        input_lists = [flat[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))]
        staging, opts = self._reduce_staging(opts)

        def launch(s):
            return self._gloo.reduce_scatter([s.write(o) for o in output_tensors],
                                             [[s.read(t) for t in ins] for ins in input_lists], opts)

        return self._run("reduce_scatter", launch, output_tensors, staging)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or _torch_hooks.collective_options("ReduceScatter")
        opts, (input,) = self._reduction("reduce_scatter_tensor", opts, [output, input], [input], in_place=False)
        op = self._on_device([output, input], opts)
        if op is not None and input.numel() == output.numel() * self._size:
            return self._on_xla("reduce_scatter_tensor", [("reduce_scatter", input, output)], op, [output])
        staging, opts = self._reduce_staging(opts)
        return self._run("reduce_scatter_tensor",
                         lambda s: self._gloo._reduce_scatter_base(s.write(output), s.read(input), opts),
                         [output], staging)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts, inputs = self._reduction("reduce_scatter_tensor_coalesced",
                                       opts or _torch_hooks.collective_options("ReduceScatter"),
                                       list(outputs) + list(inputs), list(inputs), in_place=False)
        op = self._on_device(list(outputs) + list(inputs), opts)
        if op is not None and all(i.numel() == o.numel() * self._size for o, i in zip(outputs, inputs)):
            return self._on_xla("reduce_scatter_tensor_coalesced",
                                [("reduce_scatter", i, o) for o, i in zip(outputs, inputs)], op, outputs)
        staging, opts = self._reduce_staging(opts)

        def launch(s):
            return [self._gloo._reduce_scatter_base(s.write(o), s.read(i), opts) for o, i in zip(outputs, inputs)]

        return self._run("reduce_scatter_tensor_coalesced", launch, outputs, staging)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or _torch_hooks.collective_options("AllToAll")
        even = all(len(set(splits)) <= 1 for splits in (output_split_sizes, input_split_sizes))
        if (even and self._on_device([output, input]) is not None and input.dim() > 0
                and input.shape[0] % self._size == 0 and tuple(output.shape) == tuple(input.shape)):
            return self._on_xla("all_to_all_single", [("all_to_all", input, output)], None, [output])

        def launch(s):
            return self._gloo.alltoall_base(s.write(output), s.read(input), list(output_split_sizes),
                                            list(input_split_sizes), opts)

        return self._run("all_to_all_single", launch, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _torch_hooks.collective_options("AllToAll")

        def launch(s):
            return self._gloo.alltoall([s.write(o) for o in output_tensors], [s.read(t) for t in input_tensors],
                                       opts)

        return self._run("alltoall", launch, output_tensors)

    def gather(self, output_lists, input_tensors, opts=None):
        opts = opts or _torch_hooks.collective_options("Gather")

        def launch(s):
            return self._gloo.gather([[s.write(o) for o in outs] for outs in output_lists],
                                     [s.read(t) for t in input_tensors], opts)

        return self._run("gather", launch, output_lists)

    def scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or _torch_hooks.collective_options("Scatter")

        def launch(s):
            return self._gloo.scatter([s.write(o) for o in output_tensors],
                                      [[s.read(t) for t in ins] for ins in input_lists], opts)

        return self._run("scatter", launch, output_tensors)

    def send(self, tensors, dst_rank, tag=0):
        return self._run(f"send to rank {dst_rank}",
                         lambda s: self._gloo.send([s.read(t) for t in tensors], dst_rank, tag), tensors)

    def recv(self, tensors, src_rank, tag=0):
        return self._run(f"recv from rank {src_rank}",
                         lambda s: self._gloo.recv([s.write(t) for t in tensors], src_rank, tag), tensors)

    def recv_anysource(self, tensors, tag=0):
        return self._run("recv from any rank",
                         lambda s: self._gloo.recv_anysource([s.write(t) for t in tensors], tag), tensors)

    def barrier(self, opts=None):
        opts = opts or _torch_hooks.collective_options("Barrier")
        return self._run("barrier", lambda s: self._gloo.barrier(opts), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        try:
            if timeout is None:
                return self._gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
            return self._gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        except Exception as error:  # noqa: BLE001
            raise self._error("monitored_barrier", error) from error

    def shutdown(self) -> None:
        self._gloo.shutdown()

    def abort(self) -> None:
        self._gloo.abort()
