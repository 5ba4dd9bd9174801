"""Random distributions torch-mlir has no lowering for: ``cauchy``, ``log_normal``, ``geometric``,
``normal``'s overloads, ``randint_like`` and ``multinomial`` (Gumbel-max), each from uniform draws.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

SAMPLING: dict = {}


def _register(op):
    return register_decomposition(op, registry=SAMPLING)


# --------------------------------------------------------------------------- random distributions

# torch-mlir lowers none of these samplers; each is its distribution's transform of
# uniform or standard normal draws (rand_like / randn_like, which lower), as ATen's CPU
# kernels do (cauchy: inverse CDF; log_normal: exp of a normal; geometric: the inverse CDF
# of a uniform on (0, 1]). An explicit generator is left to fail lowering.


def _open_uniform(x, dtype=None):
    """Uniform on (0, 1]: 1 - U[0, 1)."""
    return 1.0 - torch.rand_like(x, dtype=dtype or x.dtype)


@_register(aten.cauchy)
def _cauchy(x, median: float = 0.0, sigma: float = 1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return median + sigma * torch.tan(math.pi * (torch.rand_like(x) - 0.5))


@_register(aten.log_normal)
def _log_normal(x, mean: float = 1.0, std: float = 2.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return torch.exp(mean + std * torch.randn_like(x))


@_register(aten.geometric)
def _geometric(x, p: float, *, generator=None):
    # trials until the first success: ceil(log(u) / log(1 - p)), at least 1
    if generator is not None:
        return NotImplemented
    u = _open_uniform(x, torch.float32)
    k = torch.ceil(torch.log(u) / math.log1p(-p)) if p < 1 else torch.ones_like(u)
    return torch.clamp(k, min=1).to(x.dtype)


@_register(aten.normal.Tensor_Tensor)
def _normal_tt(mean, std, *, generator=None):
    if generator is not None:
        return NotImplemented
    shape = torch.broadcast_shapes(mean.shape, std.shape)
    z = torch.randn(list(shape), dtype=mean.dtype, device=mean.device)
    return mean + std * z


@_register(aten.normal.Tensor_float)
def _normal_tf(mean, std: float = 1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn_like(mean)


@_register(aten.normal.float_Tensor)
def _normal_ft(mean: float, std, *, generator=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn_like(std)


@_register(aten.normal.float_float)
def _normal_ff(mean: float, std: float, size, *, generator=None, dtype=None, layout=None, device=None,
               pin_memory=None):
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn(list(size), dtype=dtype or torch.get_default_dtype(), device=device)


def _randint_like(x, low, high, dtype):
    # floor(low + (high - low) U) from a float32 U (rand_like in float64 does not lower): every
    # integer reachable only while high - low <= 2^24; wider ranges are left to fail lowering
    if high - low > 2 ** 24:
        return NotImplemented
    u = torch.rand(list(x.shape), dtype=torch.float32, device=x.device)  # rand_like of an integer x does not lower
    return torch.clamp(torch.floor(low + (high - low) * u), max=high - 1).to(dtype or x.dtype)


@_register(aten.randint_like.default)
def _randint_like_high(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint_like(x, 0, high, dtype)


@_register(aten.randint_like.low_dtype)
def _randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint_like(x, low, high, dtype)


@_register(aten.multinomial)
def _multinomial(weights, num_samples: int, replacement: bool = False, *, generator=None):
    # Gumbel-max: argmax(log w + G) is a draw of category i with probability w_i / sum(w);
    # the top num_samples keys of one set of draws are a draw without replacement, and
    # a fresh set per sample is a draw with replacement. Zero weights get -inf keys.
    if generator is not None:
        return NotImplemented
    logits = torch.log(weights.to(torch.float32))
    if replacement:
        shape = list(weights.shape[:-1]) + [num_samples, weights.shape[-1]]
        keys = logits.unsqueeze(-2) - torch.log(-torch.log(_open_uniform(torch.empty(shape, device=weights.device),
                                                                          torch.float32)))
        return torch.argmax(keys, dim=-1)
    keys = logits - torch.log(-torch.log(_open_uniform(logits, torch.float32)))
    return torch.topk(keys, num_samples, dim=-1).indices
