"""Every ReduceOp torch's collectives take, on neuron tensors (``device/reduce_ops.py``).

Two ranks under torchrun (one launch; the ``neuron`` default group and a ``gloo`` group beside it, the
C++ group whose collectives on neuron tensors are staged through the host): PREMUL_SUM (a Python
factor, a 0-d CPU tensor, a 0-d neuron tensor) through all_reduce and reduce_scatter_tensor against the
values worked out here; BAND/BOR/BXOR of integer and bool tensors; the errors naming the op and the
dtype where an op is not defined; a compiled bitwise all_reduce inside the executable; and FSDP2 with
``set_gradient_divide_factor`` (its reduce-scatter is then ``ReduceOp.PREMUL_SUM(1 / factor)``, which
gloo refused) against the one-process CPU run of the same global batch. In-process tests (world size
1) cover the checks alone.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

WORKER = textwrap.dedent('''
    import json, os, sys, traceback
    import torch, torch.distributed as dist
    import torch.nn.functional as F
    from neuron_compile.device.collectives import reduce_ops
    from neuron_compile.device.opkernel import COUNTS

    out_dir = sys.argv[1]
    dist.init_process_group()  # the accelerator's backend: neuron
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"neuron": dist.group.WORLD, "gloo": gloo}
    results = {}
    premultiplied = [0]
    _premultiply = reduce_ops.premultiply
    def counting(*args, **kwargs):
        premultiplied[0] += 1
        return _premultiply(*args, **kwargs)
    reduce_ops.premultiply = counting


    def eager(group):
        found = {}
        before = COUNTS.get("device_collectives", 0)
        for name, factor in (("float", 0.5), ("cpu_tensor", torch.tensor(2.0)),
                             ("neuron_tensor", torch.tensor(3.0, device="neuron"))):
            t = torch.full((3,), float(rank + 1), device="neuron")
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor), group=group)
            found["all_reduce_" + name] = t.cpu().tolist()
        x = torch.arange(4.0, device="neuron") + 10 * rank
        out = torch.empty(2, device="neuron")
        dist.reduce_scatter_tensor(out, x, op=dist._make_nccl_premul_sum(0.25), group=group)
        found["reduce_scatter"], found["reduce_scatter_input"] = out.cpu().tolist(), x.cpu().tolist()
        for op in ("BAND", "BOR", "BXOR"):
            for dtype in (torch.int64, torch.int32):
                i = torch.tensor([rank + 1, 6, 12], dtype=dtype, device="neuron")
                dist.all_reduce(i, op=getattr(dist.ReduceOp, op), group=group)
                found[f"{op}_{dtype}"] = i.cpu().tolist()
            b = torch.tensor([rank == 0, True, False], device="neuron")
            dist.all_reduce(b, op=getattr(dist.ReduceOp, op), group=group)
            found[f"{op}_bool"] = b.cpu().tolist()
        found["device_collectives"] = COUNTS.get("device_collectives", 0) - before
        for name, op, tensor in (("band_float", dist.ReduceOp.BAND, torch.ones(2, device="neuron")),
                                 ("premul_int", dist._make_nccl_premul_sum(2.0),
                                  torch.ones(2, dtype=torch.int64, device="neuron"))):
            try:
                dist.all_reduce(tensor, op=op, group=group)
                found[name] = None
            except RuntimeError as error:
                found[name] = str(error)
        return found


    def compiled_bitwise():
        import neuron_compile
        import torch.distributed._functional_collectives as funcol

        def f(x):
            return (funcol.all_reduce(x, "bxor", dist.group.WORLD), funcol.all_reduce(x + 1, "band", dist.group.WORLD),
                    funcol.all_reduce(x * 2, "bor", dist.group.WORLD))

        x = torch.tensor([rank + 1, 6, 12]) * (rank + 1)
        before = len(neuron_compile.compile_reports())
        out = {"eager": [t.tolist() for t in f(x)],
               "compiled": [t.tolist() for t in torch.compile(f, backend="neuron")(x)]}
        out["collectives"] = [r.as_dict().get("collectives") for r in neuron_compile.compile_reports()[before:]
                              if r.kind != "eager"]
        return out


    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))


    FACTOR = 4.0  # not the world size: FSDP2 would reduce with AVG then


    def batches(r):
        torch.manual_seed(100 + r)
        return [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(3)]


    def fsdp2(group):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        torch.manual_seed(0)
        model = MLP().to("neuron")
        mesh = DeviceMesh.from_group(groups[group], "neuron")
        for layer in (model.fc1, model.fc2, model):
            fully_shard(layer, mesh=mesh)
            layer.set_gradient_divide_factor(FACTOR)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = premultiplied[0]
        losses = []
        for x, y in batches(rank):
            opt.zero_grad()
            loss = F.mse_loss(model(x.to("neuron")), y.to("neuron"))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"losses": losses, "params": [p.full_tensor().detach().cpu().reshape(-1).tolist()
                                             for p in model.parameters()],
                "premultiplied": premultiplied[0] - before}


    def one_process_cpu():
        """The same global batch in one CPU process: each rank's loss, gradients summed, divided by FACTOR."""
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for steps in zip(*(batches(r) for r in range(world))):
            opt.zero_grad()
            per_rank = [F.mse_loss(model(x), y) for x, y in steps]
            (sum(per_rank) / FACTOR).backward()
            opt.step()
            losses.append([loss.item() for loss in per_rank])
        return {"losses": losses, "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}


    for name, run in (("eager_neuron", lambda: eager(dist.group.WORLD)), ("eager_gloo", lambda: eager(gloo)),
                      ("compiled_bitwise", compiled_bitwise), ("fsdp2_neuron", lambda: fsdp2("neuron")),
                      ("fsdp2_gloo", lambda: fsdp2("gloo")), ("cpu", one_process_cpu)):
        try:
            results[name] = run()
        except Exception:
            results[name] = {"exception": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, launch_two_ranks):
    folder = tmp_path_factory.mktemp("reduce_ops")
    return launch_two_ranks(folder, WORKER, timeout=300, env={"NEURON_COMPILE_CACHE_DIR": str(folder / "cache")})


def _run(results, rank, name):
    run = results[rank][name]
    assert "exception" not in run, f"rank {rank}:\n{run['exception']}"
    return run


@pytest.mark.slow
@pytest.mark.parametrize("group", ["neuron", "gloo"])
def test_premul_sum_and_bitwise_ops_on_neuron_tensors_give_the_expected_values(two_ranks, group):
    """The neuron group runs PREMUL_SUM as XLA's collective on the buffers (the multiply on the device,
    then XLA's sum) and stages bitwise ops through gloo (XLA CPU's collectives refuse them); the gloo group
    stages everything through the host, its PREMUL_SUM multiplied before gloo's SUM."""
    inputs = [torch.arange(4.0) + 10 * r for r in range(2)]
    for rank in range(2):
        found = _run(two_ranks, rank, f"eager_{group}")
        assert found["all_reduce_float"] == [1.5] * 3  # (1 + 2) * 0.5
        assert found["all_reduce_cpu_tensor"] == [6.0] * 3
        assert found["all_reduce_neuron_tensor"] == [9.0] * 3
        assert_close(torch.tensor(found["reduce_scatter"]), sum(x * 0.25 for x in inputs)[2 * rank:2 * rank + 2])
        assert found["reduce_scatter_input"] == inputs[rank].tolist()  # read, not scaled in place
        values = [torch.tensor([r + 1, 6, 12]) for r in range(2)]
        bools = [torch.tensor([r == 0, True, False]) for r in range(2)]
        for op, fn in (("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or), ("BXOR", torch.bitwise_xor)):
            for dtype in ("torch.int64", "torch.int32"):
                assert found[f"{op}_{dtype}"] == fn(*values).tolist(), (op, dtype)
            assert found[f"{op}_bool"] == fn(*bools).tolist(), op
        assert "ReduceOp.BAND is defined for integer and bool tensors, not torch.float32" in found["band_float"] or (
            group == "gloo" and "Cannot use ReduceOp.BAND with non-integral dtype" in found["band_float"])
        assert "rank " + str(rank) in found["band_float"] and "allreduce" in found["band_float"]
        assert "ReduceOp.PREMUL_SUM is defined for float16, bfloat16, float32 and float64 tensors, not torch.int64" \
            in found["premul_int"] and f"rank {rank}" in found["premul_int"]
        if group == "neuron":  # 3 PREMUL_SUM all_reduces and the reduce_scatter: XLA's
            assert found["device_collectives"] == 4, found["device_collectives"]


@pytest.mark.slow
def test_a_compiled_bitwise_all_reduce_runs_eagerly_between_compiled_parts(two_ranks):
    """XLA CPU's collectives have no bitwise reduction: the graph's bitwise all_reduces run on
    torch.distributed between compiled parts, with eager's values."""
    for rank in range(2):
        run = _run(two_ranks, rank, "compiled_bitwise")
        assert run["compiled"] == run["eager"]
        assert any(c and c.get("eager") for c in run["collectives"]), run["collectives"]


@pytest.mark.slow
@pytest.mark.parametrize("group", ["neuron", "gloo"])
def test_fsdp2_with_a_gradient_divide_factor_trains_as_one_cpu_process(two_ranks, group):
    """``set_gradient_divide_factor(4.0)`` on 2 ranks: FSDP2 reduce-scatters with PREMUL_SUM(0.25) (gloo
    refused it: "Cannot use ReduceOp.PREMUL_SUM with Gloo"), matching one CPU process that sums the two
    ranks' losses and divides by 4."""
    cpu = _run(two_ranks, 0, "cpu")
    for rank in range(2):
        run = _run(two_ranks, rank, f"fsdp2_{group}")
        assert run["premultiplied"] >= 3, run["premultiplied"]  # a reduce-scatter per step at least
        assert_close(run["losses"], [step[rank] for step in cpu["losses"]], rtol=1e-5, atol=1e-6)
        for p, q in zip(run["params"], cpu["params"], strict=True):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)


# --- one process: the checks ----------------------------------------------------------------------

@pytest.fixture
def group():
    assert not dist.is_initialized()
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_premul_sum_multiplies_then_sums_and_refuses_integers(group):
    t = torch.arange(4.0, device="neuron")
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    assert t.cpu().tolist() == [0.0, 0.5, 1.0, 1.5]
    c = torch.ones(2)  # CPU tensors in the neuron group: the same
    dist.all_reduce(c, op=dist._make_nccl_premul_sum(torch.tensor(3.0)))
    assert c.tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match=r"allreduce failed on rank 0 .*ReduceOp.PREMUL_SUM is defined for "
                                           r"float16, bfloat16, float32 and float64 tensors, not torch.int32"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32, device="neuron"), op=dist._make_nccl_premul_sum(2.0))
    with pytest.raises(RuntimeError, match=r"reduce_scatter_tensor failed on rank 0 .*ReduceOp.BXOR is defined for "
                                           r"integer and bool tensors, not torch.bfloat16"):
        dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.bfloat16, device="neuron"),
                                   torch.ones(2, dtype=torch.bfloat16, device="neuron"), op=dist.ReduceOp.BXOR)
