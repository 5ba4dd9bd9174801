"""Every private or experimental torch API the ``neuron`` device stands on, and nothing else.

torch 2.13 has no public way to make a device in Python. What we use (each
checked by ``tests/test_device_hooks.py``, which fails loudly if torch changes
it):

* ``torch.utils.backend_registration._setup_privateuseone_for_python_backend``:
  renames PrivateUse1 to ``neuron``, generates ``Tensor.neuron()`` and friends,
  registers the device module, a Python hook and a device guard;
* ``torch._C._acc.create_empty_tensor``: a plain ``torch.Tensor`` on
  ``neuron:0`` with a 0-byte storage, whose Python storage object carries our
  PJRT buffer;
* ``OpOverload.redispatch`` to the Meta key: view ops change metadata only;
* ``torch._C._construct_storage_from_data_pointer``: a storage with a unique,
  never dereferenced address, so ``data_ptr()`` tells tensors apart;
* the dispatcher's keyset and exclude guards, to run autocast kernels;
* ``Tensor._reduce_ex_internal`` (``torch.save`` through a CPU copy, as for
  XLA), ``torch.serialization.register_package`` (``map_location="neuron"``),
  ``torch._tensor_str._tensor_str`` (printing from one CPU copy, as for XLA),
  and ``nn.Module.to`` run with torch's swap path (tied weights stay tied).
"""

from __future__ import annotations

import torch

NAME = "neuron"
PRIVATE_KEY = "PrivateUse1"
AUTOCAST_KEY = "AutocastPrivateUse1"

META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def setup_backend(backend_module) -> None:
    """Rename PrivateUse1 to ``neuron`` and register the module, hook and guard torch expects."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME, backend_module=backend_module, hook=_Hook(),
                                            device_guard=_Guard())


class _Hook(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def empty_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor on ``neuron:0`` with no data (its storage is ours to fill)."""
    return torch._C._acc.create_empty_tensor(list(shape), dtype)


def meta_redispatch(op, *args, **kwargs):
    """Run ``op``'s Meta kernel on neuron tensors: a view op makes a neuron view of the same storage."""
    return op.redispatch(META, *args, **kwargs)


def unique_storage(nbytes: int, address: int) -> torch.UntypedStorage:
    """A neuron storage of ``nbytes`` at a fake ``address`` (never dereferenced: our data is in PJRT)."""
    return torch._C._construct_storage_from_data_pointer(address, torch.device(NAME, 0), nbytes)


def fallback_library(handler) -> torch.library.Library:
    """Send every ATen op that has no neuron kernel of its own to ``handler(op, *args, **kwargs)``."""
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(handler, PRIVATE_KEY)
    return lib


def exclude_autocast():
    """A guard under which autocast kernels call through to the backend (as C++ autocast kernels do)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))


def save_through_cpu() -> None:
    """``torch.save`` a neuron tensor as PyTorch saves an XLA one: a CPU copy plus the device it came
    from, rebuilt by ``torch._utils._rebuild_device_tensor_from_cpu_tensor`` (which honours
    ``map_location`` and is allowed under ``weights_only=True``). torch takes that path only for
    tensors without a storage; ours have one (it carries the PJRT buffer)."""
    original = torch.Tensor._reduce_ex_internal
    if getattr(original, "_neuron", False):
        return

    def _reduce_ex_internal(self, proto):
        if self.device.type == NAME:
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.cpu(), self.dtype, str(self.device), self.requires_grad))
        return original(self, proto)

    _reduce_ex_internal._neuron = True
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal


class _AutocastLibrary:
    """Autocast kernels for ``AutocastPrivateUse1``, over a fallthrough for every other op."""

    def __init__(self):
        self._fallthrough = torch.library.Library("_", "IMPL")
        self._fallthrough.fallback(torch.library.fallthrough_kernel, AUTOCAST_KEY)
        self._kernels = torch.library.Library("aten", "IMPL")

    def impl(self, op, fn, key):
        self._kernels.impl(op, fn, key)


def autocast_library() -> _AutocastLibrary:
    return _AutocastLibrary()


def load_onto_device() -> None:
    """``torch.load(..., map_location="neuron")``: restore a storage onto the device by copying its bytes
    into a neuron tensor. torch's generic path makes ``torch.UntypedStorage(n, device="neuron")``, which
    needs a C++ allocator we do not have (it segfaults)."""
    import torch.serialization as serialization

    def tag(obj):
        return None  # what we save is a CPU copy (save_through_cpu): torch's own tags apply

    def restore(obj, location):
        if not str(location).startswith(NAME):
            return None
        index = torch.device(location).index
        if index not in (None, 0):
            raise RuntimeError(f"cannot load onto {location}: there is 1 neuron device (neuron:0); "
                               "use map_location to pick another")
        host = torch.empty(0, dtype=torch.uint8).set_(obj.cpu() if obj.device.type != "cpu" else obj)
        return host.to(NAME).untyped_storage()

    serialization.register_package(5, tag, restore)


def keep_parameters_on_conversion() -> None:
    """``module.to("neuron")`` (and back) keeps each Parameter object, as ``.to("cuda")`` does.

    torch moves a parameter in place (``param.data = ...``) only between CPU, CUDA and a few other
    "dense" backends (``_has_compatible_shallow_copy_type``); for PrivateUse1 it makes a new Parameter
    per module, which unties tied weights (GPT-2's ``lm_head`` and ``wte``) and strands optimizers
    built before the move. For conversions that touch the device we turn on torch's swap path
    (``torch.__future__.set_swap_module_params_on_conversion``) for the duration of the call.
    """
    original = torch.nn.Module.to
    if getattr(original, "_neuron", False):
        return

    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        involved = device is not None and device.type == NAME
        if not involved and device is not None:
            involved = any(p.device.type == NAME for p in self.parameters())
        if not involved or torch.__future__.get_swap_module_params_on_conversion():
            return original(self, *args, **kwargs)
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)

    to._neuron = True
    to.__doc__ = original.__doc__
    torch.nn.Module.to = to


def print_through_cpu() -> None:
    """Format a neuron tensor's values from one CPU copy, as torch does for XLA: printing runs a dozen
    ops (abs, isfinite, masked_select...) on the tensor, each of which would be compiled for the device.
    The suffixes (``device='neuron:0'``, ``grad_fn=...``) still come from the neuron tensor."""
    import torch._tensor_str as tensor_str

    original = tensor_str._tensor_str
    if getattr(original, "_neuron", False):
        return

    def _tensor_str(self, indent):
        if self.device.type == NAME:
            self = self.detach().cpu()
        return original(self, indent)

    _tensor_str._neuron = True
    tensor_str._tensor_str = _tensor_str
