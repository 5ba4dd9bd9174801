"""The neuron device indices of this process: how many, and which is current (``torch.neuron``'s
``device_count``, ``current_device``, ``set_device``; ``storage`` checks factories' indices here)."""

from __future__ import annotations

import functools
import os

import torch

from . import _torch_hooks


def device_count() -> int:
    """The neuron devices of this process: ``NEURON_DEVICE_COUNT``, else torchrun's ``LOCAL_WORLD_SIZE``, else 1
    (``runtime/devices.py``).
    ``neuron:i`` lives on PJRT device ``i``."""
    from runtime.devices import local_device_count

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


def _with_index(device):
    """``device`` with the current index when it names neuron without one (``"neuron"``), else itself."""
    if type(device) is str:
        if device == "neuron":
            return torch.device("neuron", current_device())
    elif type(device) is torch.device and device.type == "neuron" and device.index is None:
        return torch.device("neuron", current_device())
    return device


def index_less_moves_follow_current() -> None:
    """``x.to("neuron")``, ``torch.tensor(..., device="neuron")``, ``torch.as_tensor`` / ``asarray`` and
    ``t.new_tensor`` land on the current device (``new_tensor``: on ``t``'s), as on CUDA, when this process has
    several neuron devices.

    torch's C++ gives an index-less device its index from the device guard's ``getDevice`` before our kernel
    sees it (``ensure_has_index`` in ``Tensor.to``; ``new_tensor`` sets a guard to ``t``'s device first), and
    the Python guard of ``torch/csrc/acc`` answers 0 whatever the current device (its ``setDevice`` is a
    no-op): ``x.to("neuron")`` with ``neuron:1`` current made a ``neuron:0`` tensor, and the next op on a
    ``neuron:1`` tensor raised. These Python entry points name the index before C++ sees the device.
    Installed only when the process has several devices (with one device, index 0 is right): a process with one
    device keeps torch's own functions. Under ``torch.compile`` the wrappers of ``torch.tensor``,
    ``as_tensor`` and ``asarray`` are a graph break (``Tensor.to`` is traced by name)."""
    if getattr(torch.Tensor.to, "_neuron_index", False):
        return

    def wrap(original, fix):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            args, kwargs = fix(args, kwargs)
            return original(*args, **kwargs)

        wrapper._neuron_index = True
        return wrapper

    def fix_to(args, kwargs):  # (self, device?, ...) or device=
        if len(args) > 1:
            args = (args[0], _with_index(args[1])) + args[2:]
        if "device" in kwargs:
            kwargs["device"] = _with_index(kwargs["device"])
        return args, kwargs

    def fix_factory(args, kwargs):  # device= (keyword-only in all three)
        if "device" in kwargs:
            kwargs["device"] = _with_index(kwargs["device"])
        return args, kwargs

    def fix_new_tensor(args, kwargs):  # (self, data, *, device=None): None means self's device
        if kwargs.get("device") is None and args and args[0].device.type == "neuron":
            kwargs["device"] = args[0].device
        elif "device" in kwargs:
            kwargs["device"] = _with_index(kwargs["device"])
        return args, kwargs

    torch.Tensor.to = wrap(torch.Tensor.to, fix_to)
    torch.Tensor.new_tensor = wrap(torch.Tensor.new_tensor, fix_new_tensor)
    for name in ("tensor", "as_tensor", "asarray"):
        setattr(torch, name, wrap(getattr(torch, name), fix_factory))
