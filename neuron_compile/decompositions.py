"""The decomposition table AOTAutograd applies before Torch-MLIR sees a graph.

torch-mlir's FX importer applies no decompositions of its own, so what reaches
it is exactly what this table leaves. Three layers, later ones win:

1. torch-mlir's own table (``fx_decomp_util.get_decomposition_table``): PyTorch's
   core-ATen decompositions, minus a few whose output torch-mlir lowers worse
   (roll, one_hot, rms_norm, ...: it keeps its C++ lowering for those), plus
   the overloads torch-mlir needs decomposed (layer/group/batch norm, SDPA, ...);
2. ours, below: ops that the table leaves and that torch-mlir does not
   legalize to StableHLO. Each entry says which model hits it.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

_OURS: dict = {}


def _ours(op):
    return register_decomposition(op, registry=_OURS)


@_ours(aten.squeeze.dims)
def _squeeze_dims(x: torch.Tensor, dims):
    # Every transformers causal-LM loss hits this (cross-entropy's target squeeze);
    # torch-mlir legalizes only squeeze.dim. A view to the squeezed shape is exact.
    if x.dim() == 0:
        return aten.view.default(x, [])
    wanted = {d % x.dim() for d in dims}
    shape = [s for i, s in enumerate(x.shape) if not (i in wanted and s == 1)]
    return aten.view.default(x, shape)


@_ours(aten.slice_scatter)
def _slice_scatter(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1):
    # Backward of any slice (rotary embeddings' rotate_half in llama, qwen, ...) emits
    # slice_scatter with end=INT64_MAX, on which torch-mlir's StableHLO lowering dies
    # with std::bad_alloc. Clamp the bounds; a unit step becomes a concatenation.
    dim = dim % x.dim()
    size = x.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    start, end = max(0, min(start, size)), max(0, min(end, size))
    if step != 1:
        from torch._decomp import decomposition_table as torch_table

        return torch_table[aten.slice_scatter.default](x, src, dim, start, end, step)
    pieces = []
    if start > 0:
        pieces.append(aten.slice.Tensor(x, dim, 0, start))
    pieces.append(src)
    if end < size:
        pieces.append(aten.slice.Tensor(x, dim, end, size))
    return aten.cat.default(pieces, dim) if len(pieces) > 1 else aten.clone.default(src)


@_ours(aten.max_pool2d_with_indices_backward)
def _max_pool2d_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    # Every CNN with max-pooling hits this in training; torch-mlir has no StableHLO
    # lowering for it. The forward's indices are flat positions in each (N, C)
    # plane, so the gradient is a scatter-add of grad_output into those positions
    # (overlapping windows add up, as in eager).
    batch = list(x.shape[:-2])
    plane = x.shape[-2] * x.shape[-1]
    zeros = aten.new_zeros.default(grad_output, batch + [plane])
    flat_grad = aten.view.default(grad_output, batch + [-1])
    flat_idx = aten.view.default(indices, batch + [-1])
    return aten.view.default(aten.scatter_add.default(zeros, -1, flat_idx, flat_grad), list(x.shape))


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """The table we hand to AOTAutograd (a fresh dict each process, shared after)."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table = dict(get_decomposition_table())
    table.update(_OURS)
    return table


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )[0]


_SDPA_TARGETS = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}


def decompose_before_autograd(gm: torch.fx.GraphModule) -> int:
    """Rewrite Dynamo's graph before AOTAutograd traces it; returns how many nodes changed.

    ``scaled_dot_product_attention`` dispatches on CPU to the fused
    ``_scaled_dot_product_flash_attention_for_cpu``, whose backward is an opaque
    op torch-mlir cannot lower (every transformers model hits it in training).
    Sending it to the math formulation instead (matmul, scale, mask, softmax,
    matmul: the same algebra) lets autograd differentiate plain ops, and
    leaves the attention pattern visible to our fusion pass.
    """
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA_TARGETS:
            node.target = _sdpa_math
            changed += 1
    if changed:
        gm.recompile()
    return changed
