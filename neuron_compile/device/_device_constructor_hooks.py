"""``x.to("neuron")`` and friends land on the current neuron device when a process has several.

The one private torch API here: ``torch.utils._device._device_constructors`` (the constructors a
``with torch.device(...)`` block gives its device to; ``tests/test_device_hooks.py`` checks it)."""

from __future__ import annotations

import functools

import torch
import torch.utils._device

from . import ordinals


def _with_index(device):
    """``device`` with the current index when it names neuron without one (``"neuron"``), else itself."""
    if type(device) is str:
        if device == "neuron":
            return torch.device("neuron", ordinals.current_device())
    elif type(device) is torch.device and device.type == "neuron" and device.index is None:
        return torch.device("neuron", ordinals.current_device())
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
    device keeps torch's own functions. Dynamo traces through them with no graph break (checked: a compiled
    function calling ``torch.tensor``, ``as_tensor`` and ``new_tensor`` stays one frame)."""
    if getattr(torch.Tensor.to, "_neuron_index", False):
        return
    # torch.device("meta") as a context manager (a TorchFunctionMode) gives a constructor its device when
    # ``func in _device_constructors()``, a set of torch's functions computed once, on first use: computed after
    # these wrappers replace torch.tensor, it would hold them, and the originals they call would no longer get
    # the context's device (transformers, which asks ``torch.tensor([]).device``, then ran its inits on meta)
    torch.utils._device._device_constructors()

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
