"""``torch.autocast("neuron", dtype=torch.bfloat16)``: real autocast kernels for the neuron device.

torch 2.13 registers no kernels for ``AutocastPrivateUse1`` (not even the
fallthrough CUDA has, so any op under autocast failed). We register the
fallthrough and, for CUDA's op lists (``aten/src/ATen/autocast_mode.cpp``),
kernels that cast floating neuron arguments before calling through:

* lower precision (matmuls, convolutions, linear, attention): to the autocast
  dtype (``torch.get_autocast_dtype("neuron")``, bfloat16 by default);
* float32 (pointwise ops that lose range, norms, losses, softmax...): to float32;
* promote (``addcmul``, ``cat``...): to the widest floating type among them.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves, tree_map

from . import _torch_hooks

LOWER = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d",
         "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
         "einsum", "addmv", "addr", "mv", "prelu", "chain_matmul", "linalg_multi_dot", "linalg_vecdot",
         "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "lstm_cell", "gru_cell",
         "rnn_tanh_cell", "rnn_relu_cell")
FLOAT32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
           "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
           "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
           "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
           "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
           "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
           "logsumexp", "softmax", "log_softmax", "cumprod", "cumsum", "prod", "sum", "linalg_vector_norm",
           "linalg_matrix_norm", "cross_entropy_loss", "norm")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
           "tensordot", "cat", "stack")

_library = None


def _eligible(value) -> bool:
    return (isinstance(value, torch.Tensor) and value.device.type == _torch_hooks.NAME
            and value.is_floating_point() and value.dtype != torch.float64)


def _cast_to(dtype):
    return lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v


def _kernel(op, policy: str):
    def run(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype(_torch_hooks.NAME)
        elif policy == "float32":
            dtype = torch.float32
        else:
            widest = [v.dtype for v in tree_leaves((args, kwargs)) if _eligible(v)]
            dtype = max(widest, key=lambda d: d.itemsize) if widest else None
        if dtype is not None:
            args, kwargs = tree_map(_cast_to(dtype), (args, kwargs))
        with _torch_hooks.exclude_autocast():
            return op(*args, **kwargs)

    return run


def register() -> None:
    global _library
    if _library is not None:
        return
    _library = _torch_hooks.autocast_library()
    aten = torch.ops.aten
    for policy, names in (("lower", LOWER), ("float32", FLOAT32), ("promote", PROMOTE)):
        for name in names:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if "out" in overload or op._schema.is_mutable:
                    continue
                _library.impl(op, _kernel(op, policy), _torch_hooks.AUTOCAST_KEY)
