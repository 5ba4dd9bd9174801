"""The kernel we ship: ``neuron::attention``, scaled dot-product attention.

``torch.ops.neuron.attention(q, k, v, attn_mask=None, scale=None,
is_causal=False)`` takes ``[..., heads, tokens, head_dim]`` tensors as
``F.scaled_dot_product_attention`` does (a boolean mask keeps True, a float
mask is added; a fully masked row gives zeros, as ATen's math kernel does).
Eagerly it is ATen's SDPA; compiled, a JAX kernel serves it, which XLA's CPU
backend runs faster than the default lowering of attention as models write it
(matmul, ``masked_fill``, softmax, matmul: ``benchmarks/results/kernels.md``).
It

* scales Q (tokens x head_dim) instead of the scores (tokens x tokens);
* adds the mask as a 0/-inf bias instead of a select, with nothing else
  between the QK^T matmul and the exponential (a guard on the row max there
  made the kernel no faster than the default, measured);
* normalizes after the PV matmul: a multiply per output element by the
  reciprocal row sum instead of a divide per score;
* with ``is_causal`` and more than 128 tokens, takes the queries in blocks of
  128 rows, each against the keys up to its last row: the blocks above the
  diagonal, masked anyway, are never computed.

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


def _probabilities(q, k, mask, scale, is_causal, first_row=0):
    """Softmax(q k^T * scale + mask) as (unnormalized p, per-row factor that normalizes it, scale).

    A row with no key left (a fully masked row) gets a zero factor, and a zero bias so that its
    scores stay finite: its output is zero, as ATen's. Nothing else touches the scores between the
    QK^T matmul and the exponential: an isfinite guard on the row max there cost XLA a fusion
    (measured: the kernel was no faster than the default lowering with it)."""
    import jax.numpy as jnp

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("...qd,...kd->...qk", q * jnp.asarray(scale, q.dtype), k)
    rows, cols = s.shape[-2:]
    keep = jnp.arange(first_row, first_row + rows)[:, None] >= jnp.arange(cols)[None, :] if is_causal else None
    additive = None
    if mask is not None:
        if mask.dtype == jnp.bool_:
            keep = mask if keep is None else keep & mask
        else:
            additive = mask.astype(s.dtype)
            keep = additive > -jnp.inf if keep is None else keep & (additive > -jnp.inf)
    ok = None
    if keep is not None:
        ok = keep.any(-1, keepdims=True) if mask is not None else None  # a causal row always keeps key 0
        bias = jnp.where(keep if ok is None else keep | ~ok, 0.0, -jnp.inf).astype(s.dtype)
        if additive is not None:
            bias = bias + jnp.where(ok, additive, 0.0).astype(s.dtype)
        s = s + bias
    p = jnp.exp(s - s.max(-1, keepdims=True))
    total = p.sum(-1, keepdims=True)
    factor = 1.0 / total if ok is None else ok.astype(p.dtype) / total
    return p, factor, scale


BLOCK = 128  # query rows per block of a causal attention


def attention_forward(q, k, v, attn_mask=None, scale=None, is_causal=False):
    import jax.numpy as jnp

    rows = q.shape[-2]
    if is_causal and attn_mask is None and rows == k.shape[-2] and rows > BLOCK:
        # causal: query block i attends keys up to its last row only, so the matmuls and the softmax
        # skip the blocks above the diagonal (about half the work at 512 tokens and more)
        blocks = []
        for first in range(0, rows, BLOCK):
            last = min(first + BLOCK, rows)
            p, factor, _ = _probabilities(q[..., first:last, :], k[..., :last, :], None, scale, True, first)
            blocks.append(jnp.einsum("...qk,...kd->...qd", p, v[..., :last, :]) * factor)
        return jnp.concatenate(blocks, axis=-2)
    p, factor, _ = _probabilities(q, k, attn_mask, scale, is_causal)
    return jnp.einsum("...qk,...kd->...qd", p, v) * factor


def attention_backward(grad, q, k, v, attn_mask=None, scale=None, is_causal=False):
    import jax.numpy as jnp

    p, factor, scale = _probabilities(q, k, attn_mask, scale, is_causal)
    p = p * factor
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
