"""torch.distributed's reduce ops on the device's collectives: which dtypes each allows, PREMUL_SUM as a SUM.

The ``neuron`` process group (``process_group.py``) checks every reduction here before anything runs, on
neuron and CPU tensors alike, so a refused pairing raises on every rank at once, naming the op and the
dtype, instead of failing inside gloo or XLA:

    ==================================  ==============================================================
    SUM, PRODUCT, MIN, MAX              every dtype (XLA's reductions for floats, int32 and int64;
                                        gloo's for the rest)
    AVG                                 every dtype: a SUM divided by the group's size (integers:
                                        truncated, where gloo runs it)
    BAND, BOR, BXOR                     integer and bool tensors (gloo's, staged: XLA CPU's gloo
                                        collectives refuse bitwise reductions)
    PREMUL_SUM(factor)                  float16, bfloat16, float32, float64 (NCCL's rule): each rank's
                                        input multiplied by ``factor`` (a Python number or a 0-d
                                        tensor, on any device), then a SUM
    ==================================  ==============================================================

PREMUL_SUM is what FSDP2 reduce-scatters gradients with when a gradient divide factor is set
(``set_gradient_divide_factor``; TorchTitan does): ``ReduceOp.PREMUL_SUM(1 / factor)``, made by
``torch.distributed._make_nccl_premul_sum``. Neither gloo nor a StableHLO reduction has it; the
multiply is one device op on the input (in place where the collective writes its input, on a copy
where it only reads it), and the SUM runs where it would have (XLA on the buffers, or gloo staged).
"""

from __future__ import annotations

import torch

PREMUL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NAMES = {}  # RedOpType -> "SUM"..., filled on first use


def name(red_op) -> str:
    """``"PREMUL_SUM"`` for ``ReduceOp.PREMUL_SUM`` (a ``RedOpType``)."""
    if not _NAMES:
        _NAMES.update({value: key for key, value in torch.distributed.ReduceOp.RedOpType.__members__.items()})
    return _NAMES.get(red_op, str(red_op))


def _integral(dtype: torch.dtype) -> bool:
    return dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)


def check(red_op, tensors) -> None:
    """Raise ``TypeError`` naming the op and the dtype where ``red_op`` (a ``RedOpType``) is not defined on one
    of ``tensors``' dtypes (see the table above)."""
    ops = torch.distributed.ReduceOp
    bitwise = red_op in (ops.BAND, ops.BOR, ops.BXOR)
    if not bitwise and red_op != ops.PREMUL_SUM:
        return
    for tensor in tensors:
        if bitwise and not _integral(tensor.dtype):
            raise TypeError(f"ReduceOp.{name(red_op)} is defined for integer and bool tensors, not {tensor.dtype}")
        if red_op == ops.PREMUL_SUM and tensor.dtype not in PREMUL_FLOATS:
            raise TypeError(f"ReduceOp.PREMUL_SUM is defined for float16, bfloat16, float32 and float64 tensors, "
                            f"not {tensor.dtype}")


def premultiply(tensor: torch.Tensor, factor, in_place: bool) -> torch.Tensor:
    """``tensor`` multiplied by a PREMUL_SUM's ``factor`` (a Python number or a 0-d tensor, moved to
    ``tensor``'s device): ``tensor`` itself, scaled, when ``in_place``, else a new tensor."""
    if isinstance(factor, torch.Tensor):
        factor = factor.detach().to(tensor.device)
    with torch.no_grad():
        return tensor.mul_(factor) if in_place else tensor.detach() * factor
