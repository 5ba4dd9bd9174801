"""The device's random numbers: a Philox (seed, offset) state DTensor's tracker shards (``device/rng.py``).

Plain random ops keep CPU's numbers (``test_device.py::test_random_ops_give_cpu_numbers``); DTensor random
ops on a neuron mesh draw the device's Philox stream at each element's position in the full tensor, so one
seed gives one full tensor whatever the sharding and the world size: two ranks under torchrun
(``Shard(0)``, ``Shard(1)``, ``Replicate``, a ``fully_shard``ed module's ``nn.init``, sharded dropout)
against the same draws on a one-rank mesh in this process, and that against Philox computed here.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from neuron_compile.device import philox

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

SEED = 1234

# The draws, run alike by each of two ranks (a 2-rank mesh) and by this process (a 1-rank mesh).
DRAWS = textwrap.dedent('''
    def draws(mesh):
        """name -> full tensor as a nested list, and the device's state after each group of draws."""
        import torch
        import torch.nn.functional as F
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        out = {}
        for name, placement in (("shard0", Shard(0)), ("shard1", Shard(1)), ("replicate", Replicate())):
            torch.manual_seed(1234)
            # 7 x 6: Shard(0) splits 4 + 3 rows (a shard of 24 and one of 18 elements, not a multiple of 4)
            d = distribute_tensor(torch.zeros(7, 6, device="neuron"), mesh, [placement])
            d.normal_(1.0, 2.0)
            out[f"normal/{name}"] = d.full_tensor().cpu().tolist()
            d.uniform_(-3.0, 3.0)
            out[f"uniform/{name}"] = d.full_tensor().cpu().tolist()
            dropped = F.dropout(distribute_tensor(torch.ones(7, 6, device="neuron"), mesh, [placement]), 0.5)
            out[f"dropout/{name}"] = dropped.full_tensor().cpu().tolist()
            p = distribute_tensor(torch.linspace(0, 1, 42, device="neuron").reshape(7, 6), mesh, [placement])
            out[f"bernoulli/{name}"] = torch.bernoulli(p).full_tensor().cpu().tolist()
            out[f"state/{name}"] = torch.neuron.get_rng_state().tolist()

        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Linear(6, 3)).to("neuron")
        for layer in (model[0], model[1], model):
            fully_shard(layer, mesh=mesh)
        torch.manual_seed(1234)
        with torch.no_grad():
            for layer in model:
                layer.reset_parameters()  # kaiming_uniform_ / uniform_ on Shard(0) DTensors
            torch.nn.init.normal_(model[1].weight, std=0.5)
        out["fsdp_init"] = [p.full_tensor().cpu().tolist() for p in model.parameters()]
        out["fsdp_local_shapes"] = [list(p.to_local().shape) for p in model.parameters()]
        out["fsdp_state"] = torch.neuron.get_rng_state().tolist()
        return out
