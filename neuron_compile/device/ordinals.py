"""The neuron device indices of this process: how many, and which is current (``torch.neuron``'s
``device_count``, ``current_device``, ``set_device``; ``storage`` checks factories' indices here)."""

from __future__ import annotations

import os

from . import _torch_hooks


def device_count() -> int:
    """The neuron devices of this process: ``NEURON_DEVICE_COUNT``, else torchrun's ``LOCAL_WORLD_SIZE``, else 1
    (``runtime/devices.py``).
    ``neuron:i`` lives on PJRT device ``i``."""
    from neuron_compile.runtime.devices import local_device_count

    return local_device_count()


_current = None  # the current device index, as torch.cuda's (set_device, torch.accelerator.set_device_index)


def current_device() -> int:
    """The current device: what ``set_device`` set; at first the torchrun local rank (``LOCAL_RANK``) when it
    names a device of this process (one device per local rank, so each rank's tensors land on
    ``neuron:<LOCAL_RANK>``, as accelerate, which reads ``current_device()`` for neuron, expects), else 0."""
    global _current
    if _current is None:
        try:
            rank = int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            rank = 0
        _current = rank if 0 < rank < device_count() else 0
        if _current:
            _torch_hooks.backward_on_calling_thread()  # the autograd engine has a worker for neuron:0 only
    return _current


def check_index(index: int) -> int:
    """``index`` when it names a neuron device of this process; a clear error naming it otherwise."""
    if index == 0 and index.__class__ is int:  # every process has neuron:0 (and reading the count reads the env)
        return 0
    count = device_count()
    if not isinstance(index, int) or not 0 <= index < count:
        names = ", ".join(f"neuron:{i}" for i in range(min(count, 4))) + (", ..." if count > 4 else "")
        raise RuntimeError(f"neuron device {index} is out of range: this process has {count} neuron "
                           f"device{'s' if count != 1 else ''} ({names}); NEURON_DEVICE_COUNT sets how many "
                           "(by default, under torchrun: the local world size, one device per local rank)")
    return index


def set_current(index: int) -> None:
    global _current
    _current = check_index(index)
    if _current:
        _torch_hooks.backward_on_calling_thread()  # the autograd engine has a worker for neuron:0 only

