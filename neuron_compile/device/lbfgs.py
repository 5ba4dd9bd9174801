"""LBFGS on the device: ``torch.optim.LBFGS`` as torch runs it, its small ops gathered into a few device ops.

torch's ``LBFGS.step`` (2.13) issues some 140 small ops an iteration with a history of 10, and reads 25 values
on the host a step besides its own five an iteration (the ``alpha=`` arguments of its two-loop recursion,
0-d tensors that torch's argument parser reads). On neuron parameters, while ops are queued, three of its
pieces are one op each (``optim.define``: traced as one kernel, queued and fused like any op), built in the
background from their second call (``whole_ops.ready``) and found in the op index by a second process:

    direction         the two-loop recursion (``_optim_hooks.LBFGS_DIRECTION``, a call in torch's own step
                      compiled from its source: ``step``), without host reads
    _gather_flat_grad the gradients viewed flat and concatenated
    _add_grad         the parameters stepped along the direction (a Python step size)

The numbers are a fused run's (XLA contracts ``q + x * -a`` into an FMA where CPU rounds the product). Op by op
(fusion off, deterministic mode) and on other devices, torch's LBFGS runs unchanged.
"""

from __future__ import annotations

import torch

from . import op_queue as _op_queue
from .optim import _written, define

_STEP = None  # torch's LBFGS.step, its direction one call (_optim_hooks.lbfgs_step_with_direction)


def step(original, self, closure):
    """torch's ``LBFGS.step`` (``original``) on neuron parameters while ops are queued, with its two-loop
    recursion ``direction``: one device op where torch issues 5 a history entry each way (102 an
    iteration with a history of 10), and no host read of its ``alpha=`` arguments (0-d tensors, which torch's
    argument parser reads on the host: 20 reads an iteration, each running the queue and waiting for it). An
    iteration's ops then fuse into runs between its own reads (the loss, the curvature and descent tests).
    Op by op (fusion off, deterministic mode) and on other devices: torch's."""
    global _STEP
    params = self._params
    if not params or params[0].device.type != "neuron" or not _op_queue.active():
        return original(self, closure)
    if _STEP is None:
        from . import _optim_hooks

        _STEP = _optim_hooks.lbfgs_step_with_direction(original, direction)
    return _STEP(self, closure)


def direction(flat_grad, old_dirs, old_stps, ro, H_diag, al):
    """LBFGS's search direction from the gradient and the history (torch 2.13's two-loop recursion,
    ``_optim_hooks.LBFGS_DIRECTION``), writing ``al[:len(old_dirs)]`` as torch does. Once a history length has
    been sighted twice (``op_queue.REPEATS``), it is one op (``_lbfgs_direction``), built in the background
    (``whole_ops.ready``) and found in the op index by a second process; until then, and for a history of
    Python numbers (``H_diag`` before the first update), ``_two_loop``: torch's ops, a fused run's numbers."""
    from . import whole_ops

    if old_dirs and H_diag.__class__ is torch.Tensor and all(r.__class__ is torch.Tensor for r in ro):
        args = (flat_grad, list(old_dirs), list(old_stps), list(ro), H_diag)
        # a history length whose op was built once is not looked up again (its 32 tensors walked twice a call,
        # here and in the op's dispatch: a third of the call); an op no longer held is built again there
        sighted = (len(old_dirs), flat_grad.shape, flat_grad.dtype, flat_grad.get_device(), H_diag.dtype)
        if sighted in _DIRECTIONS or whole_ops.ready(_direction_op(), args, {}):
            _DIRECTIONS.add(sighted)
            d, *alphas = _direction_op()(*args)
            al[:len(alphas)] = alphas
            return d
    return _two_loop(flat_grad, old_dirs, old_stps, ro, H_diag, al)


_DIRECTIONS: set = set()  # (history length, gradient's shape, dtype, device index, H_diag's dtype): op built


def gather_flat_grad(original, self):
    """torch's ``LBFGS._gather_flat_grad`` (``original``: a view of each gradient, then a cat) as one op on
    neuron parameters while ops are queued (``_lbfgs_flat``, from the second call on: ``whole_ops.ready``).
    A missing, sparse or complex gradient, and other devices: torch's."""
    params = self._params
    if _queued(params):
        grads = [p.grad for p in params]
        if all(g is not None and g.layout is torch.strided for g in grads):
            from . import whole_ops

            op = _flat_op()
            if whole_ops.ready(op, (grads,), {}):
                return op(grads)
    return original(self)


def add_grad(original, self, step_size, update):
    """torch's ``LBFGS._add_grad`` (``original``: per parameter a slice of ``update``, its view, an ``add_``)
    as one op on neuron parameters while ops are queued (``_lbfgs_add_``), for a Python step size (a 0-d
    tensor one, the first iteration's, is torch's, which reads it on the host). Other devices: torch's."""
    params = self._params
    if step_size.__class__ in (float, int) and _queued(params):
        from . import whole_ops

        op = _add_op()
        args = (params, update, float(step_size))
        if whole_ops.ready(op, args, {}):
            op(*args)
            _written(params, local=[])
            return None
    return original(self, step_size, update)


def _queued(params) -> bool:
    """LBFGS's parameters are plain real tensors on the device, and its ops are queued."""
    first = params[0] if params else None
    return (first is not None and first.__class__ in (torch.Tensor, torch.nn.Parameter)
            and first.device.type == "neuron" and _op_queue.active()
            and not any(p.is_complex() for p in params))


def _flat(grads):
    """``_gather_flat_grad``'s ops (torch 2.13), every gradient present and dense."""
    return torch.cat([g.view(-1) for g in grads], 0)


def _add_(params, update, step_size):
    """``_add_grad``'s ops (torch 2.13) on real parameters."""
    offset = 0
    for p in params:
        numel = p.numel()
        p.add_(update[offset:offset + numel].view_as(p), alpha=step_size)
        offset += numel


def _flat_op():
    return define("_lbfgs_flat", "_lbfgs_flat(Tensor[] grads) -> Tensor", _flat, _flat)


def _add_op():
    return define("_lbfgs_add_", "_lbfgs_add_(Tensor(a!)[] params, Tensor update, float step_size) -> ()",
                  _add_)


def _two_loop(flat_grad, old_dirs, old_stps, ro, H_diag, al):
    """``LBFGS_DIRECTION``'s ops in its order, each ``alpha=`` product issued as a tensor op (``q + x * -a``
    where CPU's kernel computes ``fma(x, -a, q)``)."""
    num_old = len(old_dirs)
    q = flat_grad.neg()
    for i in range(num_old - 1, -1, -1):
        al[i] = old_stps[i].dot(q) * ro[i]
        q.add_(old_dirs[i] * -al[i])
    d = r = torch.mul(q, H_diag)
    for i in range(num_old):
        be_i = old_dirs[i].dot(r) * ro[i]
        r.add_(old_stps[i] * (al[i] - be_i))
    return d


def _direction(flat_grad, old_dirs, old_stps, ro, H_diag):
    """The op's body (traced) and its Meta kernel: the direction, then the history's alphas."""
    al = [None] * len(old_dirs)
    return [_two_loop(flat_grad, old_dirs, old_stps, ro, H_diag, al), *al]


def _direction_op():
    return define("_lbfgs_direction", "_lbfgs_direction(Tensor flat_grad, Tensor[] old_dirs, Tensor[] old_stps, "
                  "Tensor[] ro, Tensor H_diag) -> Tensor[]", _direction, _direction)
