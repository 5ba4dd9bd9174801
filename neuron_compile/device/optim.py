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

    DTensor parameters (tensor parallel, FSDP2) take the step on their local tensors (``local_groups``):
    torch's own foreach step refuses a mix of DTensor and plain parameters. Anything else (CPU tensors,
    capturable steps on the device, complex parameters, tensor betas, ``torch.compile``) goes to
    ``original`` unchanged."""
    local = _one_device_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale,
                             found_inf, amsgrad, has_complex, (beta1, beta2, lr, weight_decay, eps), capturable,
                             differentiable)
    if local is None:
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
    _foreach_adam_op()(*local[:4], local[4] if amsgrad else [], step_size, bias_correction2_sqrt, decay,
                       1 - beta1, beta2, 1 - beta2, eps, amsgrad, maximize, decoupled_weight_decay)
    _written(params, exp_avgs, exp_avg_sqs, *([max_exp_avg_sqs] if amsgrad else []), local=[local[0]] + local[2:])


def _one_device_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf,
                     amsgrad, has_complex, scalars, capturable, differentiable):
    """The step's tensors as local neuron tensors (``local_groups``) where the device takes this step whole:
    the step counts on the CPU (torch's non-capturable branch), real parameters, Python scalars (under
    Dynamo the router, ``dynamo_skips.traced_through``, calls torch's function without asking); else None."""
    if (not params or capturable or differentiable or has_complex or grad_scale is not None
            or found_inf is not None or not all(type(s) in (float, int) for s in scalars)):
        return None
    if len(state_steps) != len(params) or not all(s.device.type == "cpu" and s.dim() == 0 for s in state_steps):
        return None
    return local_groups([params, grads, exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad else []))


def local_groups(groups: list[list]) -> list[list] | None:
    """``groups`` (parallel lists: parameters, gradients, states) as plain tensors of one neuron device, or
    None. A DTensor (tensor or FSDP2 parallel) counts as its local tensor where every tensor at its index is a
    DTensor of the same mesh and the same Shard/Replicate placements: an elementwise step of such tensors
    is the same step of their local tensors (DTensor would run it so, op by op). Anything else (a Partial
    placement, mixed layouts at one index) is None: torch's own path, which redistributes."""
    import sys

    first = groups[0]
    if not first or any(len(group) != len(first) for group in groups):
        return None
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # none made: not imported
    if dtensor is not None and any(isinstance(t, dtensor) for group in groups for t in group):
        columns = []
        for column in zip(*groups):
            if isinstance(column[0], dtensor):
                spec = (column[0].device_mesh, tuple(column[0].placements))
                if any(p.is_partial() for p in spec[1]) or not all(
                        isinstance(t, dtensor) and (t.device_mesh, tuple(t.placements)) == spec for t in column):
                    return None
                with torch.no_grad():  # the local tensor itself, no autograd view
                    column = [t.to_local() for t in column]
            elif any(isinstance(t, dtensor) for t in column):
                return None
            columns.append(column)
        groups = [list(group) for group in zip(*columns)]
    device = groups[0][0].device
    if device.type != "neuron" or any(t.device != device or t.layout != torch.strided
                                      for group in groups for t in group):
        return None
    return groups


def _written(*groups, local) -> None:
    """Bump the version of each tensor a routed step wrote (``groups``) and of its local tensor (``local``
    holds them where a DTensor was unwrapped), as the in-place ops it replaces would."""
    written = [t for group in groups for t in group]
    seen = set(map(id, written))
    written += [t for group in local for t in group if id(t) not in seen]
    torch.autograd.graph.increment_version(written)


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

# --- SGD's step (torch's for-loop and foreach functions) -----------------------------------------------

def sgd_step(original, params, grads, momentum_buffer_list, grad_scale, found_inf, *, weight_decay, momentum, lr,
             dampening, nesterov, maximize, has_sparse_grad):
    """torch's ``_single_tensor_sgd`` or ``_multi_tensor_sgd`` (``original``) as one op on neuron tensors
    (``foreach_sgd_``), where torch runs one to four ops per parameter (the for-loop, ``foreach=False``, what
    a mix of DTensor and plain parameters needs) or per foreach op, each an executable of its own. DTensor
    parameters take the step on their local tensors (``local_groups``).

    Anything else goes to ``original``: CPU tensors, tensor hyperparameters, a first momentum step (torch
    clones the gradients into new buffers), foreach Nesterov on the gradients themselves (torch's foreach
    path writes the sum into ``.grad``)."""
    def torchs():
        return original(params, grads, momentum_buffer_list, grad_scale, found_inf, weight_decay=weight_decay,
                        momentum=momentum, lr=lr, dampening=dampening, nesterov=nesterov, maximize=maximize,
                        has_sparse_grad=has_sparse_grad)

    if (not params or grad_scale is not None or found_inf is not None or has_sparse_grad
            or not all(type(s) in (float, int) for s in (weight_decay, momentum, lr, dampening))):
        return torchs()
    buffers = momentum_buffer_list if momentum != 0 else []
    if any(b is None for b in buffers) or (nesterov and momentum != 0 and weight_decay == 0 and not maximize
                                           and original.__name__ == "_multi_tensor_sgd"):
        return torchs()
    local = local_groups([params, grads] + ([buffers] if buffers else []))
    if local is None:
        return torchs()
    # the numbers torch computes on the host (-lr, 1 - dampening), computed here: a float the graph holds as
    # it came is a runtime input (``trace._float_sites``), so a new learning rate compiles nothing
    _foreach_sgd_op()(local[0], local[1], local[2] if buffers else [], -lr, weight_decay, momentum, 1 - dampening,
                      nesterov, maximize)
    _written(params, buffers, local=[local[0]] + local[2:])


def foreach_sgd_(params, grads, momentum_buffers, neg_lr, weight_decay, momentum, grad_weight, nesterov, maximize):
    """The foreach ops of torch 2.13's ``_multi_tensor_sgd`` (``torch/optim/sgd.py``) in its order, every
    momentum buffer present (``neg_lr`` is its ``-lr``, ``grad_weight`` its ``1 - dampening``);
    ``_single_tensor_sgd`` runs the same ops one tensor at a time."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum != 0:
        torch._foreach_mul_(momentum_buffers, momentum)
        torch._foreach_add_(momentum_buffers, grads, alpha=grad_weight)
        grads = torch._foreach_add(grads, momentum_buffers, alpha=momentum) if nesterov else momentum_buffers
    torch._foreach_add_(params, grads, alpha=neg_lr)


FOREACH_SGD_SCHEMA = (
    "_foreach_sgd_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float neg_lr, "
    "float weight_decay, float momentum, float grad_weight, bool nesterov, bool maximize) -> ()")
_library = None
_OPS: dict = {}


def define(name: str, schema: str, body, meta=None):
    """``torch.ops.neuron_compile.<name>``, defined on first use: neuron tensors reach the device's fallback
    with it (one op, one signature, one executable), which traces ``body`` in its place. ``meta``: its Meta
    kernel (by default one that returns nothing: an in-place op's)."""
    global _library
    if name not in _OPS:
        if _library is None:
            _library = torch.library.Library("neuron_compile", "FRAGMENT")
        _library.define(schema)
        _library.impl(name, meta or (lambda *args: None), "Meta")
        _OPS[name] = getattr(torch.ops.neuron_compile, name).default
        REWRITES[_OPS[name]] = body
    return _OPS[name]


def _foreach_adam_op():
    return define("_foreach_adam_", FOREACH_ADAM_SCHEMA, foreach_adam_)


def _foreach_sgd_op():
    return define("_foreach_sgd_", FOREACH_SGD_SCHEMA, foreach_sgd_)


# the ops the trace runs as these functions
REWRITES = {
    aten._fused_adam_.default: fused_adam_,
    aten._fused_adam_.tensor_lr: fused_adam_,
    aten._fused_adamw_.default: fused_adamw_,
    aten._fused_adamw_.tensor_lr: fused_adamw_,
}
