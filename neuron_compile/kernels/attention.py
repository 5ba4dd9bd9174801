"""The kernel we ship: ``neuron::attention``, scaled dot-product attention.

``torch.ops.neuron.attention(q, k, v, attn_mask=None, scale=None,
is_causal=False)`` takes ``[..., heads, tokens, head_dim]`` tensors as
``F.scaled_dot_product_attention`` does (a boolean mask keeps True, a float
mask is added; a fully masked row gives zeros, as ATen's math kernel does).
Eagerly it is ATen's SDPA; compiled, a JAX kernel serves it, which XLA's CPU
backend runs faster than the default lowering of the same attention (SDPA's
math decomposition through Torch-MLIR), because it

* scales Q (tokens x head_dim) instead of the scores (tokens x tokens);
* applies the mask as an additive bias (0 / -inf) instead of a select: XLA
  fuses the add into the max and exp fusions, the select's broadcast it did not;
* normalizes after the PV matmul: one multiply per output element by the
  reciprocal row sum, instead of a divide per score.

The backward kernel recomputes the probabilities from Q and K (nothing of
tokens x tokens is saved for it) and gives dQ, dK, dV. Results match the
default lowering within float32 rounding (``benchmarks/bench_kernels.py``).

``transformers_attention`` is the same op behind transformers' attention
interface: ``register_transformers_attention()`` makes
``attn_implementation="neuron"`` available to every model that takes
``"sdpa"``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import register_kernel


@torch.library.custom_op("neuron::attention", mutates_args=())
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              scale: float | None = None, is_causal: bool = False) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


@attention.register_fake
def _(query, key, value, attn_mask=None, scale=None, is_causal=False):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _probabilities(q, k, mask, scale, is_causal):
    """Softmax(q k^T * scale + bias) as (unnormalized p, reciprocal row sum)."""
    import jax.numpy as jnp

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("...qd,...kd->...qk", q * jnp.asarray(scale, q.dtype), k)
    if is_causal:
        rows, cols = s.shape[-2:]
        keep = jnp.arange(rows)[:, None] >= jnp.arange(cols)[None, :]
        s = s + jnp.where(keep, 0.0, -jnp.inf).astype(s.dtype)
    if mask is not None:
        s = s + (jnp.where(mask, 0.0, -jnp.inf).astype(s.dtype) if mask.dtype == jnp.bool_ else mask.astype(s.dtype))
    top = s.max(-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0))
    total = p.sum(-1, keepdims=True)
    return p, jnp.where(total > 0, 1.0 / total, 0.0).astype(p.dtype), scale


def attention_forward(q, k, v, attn_mask=None, scale=None, is_causal=False):
    import jax.numpy as jnp

    p, inverse, _ = _probabilities(q, k, attn_mask, scale, is_causal)
    return jnp.einsum("...qk,...kd->...qd", p, v) * inverse


def attention_backward(grad, q, k, v, attn_mask=None, scale=None, is_causal=False):
    import jax.numpy as jnp

    p, inverse, scale = _probabilities(q, k, attn_mask, scale, is_causal)
    p = p * inverse
    out = jnp.einsum("...qk,...kd->...qd", p, v)
    dv = jnp.einsum("...qk,...qd->...kd", p, grad)
    dp = jnp.einsum("...qd,...kd->...qk", grad, v)
    ds = p * (dp - (grad * out).sum(-1, keepdims=True))
    dq = jnp.einsum("...qk,...kd->...qd", ds, k) * jnp.asarray(scale, q.dtype)
    dk = jnp.einsum("...qk,...qd->...kd", ds, q) * jnp.asarray(scale, q.dtype)
    return dq, dk, dv, None


register_kernel("neuron::attention", attention_forward, backward=attention_backward)


def transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """transformers' attention interface (``sdpa_attention_forward``'s signature) on ``neuron::attention``."""
    if dropout and module.training:
        raise ValueError("neuron::attention has no dropout: set the model's attention dropout to 0")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, :key.shape[-2]]
    out = attention(query, key, value, attention_mask, scaling, bool(is_causal))
    return out.transpose(1, 2).contiguous(), None


def register_transformers_attention(name: str = "neuron") -> str:
    """Make ``attn_implementation=name`` run ``neuron::attention`` in transformers models (the masks are
    built as for ``"sdpa"``). Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(name, transformers_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    return name
