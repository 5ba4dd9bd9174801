"""The reference executor: StableHLO compiled and run by XLA through jaxlib's PJRT CPU client.

Design notes
------------
* We talk to the PJRT client directly (``jax.extend.backend.get_backend()``), not
  to ``jax.numpy``: jax canonicalizes int64 to int32 unless ``jax_enable_x64`` is
  on, and flipping that global behind the user's back is not ours to do.
  ``_jax.dlpack_managed_tensor_to_buffer`` builds a PJRT buffer from a DLPack
  capsule *without* that canonicalization, so int64 token ids stay int64, and it
  shares memory with the torch tensor (zero copy on the CPU).
* Outputs come back through DLPack too (``torch.from_dlpack``): the torch tensor
  keeps the XLA buffer alive, no copy.
* An ``XlaExecutable`` knows nothing about torch.fx or Dynamo; it takes the
  StableHLO text (or a serialized executable) and a list of tensors. The
  backend decides which graph inputs and outputs reach it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

__all__ = ["XlaExecutable", "XlaCompileError", "platform_description"]


class XlaCompileError(RuntimeError):
    """XLA refused to compile a StableHLO module."""


@functools.lru_cache(maxsize=1)
def _client():
    from jax.extend.backend import get_backend

    return get_backend("cpu")


@functools.lru_cache(maxsize=1)
def _device():
    return _client().local_devices()[0]


@functools.lru_cache(maxsize=1)
def _device_list():
    from jax._src.lib import xla_client

    return xla_client.DeviceList((_device(),))


def _compile_options():
    from jax._src.lib import xla_client

    return xla_client.CompileOptions()


@functools.lru_cache(maxsize=1)
def platform_description() -> dict:
    """What the executor runs on: a cache-key part and a manifest field."""
    import jaxlib

    client = _client()
    return {
        "platform": client.platform,
        "platform_version": client.platform_version,
        "device_kind": _device().device_kind,
        "jaxlib": jaxlib.__version__,
    }


def _to_buffer(tensor: torch.Tensor):
    from jax._src.lib import _jax

    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    # Device type 1 is kDLCPU; copy=None lets PJRT alias the torch storage when
    # it is suitably aligned and copy otherwise.
    return _jax.dlpack_managed_tensor_to_buffer(tensor.__dlpack__(), _device(), None, None, 1)


def _to_tensor(array) -> torch.Tensor:
    if array.size == 0:
        # DLPack of a zero-size XLA buffer is not always exportable; nothing to share anyway.
        import numpy as np

        return torch.from_numpy(np.asarray(array).copy())
    return torch.from_dlpack(array)


@dataclass
class XlaExecutable:
    """One compiled XLA executable for a static-shape StableHLO module."""

    loaded: object
    compile_seconds: float = 0.0

    @classmethod
    def compile(cls, stablehlo_text: str) -> "XlaExecutable":
        start = time.perf_counter()
        try:
            loaded = _client().compile_and_load(stablehlo_text, _device_list(), _compile_options())
        except Exception as exc:  # jaxlib raises XlaRuntimeError
            raise XlaCompileError(str(exc)) from exc
        return cls(loaded, time.perf_counter() - start)

    def serialize(self) -> bytes:
        return bytes(_client().serialize_executable(self.loaded))

    @classmethod
    def deserialize(cls, data: bytes) -> "XlaExecutable":
        start = time.perf_counter()
        loaded = _client().deserialize_executable(data, _device_list(), _compile_options())
        return cls(loaded, time.perf_counter() - start)

    def run_buffers(self, buffers: list) -> list:
        """Execute on PJRT buffers; returns one XLA array per output."""
        results = self.loaded.execute_sharded(buffers).disassemble_into_single_device_arrays()
        return [per_device[0] for per_device in results]

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_to_tensor(a) for a in self.run_buffers([_to_buffer(t) for t in tensors])]


to_buffer = _to_buffer
to_tensor = _to_tensor
