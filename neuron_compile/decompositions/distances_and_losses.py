"""torch.nn's distances, losses and norms torch-mlir leaves: ``pdist``, the multilabel margin loss,
the chunked linear cross-entropy custom ops, and batch norm's eval-mode overloads.

Pairs of rows are taken by static slices; PyTorch's own decompositions are used where torch-mlir's
list leaves them out.
"""

from __future__ import annotations

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

DISTANCES_AND_LOSSES: dict = {}


def _register(op):
    return register_decomposition(op, registry=DISTANCES_AND_LOSSES)


# --------------------------------------------------------------------------- pdist

PDIST_MAX_ROWS = 512


@_register(aten._pdist_forward)
def _pdist_forward(x, p: float = 2.0):
    # Rows i < j in ATen's order (i major): one static slice per i, then the p-norm of the
    # differences (linalg_vector_norm handles p = 0 and inf). Unrolled over rows: above
    # PDIST_MAX_ROWS it is left to fail lowering rather than emit a huge graph.
    n = x.shape[0]
    if n > PDIST_MAX_ROWS:
        return NotImplemented
    if n < 2 or x.shape[1] == 0:
        return torch.zeros([n * (n - 1) // 2], dtype=x.dtype, device=x.device)
    diffs = torch.cat([x[i + 1:] - x[i:i + 1] for i in range(n - 1)], 0)
    return torch.linalg.vector_norm(diffs, p, [-1])


# --------------------------------------------------------------------------- linear_cross_entropy


def _lce_chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                 batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_input_grad,
                 compute_linear_weight_grad, compute_linear_bias_grad):
    # F.linear_cross_entropy with options calls torch.nn's custom op, which computes the loss
    # in batch chunks and, when asked, the gradients too (in the forward). Without gradients
    # it is the linear then cross_entropy, with the op's empty gradient placeholders; with
    # them it is left to fail lowering.
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        return NotImplemented
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    loss = torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    empty = torch.zeros([0], dtype=input.dtype, device=input.device)
    return loss, empty.reshape(0, 0), empty.reshape(0, 0), empty


def _lce_chunked_no_reduction(input, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size,
                              acc_policy, acc_dtype):
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    return torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction="none")


def library_decompositions() -> dict:
    """Decompositions of torch.nn's custom ops (registered when their module is imported)."""
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401  (registers torch_nn::*)
        ops = torch.ops.torch_nn
        return {ops._linear_cross_entropy_batch_chunked.default: _lce_chunked,
                ops._linear_cross_entropy_batch_chunked_no_reduction.default: _lce_chunked_no_reduction}
    except (ImportError, AttributeError, RuntimeError):
        return {}


def _multilabel_slots(input, target):
    """(input and target as [N, C], which target slots count (those before a row's first -1), the input at
    each slot's target, which classes are targets)."""
    x, t = torch.atleast_2d(input), torch.atleast_2d(target)
    classes = x.shape[1]
    idx = torch.arange(classes, device=t.device)
    valid = idx < torch.amin(torch.where(t == -1, idx, classes), dim=-1, keepdim=True)  # [N, slot]
    at_target = torch.gather(x, -1, torch.where(valid, t, 0))  # [N, slot]
    is_target = torch.any(idx == torch.where(valid, t, -1).unsqueeze(-1), dim=1)  # [N, class]
    return x, t, valid, at_target, is_target


def _multilabel_hinge(x, valid, at_target, is_target):
    """[N, slot, class]: 1 - x[target] + x[class] for counted slots and non-target classes, else 0."""
    z = 1.0 - at_target.unsqueeze(-1) + x.unsqueeze(1)
    return torch.where(valid.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0)


@_register(aten.multilabel_margin_loss_forward)
def _multilabel_margin_loss_forward(input, target, reduction: int):
    """CPU's loss: torch's decomposition (2.13) counts the slots after a row's first -1 as targets (the
    input at class 0), so a row with a -1 got a larger loss."""
    x, _, valid, at_target, is_target = _multilabel_slots(input, target)
    per_row = _multilabel_hinge(x, valid, at_target, is_target).clamp_min(0).sum(dim=(1, 2)) / x.shape[1]
    if reduction == 1:  # mean
        loss = per_row.mean()
    elif reduction == 2:  # sum
        loss = per_row.sum()
    else:
        loss = per_row if input.dim() > 1 else per_row.reshape(())
    return loss, is_target.to(input.dtype).reshape(target.shape)


@_register(aten.multilabel_margin_loss_backward)
def _multilabel_margin_loss_backward(grad_output, input, target, reduction: int, is_target):
    """CPU's gradient: each positive hinge (slot k, class j) adds 1/C to class j and takes it from the slot's
    target class."""
    x, t, valid, at_target, _ = _multilabel_slots(input, target)
    targets = is_target.reshape(x.shape) != 0
    active = (_multilabel_hinge(x, valid, at_target, targets) > 0).to(x.dtype) / x.shape[1]  # [N, slot, class]
    grad = active.sum(1) - torch.zeros_like(x).scatter_add(1, torch.where(valid, t, 0), active.sum(2))
    if reduction == 1:
        grad = grad * (grad_output / x.shape[0])
    elif reduction == 2 or input.dim() <= 1:
        grad = grad * grad_output
    else:
        grad = grad * grad_output.reshape(-1, 1)
    return grad.reshape(input.shape)


@_register(aten.native_batch_norm)
def _native_batch_norm_eval(input, weight, bias, running_mean, running_var, training: bool, momentum: float,
                            eps: float):
    """Eval mode, as an eager op on the device: torch-mlir's lowering returns the running statistics as
    ``save_mean``/``save_invstd`` (CUDA's shapes), where CPU's kernel and its Meta kernel return empty
    tensors, so the graph's types disagreed. The output is ``_native_batch_norm_legit_no_training``'s
    (what compiled graphs hold); the saved statistics are CPU's empty ones."""
    if training:
        return NotImplemented
    out = aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var,
                                                              momentum, eps)[0]
    return out, input.new_zeros((0,)), input.new_zeros((0,))


def _torch_decompositions():
    # PyTorch's own decompositions that torch-mlir's list leaves out
    from torch._decomp import decomposition_table

    for op in (aten._batch_norm_with_update_functional.default, aten._batch_norm_with_update.default,
               aten._batch_norm_no_update.default):
        if op in decomposition_table:
            DISTANCES_AND_LOSSES.setdefault(op, decomposition_table[op])


_torch_decompositions()
