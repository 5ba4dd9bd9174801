"""torch.distributed's own APIs compiled with ``backend="neuron"``, collectives inside the XLA executable.

Two ranks under torchrun (gloo on 127.0.0.1, CPU tensors), default options:
each scenario trains a model compiled with the neuron backend next to the
same model run eagerly in the same processes, and records losses and
gradients (or parameters) of both; the tests compare them. Scenarios:
tensor parallel (``parallelize_module``, Colwise/Rowwise), SimpleFSDP-style
DTensor parameters (all_gather forward, reduce_scatter backward), a
``dist.all_reduce`` inside a compiled function, DDP (DDPOptimizer), FSDP2 with
per-block compile (torchtitan's order) and DDP's python reducer under
compiled autograd. A second launch with a 2 s group timeout checks that a
compiled collective a peer never joins raises on the waiting rank, naming
the graph, the collective and the rank, instead of hanging.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.testing import assert_close

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]

WORKER = textwrap.dedent('''
    import copy, datetime, json, os, sys, time, traceback
    import torch, torch.distributed as dist
    import torch.nn.functional as F
    import neuron_compile

    out_dir, scenarios, timeout_s = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}


    class Block(torch.nn.Module):
        def __init__(self, width_in, width_out, act=True):
            super().__init__()
            self.linear, self.act = torch.nn.Linear(width_in, width_out), act

        def forward(self, x):
            y = self.linear(x)
            return torch.tanh(y) if self.act else y


    class MLP(torch.nn.Module):
        # user code, as models are: Dynamo starts no frame in torch's own files (an nn.Sequential of
        # torch layers compiles nothing under DDP or per-block compile)
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(8, 16), Block(16, 8), Block(8, 4, act=False)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x


    def mlp():
        torch.manual_seed(0)
        return MLP()


    def batches(n=3):
        torch.manual_seed(100 + rank)  # each rank its own batches
        return [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(n)]


    def local(t):
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return t.detach().reshape(-1).tolist()


    def train(model, step_model, step=None, device="cpu", optimizer=None):
        from neuron_compile.device.opkernel import COUNTS
        # foreach=False: on CUDA SGD's default foreach kernel refuses a mix of DTensor and plain parameters (a
        # tensor-parallel model's unsharded layers); CPU runs the same per-tensor loop
        opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False)))(model.parameters())
        losses, grads, host_copies, opt_ops, held = [], [], [], [], []
        for x, y in batches():
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            copies = COUNTS["host_copies"]
            if step is None:
                loss = F.mse_loss(step_model(x), y)
                loss.backward()
            else:
                loss = step(x, y)
            host_copies.append(COUNTS["host_copies"] - copies)  # forward and backward, collectives included
            held.append(holders(model))
            grads.append([local(p.grad) for p in model.parameters()])
            ops = sum(COUNTS[k] for k in ("op_compiles", "index_hits", "op_cache_hits"))
            opt.step()
            opt_ops.append(sum(COUNTS[k] for k in ("op_compiles", "index_hits", "op_cache_hits")) - ops)
            losses.append(loss.item())
        return {"losses": losses, "grads": grads, "params": [local(p) for p in model.parameters()],
                "host_copies": host_copies, "opt_ops": opt_ops, "holders": held}


    def holders(model):
        """Per neuron parameter, the references to its buffer beyond its storage's own after a step's
        backward: a graph's crossing to the distributed client that outlived its run (an executable may then
        not take the buffer in place). jaxlib's deferred releases (a DLPack import PJRT freed off the GIL)
        go first, as the device's donation check lets them."""
        from jaxlib import _jax
        from neuron_compile.device import storage
        _jax.collect_garbage()
        out = []
        for p in model.parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            if t.device.type == "neuron":
                out.append(sys.getrefcount(storage.data_of(t.detach()).buffer) - 2)
        return out


    def reports_since(before):
        return [r.as_dict() for r in neuron_compile.compile_reports()[before:] if r.kind != "eager"]


    def both(build, **kw):
        """The same setup run eagerly and compiled (neuron backend, default options)."""
        eager_model, eager_step = build(compiled=False)
        before = len(neuron_compile.compile_reports())
        model, step = build(compiled=True)
        out = {"eager": train(eager_model, eager_step, **kw), "compiled": train(model, step, **kw)}
        out["reports"] = reports_since(before)
        return out


    def tp(compiled, options=None):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (world,))
        model = parallelize_module(mlp(), mesh, {"blocks.0.linear": ColwiseParallel(),
                                                 "blocks.1.linear": RowwiseParallel()})
        return model, torch.compile(model, backend="neuron", options=options) if compiled else model


    def tp2d(compiled):
        """Tensor parallel over the "tp" dim of a (dp, tp) mesh: its all_reduce runs in a subgroup."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(mlp(), mesh["tp"], {"blocks.0.linear": ColwiseParallel(),
                                                       "blocks.1.linear": RowwiseParallel()})
        return model, torch.compile(model, backend="neuron") if compiled else model


    def mesh2d_fn():
        """Every lowered collective over each dim of a (dp, tp) mesh, compiled against eager."""
        import torch.distributed._functional_collectives as funcol
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))

        def f(x):
            out = []
            for group in (mesh.get_group("tp"), mesh.get_group("dp")):
                out += [funcol.all_reduce(x * 2, "avg", group) + 1, funcol.all_reduce(x, "max", group),
                        funcol.all_gather_tensor(x, 0, group), funcol.reduce_scatter_tensor(x, "sum", 0, group),
                        funcol.all_to_all_single(x, None, None, group), funcol.broadcast(x, 1, group)]
            return out

        x = torch.arange(16.0).reshape(4, 4) + rank * 10
        before = len(neuron_compile.compile_reports())
        out = {"eager": [t.tolist() for t in f(x)],
               "compiled": [t.tolist() for t in torch.compile(f, backend="neuron")(x)]}
        out["reports"] = reports_since(before)
        return out


    def neuron_subgroups():
        """Eager collectives of neuron tensors in "neuron" subgroups ([0, 1], [2, 3]): run by XLA."""
        from neuron_compile.device.opkernel import COUNTS
        group, _ = dist.new_subgroups(2, backend="neuron")
        before = COUNTS.get("device_collectives", 0)
        reduced = torch.full((3,), float(rank + 1), device="neuron")
        dist.all_reduce(reduced, group=group)
        gathered = torch.empty(4, device="neuron")
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank), device="neuron"), group=group)
        scattered = torch.empty(2, device="neuron")
        dist.reduce_scatter_tensor(scattered, torch.arange(4.0, device="neuron") + rank, op=dist.ReduceOp.AVG,
                                   group=group)
        first = {"all_reduce": reduced.cpu().tolist(), "all_gather": gathered.cpu().tolist(),
                 "reduce_scatter": scattered.cpu().tolist(),
                 "device_collectives": COUNTS.get("device_collectives", 0) - before}
        # broadcasts (a 0-d int64 too), an even all-to-all and coalesced batches: XLA's too, no host copy
        count = torch.tensor(rank * 10, device="neuron")  # from the host: made before the counts
        before, copies = COUNTS.get("device_collectives", 0), COUNTS["host_copies"]
        ranks = dist.get_process_group_ranks(group)
        values = torch.arange(6.0, device="neuron").reshape(2, 3) * (rank + 1)
        dist.broadcast(values, ranks[1], group=group)
        dist.broadcast(count, ranks[1], group=group)
        exchanged = torch.empty(4, device="neuron")
        dist.all_to_all_single(exchanged, torch.arange(4.0, device="neuron") + 10 * rank, group=group)
        pair = [torch.full((2,), float(rank), device="neuron"), torch.full((3, 2), float(rank + 1), device="neuron")]
        with dist._coalescing_manager(group=group):
            for t in pair:
                dist.all_reduce(t, group=group)
        outputs = [torch.empty(4, device="neuron"), torch.empty(2, 3, device="neuron")]
        with dist._coalescing_manager(group=group):
            dist.all_gather_into_tensor(outputs[0], torch.full((2,), float(rank), device="neuron"), group=group)
            dist.all_gather_into_tensor(outputs[1], torch.full((1, 3), float(rank), device="neuron"), group=group)
        counts = {"device_collectives": COUNTS.get("device_collectives", 0) - before,
                  "host_copies": COUNTS["host_copies"] - copies}
        return {**first, "broadcast": values.cpu().tolist(), "broadcast_0d": count.cpu().item(),
                "all_to_all": exchanged.cpu().tolist(), "coalesced_all_reduce": [t.cpu().tolist() for t in pair],
                "coalesced_all_gather": [t.cpu().tolist() for t in outputs], "more": counts}


    def tp_neuron(compiled):
        """Tensor parallel on neuron tensors (a neuron mesh, each rank on neuron:<LOCAL_RANK>): compiled, the
        all_reduces run inside the executable on buffers that cross to the distributed client and back."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("neuron", (world,))
        model = parallelize_module(mlp().to("neuron"), mesh, {"blocks.0.linear": ColwiseParallel(),
                                                              "blocks.1.linear": RowwiseParallel()})
        return model, torch.compile(model, backend="neuron") if compiled else model


    def tp_eager_collectives(compiled):
        return tp(compiled, {"collectives": "eager"})


    class SimpleFSDPLinear(torch.nn.Module):
        """SimpleFSDP's idea in small: the weight lives sharded (a DTensor on Shard(0)); forward
        all-gathers it (redistribute to Replicate), backward reduce-scatters its gradient (Partial)."""
        def __init__(self, linear, mesh):
            super().__init__()
            from torch.distributed.tensor import Shard, distribute_tensor
            self.mesh = mesh
            self.weight = torch.nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, [Shard(0)]))
            self.bias = torch.nn.Parameter(distribute_tensor(linear.bias.detach(), mesh, [Shard(0)]))

        def forward(self, x):
            from torch.distributed.tensor import Partial, Replicate
            w = self.weight.redistribute(self.mesh, [Replicate()]).to_local(grad_placements=[Partial()])
            b = self.bias.redistribute(self.mesh, [Replicate()]).to_local(grad_placements=[Partial()])
            return F.linear(x, w, b)


    def simple_fsdp(compiled):
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
        model = mlp()
        for block in model.blocks:
            block.linear = SimpleFSDPLinear(block.linear, mesh)
        return model, torch.compile(model, backend="neuron") if compiled else model


    def all_reduce_fn(compiled):
        def f(x):
            y = torch.tanh(x) * 2
            dist.all_reduce(y)
            return y.sum(0) + 1
        g = torch.compile(f, backend="neuron") if compiled else f
        x = torch.arange(12.0).reshape(3, 4) + rank
        return g(x).tolist()


    def collectives_fn():
        """Every lowered collective, reduce ops and an int64 tensor, and one the executable can't hold
        (uneven all_to_all splits: eager between compiled parts), compiled against eager."""
        import torch.distributed._functional_collectives as funcol
        group = dist.group.WORLD

        def f(x, i):
            return (funcol.all_reduce(x * 2, "avg", group) + 1, funcol.all_reduce(x, "max", group),
                    funcol.all_reduce(x, "product", group), funcol.all_gather_tensor(x, 0, group),
                    funcol.reduce_scatter_tensor(x, "sum", 0, group), funcol.all_to_all_single(x, None, None, group),
                    funcol.broadcast(x, 1, group), funcol.all_reduce(i, "sum", group) * 3)

        def g(x):
            # rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 and 2: 3 rows arrive at rank 0, 5 at 1
            sent = [1, 3] if rank == 0 else [2, 2]
            received = [1, 2] if rank == 0 else [3, 2]
            return funcol.all_to_all_single(torch.tanh(x), received, sent, group) * 2

        x = torch.arange(16.0).reshape(4, 4) + rank * 10
        i = torch.arange(4) + rank
        before = len(neuron_compile.compile_reports())
        out = {"eager": [t.tolist() for t in f(x, i)],
               "compiled": [t.tolist() for t in torch.compile(f, backend="neuron")(x, i)]}
        out["uneven_eager"] = g(x).tolist()
        out["uneven_compiled"] = torch.compile(g, backend="neuron")(x).tolist()
        out["reports"] = reports_since(before)
        return out


    def ddp(compiled):
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = mlp()
        wrapped = DDP(model)
        return model, torch.compile(wrapped, backend="neuron") if compiled else wrapped


    def fsdp2(compiled):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        model = mlp()
        for block in model.blocks:
            if compiled:  # torchtitan's order: compile each block, then shard it
                block.compile(backend="neuron")
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, model


    def ddp_python_reducer(compiled):
        """The whole step compiled, its backward by compiled autograd: DDP's reducer becomes
        functional all_reduces in the backward graph."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = mlp()
        if not compiled:
            return model, DDP(model)
        torch._dynamo.config.optimize_ddp = "python_reducer"
        wrapped = DDP(model)

        @torch.compile(backend="neuron")
        def step(x, y):
            loss = F.mse_loss(wrapped(x), y)
            loss.backward()
            return loss

        def run(x, y):
            with torch._dynamo.compiled_autograd._enable(torch.compile(backend="neuron")):
                return step(x, y)
        return model, run


    def stuck():
        """A compiled all_reduce rank 1 never joins: rank 0 must raise after the group's timeout."""
        f = torch.compile(lambda x: (dist.all_reduce(x), x * 2)[1], backend="neuron")
        f(torch.ones(4))  # both ranks: compiles, runs
        found = {}
        if rank == 0:
            start = time.time()
            try:
                f(torch.ones(4))
                found = {"error": None}
            except Exception as e:
                found = {"error": f"{type(e).__name__}: {e}", "seconds": time.time() - start}
        else:
            time.sleep(timeout_s + 1)
        return found


    for name in scenarios:
        start = time.time()
        try:
            if name == "ddp_python_reducer":
                eager_model, eager_step = ddp_python_reducer(False)
                before = len(neuron_compile.compile_reports())
                model, step = ddp_python_reducer(True)
                results[name] = {"eager": train(eager_model, eager_step), "compiled": train(model, None, step=step),
                                 "reports": reports_since(before)}
            elif name == "tp_neuron_adamw":  # eager: AdamW's default (foreach) step against its for-loop
                results[name] = {kind: train(*tp_neuron(False), device="neuron", optimizer=lambda ps, f=foreach:
                                             torch.optim.AdamW(ps, lr=0.01, foreach=f))
                                 for kind, foreach in (("foreach", None), ("loop", False))}
            elif name in ("collectives_fn", "mesh2d_fn", "neuron_subgroups"):
                results[name] = globals()[name]()
            elif name in ("all_reduce_fn", "stuck"):
                results[name] = (globals()[name]() if name == "stuck"
                                 else {"eager": all_reduce_fn(False), "compiled": all_reduce_fn(True)})
            else:
                results[name] = both(globals()[name], **({"device": "neuron"} if name.endswith("_neuron") else {}))
        except Exception:
            results[name] = {"exception": traceback.format_exc()}
        results.setdefault("seconds", {})[name] = round(time.time() - start, 2)
    results["counters"] = dict(neuron_compile.COUNTERS) if hasattr(neuron_compile, "COUNTERS") else {}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if "stuck" in scenarios:
        os._exit(0)  # rank 0's stuck collective: nothing left to wait for
    dist.destroy_process_group()
