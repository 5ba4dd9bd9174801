"""Adam and AdamW on the device: each step one executable.

Fused Adam and AdamW (``torch.optim.AdamW(..., fused=True)``, Trainer's default ``adamw_torch_fused``)
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


# --- the foreach step (torch's default for Adam and AdamW on a foreach device) ---------------------

def multi_tensor_adam(original, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale,
                      found_inf, *, amsgrad, has_complex, beta1, beta2, lr, weight_decay, eps, maximize, capturable,
                      differentiable, decoupled_weight_decay):
    """torch's ``_multi_tensor_adam`` (``original``) as one op on neuron tensors: its host part here (the CPU
    step counts and the per-tensor bias corrections, as torch computes them, in Python floats), its ten or
    so foreach ops one executable (``foreach_adam_``, traced as one op), where torch runs each foreach op
    as an executable of its own. The same ops in the same order on the same values: the same numbers.

    Anything else (CPU tensors, capturable steps on the device, complex parameters, tensor betas,
    ``torch.compile``) goes to ``original`` unchanged."""
    if not _one_device_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale,
                            found_inf, amsgrad, has_complex, (beta1, beta2, lr, weight_decay, eps), capturable,
                            differentiable):
        return original(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale,
                        found_inf, amsgrad=amsgrad, has_complex=has_complex, beta1=beta1, beta2=beta2, lr=lr,
                        weight_decay=weight_decay, eps=eps, maximize=maximize, capturable=capturable,
                        differentiable=differentiable, decoupled_weight_decay=decoupled_weight_decay)
    # torch's non-capturable branch, host side: steps on the CPU, bias corrections from their values
    torch._foreach_add_(state_steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
    steps = [step.item() for step in state_steps]
    if len(set(steps)) == 1:  # stepped together (the usual case): one of each number, not one per tensor
        steps = steps[:1]
    step_size = [(lr / (1 - beta1 ** step)) * -1 for step in steps]
    bias_correction2_sqrt = [(1 - beta2 ** step) ** 0.5 for step in steps]
    decay = None
    if weight_decay != 0:
        decay = 1 - lr * weight_decay if decoupled_weight_decay else weight_decay
    _foreach_adam_op()(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], step_size,
                       bias_correction2_sqrt, decay, 1 - beta1, beta2, 1 - beta2, eps, amsgrad, maximize,
                       decoupled_weight_decay)
    written = params + exp_avgs + exp_avg_sqs + (max_exp_avg_sqs if amsgrad else [])
    torch.autograd.graph.increment_version(written)  # as the in-place foreach ops would


def _one_device_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf,
                     amsgrad, has_complex, scalars, capturable, differentiable) -> bool:
    """Whether this step is one the device takes whole: every tensor on one neuron device, the step counts
    on the CPU (torch's non-capturable branch), real parameters, Python scalars (under Dynamo the router,
    ``dynamo_skips.traced_through``, calls torch's function without asking)."""
    if (not params or capturable or differentiable or has_complex or grad_scale is not None
            or found_inf is not None or not all(type(s) in (float, int) for s in scalars)):
        return False
    device = params[0].device
    if device.type != "neuron":
        return False
    for group in (params, grads, exp_avgs, exp_avg_sqs) + ((max_exp_avg_sqs,) if amsgrad else ()):
        if len(group) != len(params) or any(t.device != device for t in group):
            return False
    return len(state_steps) == len(params) and all(s.device.type == "cpu" and s.dim() == 0 for s in state_steps)


def foreach_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step_size, bias_correction2_sqrt, decay,
                  lerp_weight, beta2, square_weight, eps, amsgrad, maximize, decoupled):
    """The foreach ops of torch 2.13's ``_multi_tensor_adam`` (``torch/optim/adam.py``), non-capturable
    branch, in its order, with the Python numbers it computes on the host passed in
    (``tests/test_device_hooks.py`` checks the source this mirrors). ``step_size`` and
    ``bias_correction2_sqrt`` hold one number per tensor, or one for all where every step count is the
    same: a list of equal numbers and its one number give the same elementwise results, at two graph
    inputs instead of two per tensor."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if decay is not None:
        if decoupled:
            torch._foreach_mul_(params, decay)
        elif maximize:
            torch._foreach_add_(grads, params, alpha=decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=decay)
    torch._foreach_lerp_(exp_avgs, grads, lerp_weight)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, square_weight)
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        denom = torch._foreach_sqrt(max_exp_avg_sqs)
    else:
        denom = torch._foreach_sqrt(exp_avg_sqs)
    if len(step_size) == 1 < len(params):  # one number for every tensor: the Scalar overloads
        torch._foreach_div_(denom, bias_correction2_sqrt[0])
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_size[0])
        return
    torch._foreach_div_(denom, bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, step_size)


FOREACH_ADAM_SCHEMA = (
    "_foreach_adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
    "Tensor(d!)[] max_exp_avg_sqs, float[] step_size, float[] bias_correction2_sqrt, float? decay, "
    "float lerp_weight, float beta2, float square_weight, float eps, bool amsgrad, bool maximize, "
    "bool decoupled) -> ()")
_library = None


def _foreach_adam_op():
    """``torch.ops.neuron_compile._foreach_adam_``, defined on first use: neuron tensors reach the device's
    fallback with it (one op, one signature, one executable), which traces ``foreach_adam_`` in its place."""
    global _library
    if _library is None:
        library = torch.library.Library("neuron_compile", "FRAGMENT")
        library.define(FOREACH_ADAM_SCHEMA)
        library.impl("_foreach_adam_", lambda *args: None, "Meta")
        _library = library
        REWRITES[torch.ops.neuron_compile._foreach_adam_.default] = foreach_adam_
    return torch.ops.neuron_compile._foreach_adam_.default


# the ops the trace runs as these functions
REWRITES = {
    aten._fused_adam_.default: fused_adam_,
    aten._fused_adam_.tensor_lr: fused_adam_,
    aten._fused_adamw_.default: fused_adamw_,
    aten._fused_adamw_.tensor_lr: fused_adamw_,
}