''')

WORKER = DRAWS + textwrap.dedent('''
    import json, os, sys, traceback
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group()  # the accelerator's default backend: neuron
    rank = dist.get_rank()
    try:
        result = draws(init_device_mesh("neuron", (dist.get_world_size(),)))
    except Exception:
        result = {"exception": traceback.format_exc()}
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
''')


@pytest.fixture
def group():
    assert not dist.is_initialized()
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def mesh(group):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, "neuron")


def _one_rank_draws(mesh) -> dict:
    namespace = {}
    exec(DRAWS, namespace)
    return namespace["draws"](mesh)


def _state(seed_and_offset) -> tuple[int, int]:
    raw = bytes(bytearray(int(b) for b in seed_and_offset))
    return int(np.frombuffer(raw[:8], "<u8")[0]), int(np.frombuffer(raw[8:], "<i8")[0])


# --- the generator itself -------------------------------------------------------------------------

@pytest.mark.parametrize("counter,key,expected", [  # Random123's known-answer vectors for philox4x32-10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox4x32_10_gives_random123s_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox.philox4x32(counter, key)) == expected


def test_a_position_draws_the_same_words_alone_as_in_its_stream():
    positions = np.arange(5000, dtype=np.int64)
    whole = philox.normal(SEED, positions)
    picked = np.array([7, 4999, 0, 2048, 2 ** 32 + 3])  # any order, any subset, past 32 bits
    assert_close(torch.from_numpy(philox.normal(SEED, picked[:4])), torch.from_numpy(whole[picked[:4]]))
    assert philox.normal(SEED, picked).std() > 0 and not np.array_equal(philox.normal(SEED + 1, positions), whole)
    u = philox.uniform(SEED, positions)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02 and abs(whole.std() - 1) < 0.05


def test_the_state_is_cudas_seed_and_offset_and_manual_seed_sets_it():
    torch.neuron.manual_seed(SEED)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.shape == (16,) and state.device.type == "cpu"
    assert _state(state.tolist()) == (SEED, 0) and torch.neuron.initial_seed() == SEED
    torch.manual_seed(SEED + 1)  # torch's seeds every device's generator
    assert _state(torch.neuron.get_rng_state().tolist()) == (SEED + 1, 0)
    torch.neuron.set_rng_state(torch.tensor(list((99).to_bytes(8, "little") + (40).to_bytes(8, "little")),
                                            dtype=torch.uint8))
    assert _state(torch.neuron.get_rng_state().tolist()) == (99, 40) and torch.neuron.initial_seed() == 99
    assert len(torch.neuron.get_rng_state_all()) == torch.neuron.device_count()
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.zeros(8, dtype=torch.uint8))


def test_plain_draws_keep_cpus_numbers_and_neuron_manual_seed_reproduces_them():
    torch.neuron.manual_seed(7)
    first = torch.randn(4, 5, device="neuron").cpu()
    torch.neuron.manual_seed(7)
    again = torch.randn(4, 5, device="neuron").cpu()
    torch.manual_seed(7)
    assert_close(first, again, rtol=0, atol=0)
    assert_close(first, torch.randn(4, 5), rtol=0, atol=0)
    # a state saved before the device had one of its own (CPU's 5,056 bytes) still restores the plain draws
    old = torch.get_rng_state()
    a = torch.rand(3, device="neuron").cpu()
    torch.neuron.set_rng_state(old)
    assert_close(torch.rand(3, device="neuron").cpu(), a, rtol=0, atol=0)


# --- DTensor on a one-rank neuron mesh -------------------------------------------------------------

def test_dtensor_draws_are_philox_at_each_elements_position_and_move_the_offset(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(SEED)
    d = distribute_tensor(torch.zeros(5, 6, device="neuron"), mesh, [Shard(0)])
    d.normal_(1.0, 2.0)
    expected = 1.0 + 2.0 * philox.normal(SEED, np.arange(30))
    assert_close(d.full_tensor().cpu(), torch.from_numpy(expected).float().reshape(5, 6))
    assert _state(torch.neuron.get_rng_state().tolist()) == (SEED, 32)  # 30 rounded up to 4, as CUDA's tracker
    d.uniform_(-1.0, 1.0)
    u = -1.0 + 2.0 * philox.uniform(SEED, np.arange(32, 62))
    assert_close(d.full_tensor().cpu(), torch.from_numpy(u).float().reshape(5, 6))
    assert _state(torch.neuron.get_rng_state().tolist()) == (SEED, 64)


def test_get_and_set_rng_state_round_trip_restores_the_dtensor_stream(mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch.manual_seed(SEED)
    d = distribute_tensor(torch.zeros(4, 4, device="neuron"), mesh, [Replicate()])
    saved = torch.neuron.get_rng_state()
    first = d.normal_().full_tensor().cpu()
    second = d.normal_().full_tensor().cpu()
    assert not torch.equal(first, second)
    torch.neuron.set_rng_state(saved)
    assert_close(d.normal_().full_tensor().cpu(), first, rtol=0, atol=0)
    assert_close(d.normal_().full_tensor().cpu(), second, rtol=0, atol=0)
    with torch.random.fork_rng(device_type="neuron"):  # what checkpointing and DTensor's tracker use
        inside = d.normal_().full_tensor().cpu()
    assert_close(d.normal_().full_tensor().cpu(), inside, rtol=0, atol=0)
    torch.neuron.manual_seed(SEED)  # the device's own seeding reproduces the DTensor stream too
    assert_close(d.normal_().full_tensor().cpu(), first, rtol=0, atol=0)


def test_plain_and_dtensor_draws_leave_each_others_stream_alone(mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch.manual_seed(SEED)
    d = distribute_tensor(torch.zeros(4, 4, device="neuron"), mesh, [Replicate()])
    cpu_numbers = torch.randn(6).tolist()
    torch.manual_seed(SEED)
    first = d.normal_().full_tensor().cpu()
    assert torch.randn(6).tolist() == cpu_numbers  # the DTensor draw took nothing from CPU's stream
    torch.manual_seed(SEED)
    torch.nn.functional.dropout(torch.ones(8, device="neuron"), 0.5)  # a plain draw: CPU's stream
    assert_close(d.normal_().full_tensor().cpu(), first, rtol=0, atol=0)


def test_a_dtensor_random_op_without_a_philox_draw_names_itself(mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    from neuron_compile.device import rng

    d = distribute_tensor(torch.zeros(4, device="neuron"), mesh, [Replicate()])
    with rng.region(0, lambda shape: np.arange(4), 4), pytest.raises(NotImplementedError, match="exponential_"):
        d.to_local().exponential_()


# --- two ranks against one ---------------------------------------------------------------------------

@pytest.mark.slow
def test_two_ranks_draw_the_one_rank_full_tensors_whatever_the_sharding(tmp_path, launch_two_ranks, mesh):
    ranks = launch_two_ranks(tmp_path, WORKER, timeout=120)
    for rank, result in enumerate(ranks):
        assert "exception" not in result, f"rank {rank}:\n{result['exception']}"
    one = _one_rank_draws(mesh)
    for kind in ("normal", "uniform", "dropout", "bernoulli"):
        reference = torch.tensor(one[f"{kind}/replicate"])
        for placement in ("shard0", "shard1", "replicate"):
            assert_close(torch.tensor(one[f"{kind}/{placement}"]), reference, rtol=0, atol=0)
            for rank, result in enumerate(ranks):
                assert_close(torch.tensor(result[f"{kind}/{placement}"]), reference, rtol=0, atol=0,
                             msg=lambda m: f"{kind}/{placement} on rank {rank} of 2: {m}")
    dropped = torch.tensor(one["dropout/replicate"])
    assert set(dropped.unique().tolist()) == {0.0, 2.0} and 10 < int((dropped == 0).sum()) < 32
    # the draws were the device's Philox stream, and each group of draws left CUDA's tracker's offset
    assert_close(torch.tensor(one["normal/replicate"]),
                 torch.from_numpy(1.0 + 2.0 * philox.normal(SEED, np.arange(42))).float().reshape(7, 6))
    for result in (one, *ranks):
        assert _state(result["state/shard1"]) == (SEED, 4 * 44)
        assert _state(result["fsdp_state"]) == _state(one["fsdp_state"])
    # fully_shard's parameters are Shard(0) DTensors: each rank held half, and nn.init gave one full tensor
    assert ranks[0]["fsdp_local_shapes"][0] == [3, 10] and one["fsdp_local_shapes"][0] == [6, 10]
    for rank, result in enumerate(ranks):
        for got, want in zip(result["fsdp_init"], one["fsdp_init"]):
            assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=0)
    weight = torch.tensor(one["fsdp_init"][0])
    assert weight.abs().max() <= 1 / 10 ** 0.5 and weight.std() > 0.1  # kaiming_uniform_'s bound for 10 inputs


DTENSOR_RANDOM_OPS = {  # one call each on a DTensor ``d`` of 3 x 4 floats on a one-rank mesh
    "normal_": lambda d, mesh: d.normal_(),
    "uniform_": lambda d, mesh: d.uniform_(),
    "bernoulli_.float": lambda d, mesh: d.bernoulli_(0.5),
    "bernoulli": lambda d, mesh: torch.bernoulli(d.fill_(0.5)),
    "native_dropout": lambda d, mesh: torch.nn.functional.dropout(d.fill_(1.0), 0.5),
    "rand_like": lambda d, mesh: torch.rand_like(d),
    "randn_like": lambda d, mesh: torch.randn_like(d),
    "randint_like": lambda d, mesh: torch.randint_like(d, 10),
    "randint_like.low_dtype": lambda d, mesh: torch.randint_like(d, 3, 10),
    "rand": lambda d, mesh: torch.distributed.tensor.rand(3, 4, device_mesh=mesh),
    "randn": lambda d, mesh: torch.distributed.tensor.randn(3, 4, device_mesh=mesh),
}


@pytest.mark.parametrize("name", sorted(DTENSOR_RANDOM_OPS))
def test_every_dtensor_random_op_draws_from_the_device_stream_not_cpus(mesh, name):
    """DTensor's random ops (its dispatcher's list, ``test_device_hooks``) on a neuron mesh: the values
    depend on the device's Philox offset and not on CPU's stream."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    def run(offset, cpu_draws):
        torch.manual_seed(SEED)
        torch.randn(cpu_draws)  # moves CPU's stream only
        torch.neuron.set_rng_state(torch.tensor(list(SEED.to_bytes(8, "little") + offset.to_bytes(8, "little")),
                                                dtype=torch.uint8))
        d = distribute_tensor(torch.zeros(3, 4, device="neuron"), mesh, [Replicate()])
        out = DTENSOR_RANDOM_OPS[name](d, mesh)
        out = out[0] if isinstance(out, tuple) else out
        assert _state(torch.neuron.get_rng_state().tolist()) == (SEED, offset + 12)
        return out.full_tensor().cpu()

    first = run(0, 1)
    assert_close(run(0, 100), first, rtol=0, atol=0)
    assert not torch.equal(run(16, 1), first)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_recomputes_a_dtensors_dropout_mask(mesh, reentrant):
    """torch.utils.checkpoint saves and restores the device's state (``torch.neuron._initialized``): the
    backward's recomputed dropout draws the forward's mask."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(SEED)
    w = distribute_tensor(torch.ones(8, 6, device="neuron"), mesh, [Shard(0)]).requires_grad_()
    out = checkpoint(lambda a: torch.nn.functional.dropout(a * 2, 0.5), w, use_reentrant=reentrant)
    out.sum().backward()
    kept = out.full_tensor().detach().cpu() != 0
    assert 0 < int(kept.sum()) < 48
    assert_close(w.grad.full_tensor().cpu(), kept.float() * 4, rtol=0, atol=0)


class _Mesh:
    """A device mesh as ``shard_positions`` reads one: its shape and this rank's coordinate."""

    def __init__(self, shape, coordinate):
        self.shape, self._coordinate = tuple(shape), list(coordinate)

    def size(self, dim):
        return self.shape[dim]

    def get_coordinate(self):
        return self._coordinate


class _Spec:
    def __init__(self, shape, mesh, placements):
        self.shape, self.mesh, self.placements = torch.Size(shape), mesh, tuple(placements)


@pytest.mark.parametrize("placements", ["S0,S1", "S1,S0", "S0,S0", "R,S1", "SS0,S0"])
def test_shards_on_a_2d_mesh_cover_the_full_tensor_once_each_where_dtensor_puts_them(placements):
    """FSDP x TP meshes: every rank's positions (``_dtensor_rng_hooks.shard_positions``) together are each
    position of the full tensor once, and a plain shard's block is where DTensor's
    ``compute_local_shape_and_global_offset`` puts it (7 x 5 over a 2 x 3 mesh: uneven, an empty shard)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

    from neuron_compile.device._dtensor_rng_hooks import shard_positions

    make = {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "SS0": _StridedShard(0, split_factor=2)}
    placement = [make[p] for p in placements.split(",")]
    shape, mesh_shape = (7, 5), (2, 3)
    seen = np.zeros(35, dtype=np.int64)
    for i in range(2):
        for j in range(3):
            spec = _Spec(shape, _Mesh(mesh_shape, (i, j)), placement)
            local, offset = _compute_local_shape_and_global_offset(shape, mesh_shape, [i, j], placement)
            positions = shard_positions(spec, local)
            if all((i, j)[d] == 0 for d, p in enumerate(placement) if isinstance(p, Replicate)):  # one replica
                np.add.at(seen, positions.reshape(-1), 1)
            if "SS0" not in placements and positions.size:
                rows, cols = np.arange(local[0]) + offset[0], np.arange(local[1]) + offset[1]
                assert np.array_equal(positions, rows[:, None] * 5 + cols[None, :])
    assert np.array_equal(seen, np.ones(35, dtype=np.int64))
    with pytest.raises(RuntimeError, match="local tensor has shape"):
        shard_positions(_Spec(shape, _Mesh(mesh_shape, (0, 0)), placement), (1, 1))
