"""Fused Adam and AdamW (``torch.optim.AdamW(..., fused=True)``, Trainer's default ``adamw_torch_fused``)
written out in ATen ops, which the op's trace runs in place of ``_fused_adam_`` / ``_fused_adamw_``.

torch has no decomposition of these ops, and its functionalization kernel refuses them when
``max_exp_avg_sqs`` is empty (no amsgrad: "mutating a non-functional tensor with a functional
tensor"), so the trace cannot take them as they are. ``fused_adam_`` computes what CPU's kernel
(``aten/src/ATen/native/cpu/FusedAdamKernel.cpp``) computes, in its order: the per-tensor scalars
(bias corrections, step size) in float64 from the step tensor, each cast to the math dtype (the
parameter's, float32 for half types), then the elementwise update, written back with ``copy_``.

Every float argument enters the graph once, as ``1 * value`` in float64: there the trace can take
it as a runtime input (``trace._float_sites``), so a learning rate that changes every step (a
scheduler) compiles nothing new. A branch CPU takes on a value (``exp_avg.lerp_``'s two formulas)
is a ``where`` in the graph, right for whatever value a later call brings.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_F64 = torch.float64


def _scalar(value) -> torch.Tensor:
    """A float argument as a 0-d float64 tensor (a 0-d tensor argument: converted)."""
    if isinstance(value, torch.Tensor):
        return value.to(_F64)
    return aten.mul.Tensor(aten.ones.default((), dtype=_F64), value)


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None, decoupled=False):
    lr, beta1, beta2, eps = _scalar(lr), _scalar(beta1), _scalar(beta2), _scalar(eps)
    decay = _scalar(weight_decay) if weight_decay != 0 else None
    skip = found_inf == 1 if found_inf is not None else None  # CPU's kernel then changes nothing
    for i, (param, grad, exp_avg, exp_avg_sq, step) in enumerate(
            zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        math = _math_dtype(param.dtype)
        step = step.to(_F64)
        bias_correction1 = 1 - torch.pow(beta1, step)
        bias_correction2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
        step_size = lr / bias_correction1
        weight = (1 - beta1).to(math)  # exp_avg.lerp_(grad, 1 - beta1), as CPU's kernel does it
        small = torch.abs(weight) < 0.5
        coefficient = torch.where(small, weight, weight - 1)

        p, g = param.to(math), grad.to(math)
        new_grad = None
        if grad_scale is not None:
            g = g / grad_scale.to(math)
            new_grad = g.to(grad.dtype)
        if maximize:
            g = g * -1.0
        if decay is not None:
            if decoupled:
                p = p * (1 - lr * decay).to(math)
            else:
                g = g + p * decay.to(math)
        m = exp_avg.to(math)
        m = torch.where(small, m, g) + coefficient * (g - m)
        v = exp_avg_sq.to(math) * beta2.to(math) + (1 - beta2).to(math) * g * g
        if amsgrad:
            v_max = torch.maximum(max_exp_avg_sqs[i].to(math), v)
            denom = torch.sqrt(v_max) / bias_correction2_sqrt.to(math) + eps.to(math)
        else:
            denom = torch.sqrt(v) / bias_correction2_sqrt.to(math) + eps.to(math)
        p = p + (-step_size).to(math) * m / denom

        updates = [(param, p), (exp_avg, m), (exp_avg_sq, v)]
        if amsgrad:
            updates.append((max_exp_avg_sqs[i], v_max))
        if new_grad is not None:
            updates.append((grad, new_grad))
        for target, value in updates:
            value = value.to(target.dtype)
            target.copy_(value if skip is None else torch.where(skip, target, value))


def fused_adamw_(*args, **kwargs):
    fused_adam_(*args, **kwargs, decoupled=True)


# the ops the trace runs as these functions
REWRITES = {
    aten._fused_adam_.default: fused_adam_,
    aten._fused_adam_.tensor_lr: fused_adam_,
    aten._fused_adamw_.default: fused_adamw_,
    aten._fused_adamw_.tensor_lr: fused_adamw_,
}
