"""``neuron::rms_norm``: RMSNorm as a custom op with a JAX kernel and its backward.

``torch.ops.neuron.rms_norm(x, weight, eps)`` computes what transformers'
``LlamaRMSNorm`` computes: in float32, ``x * rsqrt(mean(x**2, -1) + eps)``,
cast back to ``x``'s dtype, times ``weight``. Eagerly it runs those ATen ops;
compiled, the JAX kernel serves it. Hugging Face's ``kernels`` library swaps
it in for a model's ``RMSNorm`` layers through our local layer repository
(``hf``).
"""

from __future__ import annotations

import torch

from . import register_kernel


@torch.library.custom_op("neuron::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    wide = x.to(torch.float32)
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


def rms_norm_forward(x, weight, eps):
    import jax.numpy as jnp

    wide = x.astype(jnp.float32)
    wide = wide * (1.0 / jnp.sqrt((wide * wide).mean(-1, keepdims=True) + eps))
    return weight * wide.astype(x.dtype)


def rms_norm_backward(grad, x, weight, eps):
    import jax.numpy as jnp

    wide = x.astype(jnp.float32)
    inverse = 1.0 / jnp.sqrt((wide * wide).mean(-1, keepdims=True) + eps)
    normed = wide * inverse
    dweight = (grad * normed.astype(x.dtype)).reshape(-1, x.shape[-1]).sum(0).astype(weight.dtype)
    dnormed = (grad * weight).astype(jnp.float32)
    dx = inverse * (dnormed - normed * (dnormed * normed).mean(-1, keepdims=True))
    return dx.astype(x.dtype), dweight


register_kernel("neuron::rms_norm", rms_norm_forward, backward=rms_norm_backward)
