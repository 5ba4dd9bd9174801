"""FlexAttention (``torch.nn.attention.flex_attention``) on the neuron device and in our graphs: the one
place that touches torch's FlexAttention internals (torch 2.13).

Eager. ``flex_attention`` refuses every device but CUDA, CPU, XPU, HPU and MPS in ``_validate_device``
(and CPU and MPS whenever an input requires grad). Past that check it is device-generic: it runs its
higher-order op ``torch.ops.higher_order.flex_attention`` under ``torch.compile(backend="eager")``, and
the op's ``CompositeExplicitAutograd`` kernel (``sdpa_dense``) is the math: scores in float32, score_mod
and mask_mod vmapped over (batch, head, q, kv), ``_safe_softmax``, a matmul. The backward op
``flex_attention_backward`` has a dense kernel of the same kind (``sdpa_dense_backward``). So a neuron
tensor needs only the check: ``accept_device`` puts ``traced.flex_validate_device`` in its place (neuron
admitted, every other device asked of torch's own check), and the device then runs torch's dense kernels,
forward and backward, as its eager ops (CPU eager runs the same forward kernel). The replacement lives
in ``traced`` because Dynamo inlines it when it traces ``flex_attention`` (``torch.compile(flex_attention)``),
and this package is hidden from Dynamo (``dynamo_skips``).

Compiled. Dynamo's graph holds the op, its score_mod and mask_mod as subgraphs; Inductor lowers it to a
template kernel, torch-mlir cannot lower it at all. ``dense_flex_attention`` takes the op's place before
AOTAutograd (``pre_autograd``): the op's own dense kernel, so AOTAutograd traces plain ATen ops (the
subgraphs inlined, vmapped over the score matrix) and autograd differentiates them. A tensor that
score_mod indexes (``bias[kv_idx]``) gets its gradient through torch's ``flex_lib::zeros_and_scatter``
op, which ``library_decompositions`` turns into zeros and an accumulating ``index_put``.

What that implies (docs/flex_attention.md): the whole (batch, heads, q, kv) score matrix is computed in
float32, as on CPU eager; a BlockMask acts through its mask_mod alone (its block tables are not read, as
in torch's dense kernel); ``kernel_options`` are ignored.

``tests/test_flex_attention.py`` checks each internal named here, so a torch upgrade that changes one
fails there, by name.
"""

from __future__ import annotations

import torch

from .. import traced

CHECKED_MODULE = "torch.nn.attention.flex_attention"  # where flex_attention's device check lives


def accept_device(module=None, device: str = "neuron") -> None:
    """Let ``flex_attention`` (``module``: torch.nn.attention.flex_attention) take ``device``'s tensors:
    its ``_validate_device`` becomes ``traced.flex_validate_device`` (once)."""
    if module is None:
        import torch.nn.attention.flex_attention as module
    if module._validate_device is traced.flex_validate_device:
        return
    traced.flex_checked_device = module._validate_device
    traced.FLEX_DEVICE = device
    module._validate_device = traced.flex_validate_device


def flex_attention_op():
    """The forward higher-order op, or None where this torch has none."""
    return getattr(torch.ops.higher_order, "flex_attention", None)


def dense_kernel():
    """The forward op's dense kernel (``sdpa_dense`` in torch 2.13): what eager runs on CPU."""
    from torch._C import DispatchKey

    return flex_attention_op().py_kernels[DispatchKey.CompositeExplicitAutograd]


def dense_flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                         score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """What replaces the op in Dynamo's graph: its dense kernel, traced by AOTAutograd into ATen ops.
    Returns (out, logsumexp / ln 2, max score / ln 2), as the op does."""
    return dense_kernel()(query, key, value, score_mod, block_mask, scale, kernel_options,
                          tuple(score_mod_other_buffers), tuple(mask_mod_other_buffers))


def _zeros_and_scatter(shape, indices, vals):
    """``flex_lib::zeros_and_scatter``: a zero tensor with ``vals`` summed in at ``indices`` (torch's own
    eager implementation, as ATen ops)."""
    zeros = torch.ops.aten.zeros.default(list(shape), dtype=vals.dtype, device=vals.device)
    return torch.ops.aten.index_put.default(zeros, list(indices), vals, True)


def library_decompositions() -> list:
    """FlexAttention's custom ops in backward graphs, once torch has registered them."""
    try:
        return [(torch.ops.flex_lib.zeros_and_scatter.default, _zeros_and_scatter)]
    except (AttributeError, RuntimeError):
        return []
