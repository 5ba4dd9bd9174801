"""The neuron device's random-number state: a Philox ``(seed, offset)`` pair per device, as CUDA's.

Two streams, one for each kind of draw:

* **Plain random ops** on neuron tensors (``torch.randn(..., device="neuron")``, dropout, ``nn.init`` of an
  ordinary module, ``multinomial``) draw from CPU's default generator (``kernels._random``): a script that
  seeds and draws in the same order gets on ``neuron`` the very numbers CPU eager gets. Saving and restoring
  that stream is ``torch.get_rng_state``/``torch.set_rng_state``, as for any CPU draw.
* **DTensor random ops** on a neuron mesh (``normal_``/``uniform_``/``bernoulli``/dropout on a DTensor,
  ``torch.distributed.tensor.randn``, every ``nn.init`` of a ``fully_shard``ed or tensor-parallel module)
  draw from the device's own counter-based stream: Philox4x32-10 (``philox.py``) keyed by the device's
  seed, the element at linear position ``p`` of the *full* tensor taking counter ``offset + p``. Each shard
  draws its own part of that one stream, so a seed gives the same full tensor whatever the sharding
  (``Shard(0)``, ``Shard(1)``, ``Replicate``, uneven and strided shards) and the world size. After each
  such op the offset moves past the full tensor (rounded up to 4, as DTensor's tracker moves CUDA's).

``torch.neuron.get_rng_state()`` is the device's Philox state in CUDA's layout: 16 bytes, the seed as a
uint64 then the offset as an int64 (little-endian), which DTensor's ``OffsetBasedRNGTracker`` reads and
writes (``_PhiloxState``); ``set_rng_state`` takes it back (and, for scripts that saved the device's state
before it had one of its own, a 5,056-byte CPU Mersenne-Twister state, which sets CPU's generator: the
plain draws' stream). ``torch.manual_seed(s)`` and ``torch.neuron.manual_seed(s)`` set both streams (the
device's plain draws are CPU's generator's, so seeding the device seeds it); the offset starts at 0.

The tracker's region for a neuron mesh is ours (``_dtensor_rng_hooks``): it knows the DTensor's spec, so
the draw uses each local element's position in the full tensor. CUDA's own tracker offsets a shard's draw
by ``shard index * local numel`` (rounded to 4), so on CUDA a ``Shard(1)`` tensor, or a shard whose size is
not a multiple of 4, is not the ``Replicate`` tensor; here it is.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch

from . import philox

aten = torch.ops.aten

DEFAULT_SEED = 67280421310721  # CUDA's and CPU's default seed (c10::default_rng_seed_val)
STATE_BYTES = 16  # CUDA's Philox state: seed (uint64), offset (int64)
_CPU_STATE_BYTES = 5056  # CPU's Mersenne-Twister state, what the device's state was before


class PhiloxState:
    """One device's Philox seed and offset (offset: counters used so far)."""

    def __init__(self, seed: int = DEFAULT_SEED, offset: int = 0):
        self.seed, self.offset = seed, offset

    def get_state(self) -> torch.Tensor:
        """CUDA's layout: ``uint8[16]``, the seed as a uint64 then the offset as an int64."""
        packed = np.array([self.seed], dtype="<u8").tobytes() + np.array([self.offset], dtype="<i8").tobytes()
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        raw = bytes(state.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        self.seed = int(np.frombuffer(raw[:8], dtype="<u8")[0])
        self.offset = int(np.frombuffer(raw[8:], dtype="<i8")[0])


_states: dict[int, PhiloxState] = {}


def state(index: int) -> PhiloxState:
    found = _states.get(index)
    if found is None:
        found = _states[index] = PhiloxState()
    return found


def manual_seed(seed: int, indices) -> None:
    """Seed CPU's generator (the plain draws) and the Philox state of each device in ``indices`` with
    ``seed`` (CPU's reading of it: a negative seed as ``torch.manual_seed`` maps it), offset 0."""
    torch.default_generator.manual_seed(int(seed))
    _seed_devices(torch.default_generator.initial_seed(), indices)


def seed(indices) -> int:
    """A non-deterministic seed for CPU's generator and the devices in ``indices`` (``torch.seed``'s)."""
    value = torch.default_generator.seed()
    _seed_devices(value, indices)
    return value


def _seed_devices(value: int, indices) -> None:
    for index in indices:
        current = state(index)
        current.seed, current.offset = value, 0


def get_rng_state(index: int) -> torch.Tensor:
    return state(index).get_state()


def set_rng_state(new_state: torch.Tensor, index: int) -> None:
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError(f"set_rng_state expects a torch.ByteTensor, got {type(new_state).__name__}"
                        f"{'' if not isinstance(new_state, torch.Tensor) else ' of ' + str(new_state.dtype)}")
    if new_state.numel() == _CPU_STATE_BYTES:
        torch.default_generator.set_state(new_state.cpu())  # a state saved before the device had its own
        return
    if new_state.numel() != STATE_BYTES:
        raise RuntimeError(f"the neuron device's RNG state is {STATE_BYTES} bytes (a Philox seed and offset, "
                           f"CUDA's layout), got {new_state.numel()}")
    state(index).set_state(new_state)


# --- DTensor's draws: one region per random op ---------------------------------------------------

class _Region:
    """One DTensor random op's draw: the device's seed and offset at its start, and where the local
    tensor's elements sit in the full tensor (``positions(shape)``: their linear positions, row-major)."""

    def __init__(self, seed: int, offset: int, positions, increment: int):
        self.seed, self.offset, self.positions, self.increment = seed, offset, positions, increment
        self.draws = 0

    def counters(self, shape) -> np.ndarray:
        """The Philox counters of a local tensor of ``shape``; a second draw in one region takes the next
        stretch of the stream."""
        positions = self.positions(tuple(shape))
        base = self.offset + self.draws * self.increment
        self.draws += 1
        return positions.astype(np.uint64) + np.uint64(base)


_local = threading.local()
_RANDOM_FROM = getattr(aten.random_, "from")  # a Python keyword


def drawing() -> bool:
    """Whether a DTensor random op on a neuron mesh is drawing on this thread (``kernels._random`` asks)."""
    return getattr(_local, "region", None) is not None


@contextlib.contextmanager
def region(index: int, positions, increment: int):
    """Random ops inside draw from device ``index``'s Philox stream at the positions ``positions(shape)``
    gives for their local tensor; at the end the offset moves on by ``increment`` per draw (at least one:
    the full tensor's numel rounded up to 4, as DTensor's tracker moves CUDA's)."""
    current = state(index)
    entered = _Region(current.seed, current.offset, positions, increment)
    previous = getattr(_local, "region", None)
    _local.region = entered
    try:
        yield entered
    finally:
        _local.region = previous
        current.offset = entered.offset + max(1, entered.draws) * increment


def draw(op, args, kwargs):
    """Run random op ``op`` on a local neuron tensor inside a region: its values from the Philox stream."""
    from . import transfers

    reg = _local.region
    bound = _bind(op, args, kwargs)
    name = op._schema.name.removeprefix("aten::")
    if op is aten.native_dropout.default:
        x, p, train = bound["input"], float(bound["p"]), bound["train"]
        if train is False or p == 0 or x.numel() == 0:
            reg.counters(x.shape)  # drawn or not, the stream moves past the tensor
            return aten.clone.default(x), aten.ones_like.default(x, dtype=torch.bool)
        keep = torch.from_numpy(philox.uniform(reg.seed, reg.counters(x.shape)) < 1 - p).reshape(x.shape)
        noise = keep.to(x.dtype)
        scaled = noise.mul_(0) if p == 1 else noise.div_(1 - p)
        index = x.device.index
        return aten.mul.Tensor(x, transfers.from_host(scaled, index)), transfers.from_host(keep, index)
    if name in ("normal_", "uniform_", "bernoulli_", "random_"):
        target = bound["self"]
        values = _values(op, name, bound, target, reg)
        transfers.copy_into(target, values)
        return target
    if op in (aten.bernoulli.default, aten.bernoulli.p):
        source = bound["self"]
        p = transfers.to_host(source) if op is aten.bernoulli.default else bound["p"]
        u = torch.from_numpy(philox.uniform(reg.seed, reg.counters(source.shape))).reshape(source.shape)
        return transfers.from_host((u < p).to(source.dtype), source.device.index)
    raise NotImplementedError(
        f"{op} has no draw from the neuron device's Philox stream: DTensor random ops on a neuron mesh draw "
        "normal_, uniform_, bernoulli, random_ and dropout (neuron_compile/device/rng.py)")


def _values(op, name, bound, target, reg) -> torch.Tensor:
    """A CPU tensor of ``target``'s shape and dtype: the in-place random op's values."""
    shape, dtype = tuple(target.shape), target.dtype
    if target.numel() == 0:
        reg.counters(shape)
        return torch.empty(shape, dtype=dtype)
    counters = reg.counters(shape)
    if name == "normal_":
        z = philox.normal(reg.seed, counters)
        return torch.from_numpy(float(bound["mean"]) + float(bound["std"]) * z).reshape(shape).to(dtype)
    if name == "uniform_":
        low, high = float(bound["from"]), float(bound["to"])
        u = philox.uniform(reg.seed, counters, double=dtype == torch.float64)
        values = torch.from_numpy(low + u * (high - low)).reshape(shape).to(dtype)
        # rounding to the dtype can reach the open end: it wraps to the low end, as CUDA's kernel does
        return torch.where(values == high, torch.tensor(low, dtype=dtype), values)
    if name == "bernoulli_":
        u = torch.from_numpy(philox.uniform(reg.seed, counters)).reshape(shape)
        p = bound["p"]
        if isinstance(p, torch.Tensor):
            from . import transfers

            p = transfers.to_host(p).to(torch.float64)
        return (u < p).to(dtype)
    # random_: integers on [low, high), drawn as 64 random bits modulo the range
    low, high = _random_range(op, bound, dtype)
    bits = philox.bits64(reg.seed, counters) % np.uint64(high - low)
    return (torch.from_numpy(bits.astype(np.int64)) + low).reshape(shape).to(dtype)


def _random_range(op, bound, dtype) -> tuple[int, int]:
    """``random_``'s half-open range: ``to`` alone, ``from`` and ``to``, or the dtype's default (its
    integers; a float's integers it holds exactly, 0 to ``2**digits`` inclusive)."""
    if dtype == torch.bool:
        top = 2
    elif dtype.is_floating_point:
        top = 2 ** {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype] + 1
    else:
        top = torch.iinfo(dtype).max + 1
    if op is aten.random_.to:
        return 0, int(bound["to"])
    if op is _RANDOM_FROM:
        high = bound["to"]
        return int(bound["from"]), top if high is None else int(high)
    return 0, top


def _bind(op, args, kwargs) -> dict:
    """``op``'s arguments by name, defaults filled in."""
    bound = {}
    for i, argument in enumerate(op._schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            bound[argument.name] = args[i]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        else:
            bound[argument.name] = argument.default_value
    return bound