''')


def _launch(launch_two_ranks, folder, scenarios: str, timeout_s: float, ranks=(0, 1)) -> list[dict]:
    return launch_two_ranks(folder, WORKER, args=(scenarios, timeout_s), timeout=300, ranks=ranks, env={
        "NEURON_COMPILE_DUMP_DIR": str(folder / "dump"), "NEURON_COMPILE_CACHE_DIR": str(folder / "cache")})


@pytest.fixture(scope="module")
def parallel(tmp_path_factory, launch_two_ranks):
    """Both ranks' results: one torchrun launch runs every training scenario (starting two processes
    that import torch and jax is most of its time)."""
    folder = tmp_path_factory.mktemp("ranks")
    return folder, _launch(launch_two_ranks, folder, "tp,tp_neuron,tp_neuron_adamw,tp_eager_collectives,simple_fsdp,all_reduce_fn,"
                                   "collectives_fn,ddp,fsdp2,ddp_python_reducer", 60)


@pytest.fixture(scope="module")
def mesh2d(tmp_path_factory, launch_two_ranks):
    """Four ranks, a 2 x 2 (dp, tp) mesh: collectives in subgroups."""
    folder = tmp_path_factory.mktemp("mesh")
    return launch_two_ranks(folder, WORKER, args=("tp2d,mesh2d_fn,neuron_subgroups", 60), timeout=300, ranks=(0, 1, 2, 3), nproc=4,
                            env={"NEURON_COMPILE_CACHE_DIR": str(folder / "cache")})


def test_collectives_in_the_subgroups_of_a_2d_mesh_compile_and_match_eager(mesh2d):
    """Each rank's group of each dim ([0, 1] or [2, 3] for tp, [0, 2] or [1, 3] for dp) heads the replica
    groups of an executable over the four ranks: every collective compiled, none eager, values as eager's."""
    for rank, run in enumerate(_ran(mesh2d, "mesh2d_fn")):
        for got, want in zip(run["compiled"], run["eager"], strict=True):
            assert_close(torch.tensor(got), torch.tensor(want))
        (graph,) = _graphs(run, "inference")
        assert graph["collectives"] == {"compiled": 24}, graph  # 12 collectives and their waits
    # the tp all_gather joins ranks 0 and 1 (2 and 3), the dp one ranks 0 and 2 (1 and 3)
    gathered = [run["compiled"][2] for run in _ran(mesh2d, "mesh2d_fn")]
    assert gathered[0] == gathered[1] != gathered[2]


def test_eager_collectives_of_neuron_tensors_in_subgroups_run_by_xla_with_the_right_values(mesh2d):
    """all_reduce, all_gather_into_tensor and reduce_scatter_tensor (avg), broadcast (a 0-d tensor too), an
    even all_to_all_single, and coalesced all-reduces and all-gathers (``_coalescing_manager``) in
    ``new_subgroups(2)`` groups of the ``neuron`` backend: each group's own values, run by XLA on the device
    buffers (counted), no host copy."""
    for rank, run in enumerate(_ran(mesh2d, "neuron_subgroups")):
        first = 2 * (rank // 2)
        assert run["all_reduce"] == [float(first + 1 + first + 2)] * 3
        assert run["all_gather"] == [float(first)] * 2 + [float(first + 1)] * 2
        mean, i = first + 0.5, rank % 2
        assert run["reduce_scatter"] == [2 * i + mean, 2 * i + 1 + mean]
        assert run["device_collectives"] == 3
        second = first + 1  # the group's rank 1, the broadcasts' root
        assert run["broadcast"] == [[v * (second + 1) for v in row] for row in ([0.0, 1.0, 2.0], [3.0, 4.0, 5.0])]
        assert run["broadcast_0d"] == second * 10
        # rank r's all-to-all sends rows [2j, 2j+1] of (arange(4) + 10r) to the group's j-th rank
        assert run["all_to_all"] == [2 * i + 10 * first, 2 * i + 1 + 10 * first,
                                     2 * i + 10 * second, 2 * i + 1 + 10 * second]
        assert run["coalesced_all_reduce"] == [[float(first + second)] * 2, [[float(first + second + 2)] * 2] * 3]
        assert run["coalesced_all_gather"] == [[float(first)] * 2 + [float(second)] * 2,
                                               [[float(first)] * 3, [float(second)] * 3]]
        # two broadcasts, the all-to-all, and two coalesced batches of two: XLA's, on the device's buffers
        assert run["more"] == {"device_collectives": 7, "host_copies": 0}, run["more"]


def test_tensor_parallel_on_the_tp_dim_of_a_2d_mesh_trains_as_eager_compiled(mesh2d):
    for rank, run in enumerate(_ran(mesh2d, "tp2d")):
        eager, compiled = run["eager"], run["compiled"]
        assert_close(compiled["losses"], eager["losses"], rtol=1e-5, atol=1e-6)
        for p, q in zip(compiled["params"], eager["params"]):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
        collectives = {}
        for report in run["reports"]:
            for how, n in (report.get("collectives") or {}).items():
                collectives[how] = collectives.get(how, 0) + n
        assert collectives.get("compiled") and not collectives.get("eager"), collectives


def _ran(results, name) -> list[dict]:
    runs = [r[name] for r in results]
    for rank, run in enumerate(runs):
        assert "exception" not in run, f"rank {rank}:\n{run['exception']}"
    return runs


def _same_training(results, name):
    for run in _ran(results, name):
        eager, compiled = run["eager"], run["compiled"]
        assert_close(compiled["losses"], eager["losses"], rtol=1e-5, atol=1e-6)
        for step_c, step_e in zip(compiled["grads"], eager["grads"]):
            for g, h in zip(step_c, step_e):
                assert_close(torch.tensor(g), torch.tensor(h), rtol=1e-5, atol=1e-6)
        for p, q in zip(compiled["params"], eager["params"]):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    # the ranks trained on different batches
    assert results[0][name]["compiled"]["losses"] != results[1][name]["compiled"]["losses"]


def _graphs(run, kind):
    """The graphs Dynamo handed us of that kind (the compiled parts of an eager parent graph left out)."""
    return [r for r in run["reports"] if r["kind"] == kind and ".p" not in r["graph"]]


def test_tensor_parallel_trains_as_eager_with_its_all_reduce_in_the_executable(parallel):
    folder, results = parallel
    _same_training(results, "tp")
    for run in _ran(results, "tp"):
        forward = _graphs(run, "forward")
        assert len(forward) == 1, [r["graph"] for r in run["reports"]]
        # one executable: the all_reduce (and its wait) compiled in, nothing run eagerly around it
        assert forward[0]["collectives"] == {"compiled": 2}
        assert forward[0]["fallback"] == {}
        assert not any(r["graph"].startswith(forward[0]["graph"] + ".p") for r in run["reports"])


def test_tensor_parallel_on_neuron_tensors_runs_its_collectives_in_the_executable_with_no_host_copy(parallel):
    """The same model on a neuron mesh, each rank on neuron:<LOCAL_RANK>: compiled, the forward is one executable
    with the all_reduce inside (the device buffers cross to the distributed client through DLPack, the same
    memory), and a step copies nothing to or from the host, where the eager step stages every collective
    through the host; the training equals eager on neuron and the CPU-tensor run."""
    folder, results = parallel
    _same_training(results, "tp_neuron")
    for result in results:
        run = _ran([result], "tp_neuron")[0]
        assert [r["collectives"] for r in _graphs(run, "forward")] == [{"compiled": 2}], run["reports"]
        assert len(_graphs(run, "backward")) == 1  # (the all_reduce's backward is the identity: none there)
        assert run["compiled"]["host_copies"] == [0, 0, 0]
        assert all(copies > 0 for copies in run["eager"]["host_copies"])
        # SGD's for-loop over DTensor and plain parameters: one op a step, on the local tensors
        assert run["compiled"]["opt_ops"] == run["eager"]["opt_ops"] == [1, 1, 1]
        # the graphs' crossings died with their runs (the collectives' worker thread kept its last job)
        held = run["compiled"]["holders"]
        assert held and all(step and not any(step) for step in held), held
        assert_close(run["compiled"]["losses"], result["tp"]["compiled"]["losses"], rtol=1e-5, atol=1e-6)


def test_adamw_steps_a_tensor_parallel_model_on_neuron_in_one_op_as_its_for_loop_does(parallel):
    """AdamW's default step (foreach) over a tensor-parallel model's mix of DTensor and plain parameters on
    neuron: one op a step on the local tensors (torch's own foreach path refuses the mix, as on CUDA), the
    parameters its for-loop (a DTensor op per parameter and operation) gives."""
    folder, results = parallel
    for rank, result in enumerate(results):
        run = result["tp_neuron_adamw"]
        assert "exception" not in run, f"rank {rank}:\n{run['exception']}"
        foreach, loop = run["foreach"], run["loop"]
        assert foreach["opt_ops"] == [1, 1, 1], foreach["opt_ops"]
        assert min(loop["opt_ops"]) > len(loop["params"]), loop["opt_ops"]
        assert_close(foreach["losses"], loop["losses"], rtol=1e-6, atol=1e-6)
        for p, q in zip(foreach["params"], loop["params"]):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-6, atol=1e-6)


def test_tensor_parallel_forward_stablehlo_holds_the_all_reduce(parallel):
    """Golden check of the final StableHLO (after our passes) of the forward graph: the column-parallel
    matmul, the row-parallel one, their all_reduce, then the replicated layer, in one module."""
    filecheck = pytest.importorskip("filecheck", reason="the test extra installs filecheck")
    folder, results = parallel
    forward = _graphs(results[0]["tp"], "forward")[0]["graph"]
    texts = sorted(folder.glob(f"dump/pid*/{forward}/04-final.mlir"))
    assert texts, f"no dump of {forward} under {folder / 'dump'}"
    checks = folder / "tp_forward.check"
    checks.write_text(textwrap.dedent("""\
        CHECK: module attributes {mhlo.num_replicas = 2 : i32}
        CHECK-LABEL: func.func @main
        CHECK: stablehlo.composite "neuron.matmul_epilogue"
        CHECK: stablehlo.composite "neuron.matmul_epilogue"
        CHECK: "stablehlo.all_reduce"
        CHECK-SAME: replica_groups = dense<{{\\[\\[}}0, 1{{\\]\\]}}> : tensor<1x2xi64>
        CHECK: stablehlo.add
        CHECK: stablehlo.return
        CHECK: stablehlo.tanh
        CHECK: stablehlo.composite "neuron.matmul_epilogue"
        CHECK: return
        CHECK-NOT: all_reduce
        """))
    done = subprocess.run([sys.executable, "-m", "filecheck", str(checks)], stdin=open(texts[0]),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_collectives_eager_runs_them_on_torch_distributed_between_compiled_parts(parallel):
    folder, results = parallel
    _same_training(results, "tp_eager_collectives")
    for run in _ran(results, "tp_eager_collectives"):
        forward = _graphs(run, "forward")[0]
        assert forward["collectives"] == {"eager": 2} and forward["fallback"] == {}, forward
        assert any('collectives="eager"' in note for note in forward["notes"]), forward["notes"]
        # the matmuls before and after the all_reduce are compiled parts of the eager parent graph
        assert [r["graph"] for r in run["reports"] if r["graph"].startswith(forward["graph"] + ".p")], run["reports"]


def test_simple_fsdp_dtensor_parameters_train_as_eager(parallel):
    folder, results = parallel
    _same_training(results, "simple_fsdp")
    for run in _ran(results, "simple_fsdp"):
        counts = {path: sum(r["collectives"].get(path, 0) for r in run["reports"]) for path in ("compiled", "eager")}
        assert counts["compiled"] > 0 and counts["eager"] == 0, counts


def test_all_reduce_in_a_compiled_function_matches_eager(parallel):
    folder, results = parallel
    runs = _ran(results, "all_reduce_fn")
    for run in runs:
        assert_close(torch.tensor(run["compiled"]), torch.tensor(run["eager"]))
    assert runs[0]["compiled"] == runs[1]["compiled"]  # reduced over both ranks


def test_every_lowered_collective_matches_eager(parallel):
    folder, results = parallel
    for run in _ran(results, "collectives_fn"):
        for got, want in zip(run["compiled"], run["eager"]):
            assert_close(torch.tensor(got), torch.tensor(want))
        assert_close(torch.tensor(run["uneven_compiled"]), torch.tensor(run["uneven_eager"]))
        first, uneven = _graphs(run, "inference")
        assert first["collectives"] == {"compiled": 16}, first  # 8 collectives and their waits
        # uneven splits: the all_to_all (and its wait) on torch.distributed, tanh and * 2 compiled around it
        assert uneven["collectives"] == {"eager": 2}, uneven
        assert any("uneven splits" in note for note in uneven["notes"]), uneven["notes"]


def test_ddp_trains_as_eager(parallel):
    _same_training(parallel[1], "ddp")


def test_fsdp2_per_block_compile_trains_as_eager(parallel):
    folder, results = parallel
    _same_training(results, "fsdp2")
    for run in _ran(results, "fsdp2"):
        assert {"forward", "backward"} <= {r["kind"] for r in run["reports"]}


def test_ddp_python_reducer_under_compiled_autograd_trains_as_eager(parallel):
    folder, results = parallel
    _same_training(results, "ddp_python_reducer")
    for run in _ran(results, "ddp_python_reducer"):
        # compiled autograd's backward graph holds the reducer's all_reduce
        assert sum(r["collectives"].get("compiled", 0) for r in run["reports"]) > 0, run["reports"]


def test_a_collective_a_peer_never_joins_raises_naming_it(tmp_path, launch_two_ranks):
    # only rank 0's word counts: rank 1, left sleeping, is ended by the coordinator once rank 0 is gone
    # the group's timeout also bounds the first, joined call: each rank compiles before it joins, and a rank
    # compiling slower on a loaded host (a CI beside another run: 2 s was not enough) must not fail it
    results = _launch(launch_two_ranks, tmp_path, "stuck", 8, ranks=(0,))
    found = results[0]["stuck"]
    assert "exception" not in found, found["exception"]
    error = found["error"]
    assert error is not None, "the stuck all_reduce returned"
    assert error.startswith("CollectiveError"), error
    assert "rank 0 of 2" in error and "all_reduce" in error and "did not complete within" in error, error
    assert found["seconds"] < 30, found  # the group's 8 s timeout, not forever


def test_the_private_torch_distributed_state_we_read_still_exists():
    """runtime.distributed reads the default store and timeout, lowering.functional_collectives resolves group names:
    private torch.distributed functions that must fail loudly here when torch changes them."""
    from torch.distributed import distributed_c10d as c10d

    for name in ("_get_default_store", "_get_default_timeout", "_resolve_process_group"):
        assert callable(getattr(c10d, name, None)), f"torch.distributed.distributed_c10d.{name} is gone"
    assert isinstance(c10d._get_default_timeout("gloo").total_seconds(), float)
    assert hasattr(c10d.ProcessGroupGloo, "options") and hasattr(c10d.ProcessGroupGloo.Options, "_timeout")
