"""``torch.neuron``: the device module torch finds by name (``torch.neuron.is_available()``...).

Functions only read counters or seed a generator; none starts XLA.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from . import ordinals
from .ordinals import check_index, current_device, device_count  # noqa: F401 (torch.neuron's)
from . import storage as _storage


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


# torch.utils.checkpoint saves and restores a device's RNG state only where its module says it started
# (``torch.cuda._initialized``): a DTensor's dropout recomputed in a checkpoint's backward must draw its mask again
_initialized = True


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs on the device (XLA computes it natively), as ``torch.cuda.is_bf16_supported()``."""
    return True


def _lazy_init() -> None:
    """Make the device ready for its first op (``torch.cuda._lazy_init``'s name): its direct kernels, and
    the executor's adapter for its buffers. The first eager op does it; a compiled graph that makes
    neuron tensors from no neuron input runs before any (the executor asks for it by this name)."""
    from .aten_kernels import register_direct_kernels

    register_direct_kernels()


def _is_in_bad_fork() -> bool:
    return False


def _index(device) -> int:
    """The index ``device`` names (an int, ``"neuron:1"``, a ``torch.device``; None or no index: the current
    device), checked."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"expected a neuron device, got {device}")
        if device.index is None:
            return current_device()
        device = device.index
    return check_index(int(device))


def set_device(device) -> None:
    """Make ``device`` the current neuron device (``torch.neuron.set_device(1)``, and
    ``torch.accelerator.set_device_index(1)``, routed here); a negative int is a no-op, as on CUDA."""
    if isinstance(device, int) and device < 0:
        return
    ordinals.set_current(_index(device))


def _exchange_device(index: int) -> int:
    """``torch.accelerator.device_index``'s enter and exit: set ``index`` (negative: nothing), return the old."""
    previous = current_device()
    if index >= 0:
        set_device(index)
    return previous


def get_device_name(device=None) -> str:
    from neuron_compile.runtime.executor import platform_description

    return f"neuron (XLA {platform_description()['platform']})"


class _DeviceProperties(NamedTuple):
    name: str
    total_memory: int  # bytes: our buffers live in the host's memory (PJRT's CPU client)


def get_device_properties(device=None) -> _DeviceProperties:
    """``torch.neuron.get_device_properties(0).name`` (TRL's trainers read it), as ``torch.cuda``'s."""
    _index(device)
    return _DeviceProperties(get_device_name(), mem_get_info()[1])


def synchronize(device=None) -> None:
    """Wait for every op issued so far: the device's queue runs (``op_queue``), and XLA finishes it."""
    _index(device)
    from . import op_queue

    op_queue.synchronize()


# Random numbers (``rng.py``): plain random ops on neuron tensors draw from CPU's default generator (CPU's
# numbers); DTensor random ops on a neuron mesh from the device's Philox (seed, offset) state, which these
# get and set in CUDA's layout (16 bytes) for DTensor's tracker, fork_rng and checkpointing.

def manual_seed(seed: int) -> None:
    """Seed the current device's Philox state (offset 0) and CPU's generator, which plain draws use."""
    from . import rng

    rng.manual_seed(seed, [current_device()])


def manual_seed_all(seed: int) -> None:
    from . import rng

    rng.manual_seed(seed, range(device_count()))


def seed() -> None:
    from . import rng

    rng.seed([current_device()])


def seed_all() -> None:
    from . import rng

    rng.seed(range(device_count()))


def initial_seed() -> int:
    """The current device's Philox seed."""
    from . import rng

    return rng.state(current_device()).seed


def get_rng_state(device=None) -> torch.Tensor:
    """The device's Philox state as CUDA's: ``uint8[16]``, the seed (uint64) then the offset (int64)."""
    from . import rng

    return rng.get_rng_state(_index(device))


def set_rng_state(state: torch.Tensor, device=None) -> None:
    from . import rng

    rng.set_rng_state(state, _index(device))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


def memory_allocated(device=None) -> int:
    """Bytes of live PJRT buffers held by neuron tensors."""
    _index(device)
    return _storage.memory_allocated()


def max_memory_allocated(device=None) -> int:
    _index(device)
    return _storage.max_memory_allocated()


def memory_reserved(device=None) -> int:
    """The allocated bytes: nothing is cached (a buffer is freed when its last tensor dies)."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats_as_nested_dict(device=None) -> dict:
    """``allocated_bytes`` and ``reserved_bytes``, each ``{"all": {current, peak, allocated, freed}}``."""
    _index(device)
    return _storage.memory_stats()


def memory_stats(device=None) -> dict:
    """``memory_stats_as_nested_dict`` flattened as ``torch.cuda.memory_stats`` does
    (``"allocated_bytes.all.current"``...)."""
    flat = {}

    def flatten(prefix, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    flatten("", memory_stats_as_nested_dict(device))
    return dict(sorted(flat.items()))


def reset_peak_memory_stats(device=None) -> None:
    _index(device)
    _storage.reset_peak_memory_stats()


def reset_accumulated_memory_stats(device=None) -> None:
    _index(device)
    _storage.reset_accumulated_memory_stats()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary``'s report for the device (``memory.memory_summary``)."""
    from . import memory

    _index(device)
    return memory.memory_summary(device, abbreviated)


def memory_snapshot(device=None) -> list:
    """``torch.cuda.memory_snapshot``: a segment per live buffer (``memory._snapshot``)."""
    from . import memory

    return memory.memory_snapshot(device)


def get_executed_ops() -> dict[str, int]:
    """Every ATen op that reached the device, with its calls (``op_tracking``; torch_neuronx's name)."""
    from .op_tracking import get_executed_ops

    return get_executed_ops()


def get_fallback_ops() -> dict[str, int]:
    """The ops that ran on host copies of their neuron tensors, with their calls (``op_tracking``)."""
    from .op_tracking import get_fallback_ops

    return get_fallback_ops()


def clear_op_tracking() -> None:
    from .op_tracking import clear_op_tracking

    clear_op_tracking()


def __getattr__(name):
    # ``torch.neuron.memory`` (_record_memory_history, _snapshot, _dump_snapshot): loaded when first asked for
    if name == "memory":
        from . import memory

        return memory
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes: our buffers live in the host's memory (PJRT's CPU client)."""
    _index(device)
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def empty_cache() -> None:
    """Free what nothing references: buffers die with their tensors; this collects cycles."""
    import gc

    gc.collect()


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _get_device_index(device=None, optional=False) -> int:
    return _index(device)


class device:
    """``with torch.neuron.device(1):``: ``neuron:1`` is the current device inside (``None``: unchanged)."""

    def __init__(self, device):
        self._index = _index(device) if device is not None else None
        self._previous = None

    def __enter__(self):
        if self._index is not None:
            self._previous = _exchange_device(self._index)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            set_device(self._previous)
        return False


# Streams and events for device-agnostic code (FSDP2 makes its all-gather and reduce-scatter streams
# with ``device_handle.Stream()`` and orders them with events): the device runs one op after another
# (``synchronize``), so these are torch.cpu's, which order nothing because nothing needs ordering.
from torch.cpu import Event, Stream, StreamContext, current_stream, stream  # noqa: E402, F401
