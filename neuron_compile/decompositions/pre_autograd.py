"""Rewrites of Dynamo's graph before AOTAutograd traces it (``decompose_before_autograd``).

``scaled_dot_product_attention`` becomes ``_sdpa_math`` and ``embedding_bag``
``_embedding_bag_math``: functions of ours written with plain, differentiable
ops, so autograd differentiates them and torch-mlir lowers the result (both
fused ATen kernels have backwards it cannot lower). FlexAttention's
higher-order op becomes its dense kernel (``flex_attention.dense_flex_attention``). Precompile vouches for
these two functions to AOTAutogradCache (``capture.precompile``), since they
are pure functions of their inputs.
"""

from __future__ import annotations

import torch

from .flex_attention import dense_flex_attention, flex_attention_op


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # What ATen's SDPA does before it dispatches (convert_boolean_attn_mask): the
        # math kernel adds the mask, so True must become 0 and False -inf. Without it a
        # boolean mask was added as 1/0 (every transformers model with use_cache=False:
        # llama's logits were off by 0.4).
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )[0]


_SDPA_TARGETS = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}


def _embedding_bag_math(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                        mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                        padding_idx=None):
    """F.embedding_bag as differentiable ops: a gather, then each bag's sum, mean or max."""
    dim = weight.shape[1]
    if input.dim() == 2:  # one bag per row
        bags, per_bag = input.shape
        flat = input.reshape(-1)
        bag = torch.arange(bags, device=input.device).unsqueeze(1).expand(bags, per_bag).reshape(-1)
        keep = torch.ones_like(flat, dtype=torch.bool)
    else:  # bags start at offsets (the last one closes the last bag with include_last_offset)
        flat = input
        bags = offsets.shape[0] - (1 if include_last_offset else 0)
        position = torch.arange(flat.shape[0], device=input.device)
        bag = (position.unsqueeze(1) >= offsets[:bags].unsqueeze(0)).sum(1) - 1
        keep = bag >= 0
        if include_last_offset:
            keep = keep & (position < offsets[-1])
        bag = bag.clamp(min=0)
    if padding_idx is not None:
        keep = keep & (flat != (padding_idx % weight.shape[0]))
    rows = torch.index_select(weight, 0, flat)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if mode == "max":
        lowest = torch.full((), float("-inf"), dtype=weight.dtype, device=weight.device)
        picked = torch.where(keep.unsqueeze(1), rows, lowest)
        out = torch.full((bags, dim), float("-inf"), dtype=weight.dtype, device=weight.device).scatter_reduce(
            0, bag.unsqueeze(1).expand(-1, dim), picked, "amax")
        return torch.where(out == float("-inf"), torch.zeros((), dtype=weight.dtype, device=weight.device), out)
    kept = keep.to(weight.dtype)
    out = torch.zeros(bags, dim, dtype=weight.dtype, device=weight.device).index_add(0, bag, rows * kept.unsqueeze(1))
    if mode == "mean":  # over the bag's kept entries; an empty bag is zero
        count = torch.zeros(bags, dtype=weight.dtype, device=weight.device).index_add(0, bag, kept)
        out = out / count.clamp(min=1).unsqueeze(1)
    return out


def _plain_embedding_bag(node) -> bool:
    """A call whose every argument our math covers (no max_norm renorm, dense gradient as eager's)."""
    import inspect

    try:
        bound = inspect.signature(torch.nn.functional.embedding_bag).bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    args = bound.arguments
    return (args.get("max_norm") is None and not args.get("scale_grad_by_freq", False)
            and not args.get("sparse", False) and args.get("mode", "mean") in ("sum", "mean", "max"))


def decompose_before_autograd(gm: torch.fx.GraphModule) -> int:
    """Rewrite Dynamo's graph before AOTAutograd traces it; returns how many nodes changed.

    ``scaled_dot_product_attention`` dispatches on CPU to the fused
    ``_scaled_dot_product_flash_attention_for_cpu``, whose backward is an opaque
    op torch-mlir cannot lower (every transformers model hits it in training).
    Sending it to the math formulation instead (matmul, scale, mask, softmax,
    matmul: the same algebra) lets autograd differentiate plain ops, and
    leaves the attention pattern visible to our fusion pass. Subgraphs of
    higher-order ops are rewritten too: activation checkpointing (transformers'
    ``gradient_checkpointing_enable()``) puts each layer in one.

    ``embedding_bag`` (nn.EmbeddingBag) is an ATen op torch-mlir does not lower,
    whose backward needs its bag bookkeeping: it becomes a gather and a per-bag
    sum, mean or max of plain ops.

    FlexAttention's higher-order op (``flex_attention``) becomes its dense kernel, its score_mod and
    mask_mod subgraphs inlined into the graph by AOTAutograd's trace.
    """
    changed = 0
    flex = flex_attention_op()
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        here = 0
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target in _SDPA_TARGETS:
                node.target = _sdpa_math
                here += 1
            elif (node.op == "call_function" and node.target is torch.nn.functional.embedding_bag
                  and _plain_embedding_bag(node)):
                node.target = _embedding_bag_math
                here += 1
            elif node.op == "call_function" and flex is not None and node.target is flex:
                node.target = dense_flex_attention
                here += 1
        if here:
            module.recompile()
            changed += here
    return changed
