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
* the dispatcher's keyset and exclude guards, to run autocast kernels.
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
