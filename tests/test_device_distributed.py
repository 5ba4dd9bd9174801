"""torch.distributed on neuron tensors: the ``neuron`` process-group backend (``neuron_compile/device/collectives/process_group.py``).

Two ranks under torchrun (one launch for the module: starting two processes
that import torch and jax is most of the time) train the same tiny MLP with
DDP (eager and ``torch.compile(backend="neuron")``) and FSDP2 on ``neuron``
tensors and, in the same processes, on CPU tensors over a plain gloo group:
losses and final parameters must match; so does a CPU script that names no
device (``fully_shard`` with no mesh moves it to the accelerator, ``neuron``,
as it would to CUDA). The same launch checks the three
ways to name the backend and that a collective a peer never joins fails
after the group's timeout, naming the collective and the rank. In-process
tests (world size 1) cover each collective's staging and the device pieces
DDP and FSDP2 need (``storage.resize_``, streams, an op traced from inside
DTensor's dispatch).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

WORKER = textwrap.dedent('''
    import datetime, json, os, sys, time, traceback
    import torch, torch.distributed as dist
    import torch.nn.functional as F

    out_dir, scenarios = sys.argv[1], sys.argv[2].split(",")
    dist.init_process_group()  # no backend named: the accelerator's (neuron) default backend
    rank = dist.get_rank()
    cpu_group = dist.new_group(backend="gloo")  # the CPU reference runs over plain gloo
    results = {"world": type(dist.group.WORLD).__name__}


    class MLP(torch.nn.Module):
        # user code, as models are: Dynamo starts no frame in torch's own files, so a bare
        # nn.Sequential of torch layers under DDP compiles nothing
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))


    def mlp():
        return MLP()


    def train(model, step_model, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)  # each rank its own batches: the gradients are averaged
        losses = []
        for _ in range(3):
            x, y = torch.randn(4, 8), torch.randn(4, 4)
            opt.zero_grad()
            loss = F.mse_loss(step_model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses


    def ddp(device, compiled=False):
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(rank)  # the ranks start apart: DDP broadcasts rank 0's parameters
        from neuron_compile.device.opkernel import COUNTS
        model = mlp().to(device)
        wrapped = DDP(model, process_group=cpu_group if device == "cpu" else None)
        if compiled:
            wrapped = torch.compile(wrapped, backend="neuron")
        copies, on_device = COUNTS["host_copies"], COUNTS.get("device_collectives", 0)
        losses = train(model, wrapped, device)
        counts = {"host_copies": COUNTS["host_copies"] - copies,
                  "device_collectives": COUNTS.get("device_collectives", 0) - on_device}
        return losses, [p.detach().cpu().reshape(-1).tolist() for p in model.parameters()], counts


    def staged(run):
        """The same neuron run with its collectives staged through gloo (the device's off switch)."""
        os.environ["NEURON_COMPILE_DEVICE_COLLECTIVES"] = "0"
        try:
            return run("neuron")
        finally:
            del os.environ["NEURON_COMPILE_DEVICE_COLLECTIVES"]


    def fsdp2(device):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        torch.manual_seed(0)
        model = mlp().to(device)
        mesh = DeviceMesh.from_group(cpu_group if device == "cpu" else dist.group.WORLD, device)
        for layer in (model.fc1, model.fc2, model):
            fully_shard(layer, mesh=mesh)
        from neuron_compile.device.opkernel import COUNTS
        copies, on_device = COUNTS["host_copies"], COUNTS.get("device_collectives", 0)
        losses = train(model, model, device)
        counts = {"host_copies": COUNTS["host_copies"] - copies,
                  "device_collectives": COUNTS.get("device_collectives", 0) - on_device}
        return losses, [p.full_tensor().detach().cpu().reshape(-1).tolist() for p in model.parameters()], counts


    def fsdp2_no_device_named():
        # a CPU script that names no device: fully_shard with no mesh takes the current accelerator
        # (neuron, as it would take CUDA), moves the parameters there (`param.data = param.to(device)`)
        # and the inputs too; the reference is the same script over a CPU mesh
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        found = {}
        for name, mesh in (("neuron", None), ("cpu", DeviceMesh.from_group(cpu_group, "cpu"))):
            torch.manual_seed(0)
            model = mlp()
            for layer in (model.fc1, model.fc2, model):
                fully_shard(layer, mesh=mesh)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            torch.manual_seed(100 + rank)
            losses = []
            for _ in range(3):
                opt.zero_grad()
                loss = model(torch.randn(4, 8)).square().mean()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            found[name] = (losses, [p.full_tensor().detach().cpu().reshape(-1).tolist() for p in model.parameters()])
            found[name + "_device"] = str(next(model.parameters()).device)
        return found


    def groups():
        found = {}
        for backend in ("neuron", "cpu:gloo,neuron:neuron"):
            group = dist.new_group(backend=backend)
            t = torch.full((3,), float(rank + 1), device="neuron")
            dist.all_reduce(t, group=group)
            c = torch.full((2,), float(rank + 1))
            dist.all_reduce(c, group=group)
            found[backend] = [type(group).__name__, t.cpu().tolist(), c.tolist()]
        return found


    def timeout():
        short = dist.new_group(backend="neuron", timeout=datetime.timedelta(seconds=2))
        found = {}
        if rank == 0:  # rank 1 never joins: rank 0's all_reduce must fail after 2 s, not hang
            start = time.time()
            try:
                dist.all_reduce(torch.ones(2), group=short)
            except RuntimeError as e:
                found = {"error": str(e), "seconds": time.time() - start}
        dist.barrier()
        return found


    for name in scenarios:
        start = time.time()
        try:
            if name == "ddp":
                results[name] = {"neuron": ddp("neuron"), "cpu": ddp("cpu")}
            elif name == "ddp_compiled":
                import neuron_compile
                before = len(neuron_compile.compile_reports())
                results[name] = {"neuron": ddp("neuron", compiled=True), "cpu": ddp("cpu")}
                # the graphs our backend compiled from Dynamo (eager device ops report kind "eager")
                results["compiled_graphs"] = [r.kind for r in neuron_compile.compile_reports()[before:]
                                              if r.kind != "eager"]
            elif name in ("ddp_staged", "fsdp2_staged"):
                results[name] = staged(ddp if name == "ddp_staged" else fsdp2)
            elif name == "fsdp2":
                results[name] = {"neuron": fsdp2("neuron"), "cpu": fsdp2("cpu")}
            else:
                results[name] = globals()[name]()
        except Exception:
            results[name] = {"exception": traceback.format_exc()}
        results.setdefault("seconds", {})[name] = time.time() - start
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
''')

SCENARIOS = "ddp,ddp_staged,fsdp2,fsdp2_staged,fsdp2_no_device_named,ddp_compiled,groups,timeout"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, launch_two_ranks):
    """Both ranks' results (one torchrun launch of every scenario)."""
    return launch_two_ranks(tmp_path_factory.mktemp("ranks"), WORKER, args=(SCENARIOS,))


def _check_training(results, name):
    for rank, result in enumerate(results):
        run = result[name]
        assert "exception" not in run, f"rank {rank}:\n{run['exception']}"
        (losses, params, *_), (cpu_losses, cpu_params, *_) = run["neuron"], run["cpu"]
        assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
        for p, q in zip(params, cpu_params):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    # the ranks trained on different batches, and ended with the same parameters
    assert results[0][name]["neuron"][0] != results[1][name]["neuron"][0]
    for p, q in zip(results[0][name]["neuron"][1], results[1][name]["neuron"][1]):
        assert_close(torch.tensor(p), torch.tensor(q), rtol=0, atol=0)


@pytest.mark.slow
def test_ddp_on_neuron_trains_as_on_cpu(two_ranks):
    assert two_ranks[0]["world"] == "NeuronProcessGroup"  # init_process_group() with no backend named
    _check_training(two_ranks, "ddp")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_eager_collectives_on_neuron_tensors_run_with_xla_on_their_buffers_not_through_host_copies(two_ranks, name):
    """DDP's bucket all-reduces and bucket-rebuild broadcasts, FSDP2's all-gathers and reduce-scatters of
    neuron tensors run as XLA's collectives on the distributed client (the buffers cross by DLPack): each
    saves the host copies gloo's staging costs, with the same parameters after training as the staged run (and as CPU:
    ``test_ddp_on_neuron_trains_as_on_cpu``, ``test_fsdp2_on_neuron_trains_as_on_cpu``)."""
    for rank, result in enumerate(two_ranks):
        _, params, device = result[name]["neuron"]
        _, staged_params, staged = result[name + "_staged"]
        assert device["device_collectives"] >= 3 and staged["device_collectives"] == 0, (device, staged)
        # DDP's reducer rebuilds its buckets after the first step with two broadcasts of rank 0's bucket
        # indices and sizes (reducer.cpp sync_bucket_indices), on the parameters' device: staged, a broadcast
        # reads and writes back on rank 0 and only writes back on the others
        broadcasts = 2 if name == "ddp" else 0
        saved = 2 * (device["device_collectives"] - broadcasts) + (2 if rank == 0 else 1) * broadcasts
        assert staged["host_copies"] - device["host_copies"] == saved, (rank, device, staged)
        for p, q in zip(params, staged_params):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_fsdp2_on_neuron_trains_as_on_cpu(two_ranks):
    _check_training(two_ranks, "fsdp2")


@pytest.mark.slow
def test_a_cpu_fsdp2_script_naming_no_device_trains_on_the_accelerator_as_on_cuda(two_ranks):
    """``fully_shard(model)`` with no mesh picks the current accelerator, ``neuron``, as it picks CUDA, and
    moves the CPU parameters there with ``param.data = param.to(device)``: that used to raise
    "incompatible tensor type" (installing the package broke CPU FSDP2 scripts)."""
    _check_training(two_ranks, "fsdp2_no_device_named")
    assert [r["fsdp2_no_device_named"]["neuron_device"] for r in two_ranks] == ["neuron:0", "neuron:1"]  # one device per local rank


@pytest.mark.slow
def test_torch_compile_of_ddp_on_neuron_trains_as_on_cpu(two_ranks):
    _check_training(two_ranks, "ddp_compiled")
    # Dynamo compiles none of the device's frames that DDP's reducer calls from C++ (without the skip
    # folders it compiled 19 graphs of them, all inference graphs of the device's own code)
    assert "inference" not in two_ranks[0]["compiled_graphs"]


@pytest.mark.slow
def test_torch_compile_of_ddp_on_neuron_compiles_the_model(two_ranks):
    assert {"forward", "backward"} <= set(two_ranks[0]["compiled_graphs"])


@pytest.mark.slow
def test_every_way_to_name_the_backend_gives_the_neuron_group(two_ranks):
    for rank, result in enumerate(two_ranks):
        found = result["groups"]
        assert "exception" not in found, found.get("exception")
        for backend in ("neuron", "cpu:gloo,neuron:neuron"):
            kind, neuron_sum, cpu_sum = found[backend]
            assert kind == "NeuronProcessGroup", backend
            assert neuron_sum == [3.0] * 3 and cpu_sum == [3.0] * 2, (rank, backend)


@pytest.mark.slow
def test_a_collective_no_peer_joins_fails_after_the_timeout_naming_it_and_the_rank(two_ranks):
    found = two_ranks[0]["timeout"]
    assert "error" in found, found
    assert "allreduce failed on rank 0" in found["error"] and "world size 2" in found["error"], found
    assert "Timed out" in found["error"] and found["seconds"] < 30, found


# --- one process (world size 1): each collective's staging -------------------------------------------

@pytest.fixture
def group():
    assert not dist.is_initialized()
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def N(t):
    return t.to("neuron")


def test_collectives_write_their_results_into_neuron_tensors(group):
    from neuron_compile.device.collectives.process_group import NeuronProcessGroup

    assert isinstance(group, NeuronProcessGroup) and dist.get_backend() == "neuron"
    x = torch.arange(6.0)
    t = N(x)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # gloo has no AVG: a SUM divided by the size
    assert_close(t.cpu(), x)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() and work.is_completed()
    out = N(torch.zeros(6))
    dist.all_gather_into_tensor(out, t * 2)
    assert_close(out.cpu(), x * 2)
    part = N(torch.zeros(6))
    dist.reduce_scatter_tensor(part, t * 3, op=dist.ReduceOp.AVG)
    assert_close(part.cpu(), x * 3)
    outs = [N(torch.zeros(6))]
    dist.all_gather(outs, t + 1)
    assert_close(outs[0].cpu(), x + 1)
    dist.broadcast(t, 0)
    a2a = N(torch.zeros(6))
    dist.all_to_all_single(a2a, t - 1)
    assert_close(a2a.cpu(), x - 1)
    view = N(torch.zeros(2, 6))[1]  # a view: the result is written into its storage
    view.copy_(t)
    dist.all_reduce(view)
    assert_close(view.cpu(), x)
    ints = N(torch.tensor([3, 5]))
    dist.all_reduce(ints, op=dist.ReduceOp.MAX)
    assert ints.cpu().tolist() == [3, 5]
    with dist._coalescing_manager(group, torch.device("neuron"), async_ops=True) as cm:
        dist.all_reduce(t)
    cm.wait()
    objects = [None]
    dist.all_gather_object(objects, {"rank": 0})
    assert objects == [{"rank": 0}]
    dist.barrier()


def test_a_failing_collective_names_itself_and_the_rank(group):
    with pytest.raises(RuntimeError, match=r"all_gather_into_tensor failed on rank 0 \(world size 1"):
        dist.all_gather_into_tensor(N(torch.zeros(5)), N(torch.ones(3)))


def test_ddp_broadcasts_module_states_through_cpp(group):
    """DDP's constructor broadcasts the parameters from C++ (``_broadcast_coalesced``): our Python
    ``broadcast`` is reached through torch's ProcessGroup trampoline."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(3, 2).to("neuron")
    before = [p.detach().cpu() for p in model.parameters()]
    ddp = DDP(model)
    ddp(N(torch.randn(4, 3))).sum().backward()
    for p, b in zip(model.parameters(), before):
        assert_close(p.detach().cpu(), b)
        assert p.grad is not None and p.grad.device.type == "neuron"


# --- what DDP and FSDP2 ask of the device ---------------------------------------------------------

def test_storage_resize_frees_and_reallocates_a_neuron_storage():
    from neuron_compile.device import storage

    t = N(torch.arange(4.0))
    s = t.untyped_storage()
    s.resize_(0)  # FSDP2's free_storage: the buffer goes, the extent stays
    assert storage.data_of(t).buffer is None and storage.data_of(t).numel == 4
    s.resize_(16)  # alloc_storage: nothing to allocate until written
    t.copy_(torch.tensor([4.0, 3.0, 2.0, 1.0]))
    assert t.cpu().tolist() == [4.0, 3.0, 2.0, 1.0]
    with pytest.raises(NotImplementedError, match="holding data"):
        s.resize_(32)
    cpu = torch.zeros(2).untyped_storage()
    cpu.resize_(16)
    assert cpu.nbytes() == 16


def test_streams_and_events_exist_and_order_nothing():
    stream = torch.neuron.Stream(priority=-1)
    with torch.neuron.stream(stream):
        x = N(torch.ones(2)) + 1
    torch.neuron.current_stream().wait_stream(stream)
    event = torch.neuron.Event()
    event.record()
    torch.neuron.current_stream().wait_event(event)
    assert event.query() and x.cpu().tolist() == [2.0, 2.0]


def test_an_op_traced_from_inside_dtensor_dispatch_is_right(group):
    """DTensor runs the local op with most dispatch keys excluded (Functionalize among them): the op's
    trace for the device must not see that (FSDP2's optimizer step)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = DeviceMesh.from_group(group, "neuron")
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    da, db = distribute_tensor(N(a), mesh, [Shard(0)]), distribute_tensor(N(b), mesh, [Shard(0)])
    with torch.no_grad():
        torch._foreach_add_([da], [db], alpha=-0.37)  # a signature no other test compiles
    assert_close(da.full_tensor().cpu(), a - 0.37 * b)
