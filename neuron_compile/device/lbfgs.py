"""LBFGS on the device: ``torch.optim.LBFGS`` as torch runs it, its small ops gathered into a few device ops
and its host reads into one an iteration.

torch's ``LBFGS.step`` (2.13) issues some 140 small ops an iteration with a history of 10, and reads 20 values
on the host an iteration besides its own five (the ``alpha=`` arguments of its two-loop recursion, 0-d tensors
that torch's argument parser reads). Each read runs the device's queue and waits for it. On neuron parameters,
while ops are queued, its pieces are one op each (``optim.define``: traced as one kernel, queued and fused
like any op), built in the background from their second turn (``whole_ops.ready``) and found in the op index
by a second process:

    direction         the two-loop recursion, without host reads
    _gather_flat_grad the gradients viewed flat and concatenated
    _add_grad         the parameters stepped along the direction (a Python step size)
    evaluate          after a closure, the flat gradient and the five tests torch reads one by one (the loss,
                      optimality, progress, the next iteration's curvature and, with that iteration's
                      direction computed ahead, its descent test), read together

Without a line search the step is ``fixed_step``, torch's mirrored (``tests/test_device_hooks.py`` checks the
source) with ``evaluate`` where torch reads: one read an iteration instead of five. With one
(``strong_wolfe``), it is torch's own step compiled from its source with its recursion's block
(``_optim_hooks.LBFGS_DIRECTION``) a call to ``direction`` (``step``).

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
    if self.param_groups[0]["line_search_fn"] is None and len(self.param_groups) == 1 and _queued(params):
        with torch.no_grad():
            return fixed_step(self, closure)
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


# --- the fixed-step iteration, its reads gathered ------------------------------------------------------------

def fixed_step(self, closure):
    """torch 2.13's ``LBFGS.step`` without a line search (``tests/test_device_hooks.py`` checks the source this
    mirrors), reading values on the host once an iteration instead of five times.

    torch reads, an iteration: the loss after the closure, the optimality test (``opt_cond``), the progress
    test (``d.mul(t).abs().max() <= tolerance_change``), then at the next iteration's start the curvature test
    (``ys > 1e-10``), and the descent test (``gtd > -tolerance_change``). All five are known together once
    the closure's gradients are: ``evaluate`` computes them as one device op (with the curvature pair ``y``,
    ``s``, what an accepted pair adds to the history: ``1 / ys`` and the new ``H_diag``, and the next
    direction from that history) and reads them as one transfer. What it computes ahead is what torch would
    compute next, from the same tensors; where torch's loop stops first, or refuses the pair (the direction
    assumed it accepted), it is not used. Every op, test and state entry is torch's, in its order."""
    from torch.optim.lbfgs import _to_scalar

    group = self.param_groups[0]
    lr = _to_scalar(group["lr"])
    max_iter = group["max_iter"]
    max_eval = group["max_eval"]
    tolerance_grad = group["tolerance_grad"]
    tolerance_change = group["tolerance_change"]
    history_size = group["history_size"]

    state = self.state[self._params[0]]
    state.setdefault("func_evals", 0)
    state.setdefault("n_iter", 0)
    closure = torch.enable_grad()(closure)

    orig_loss = closure()
    current_evals = 1
    state["func_evals"] += 1

    d = state.get("d")
    t = state.get("t")
    old_dirs = state.get("old_dirs")
    old_stps = state.get("old_stps")
    ro = state.get("ro")
    H_diag = state.get("H_diag")
    prev_flat_grad = state.get("prev_flat_grad")
    prev_loss = state.get("prev_loss")

    # the first iteration's curvature pair, from the last step's direction (torch's first iteration of a
    # step past the first computes it from the same state)
    ahead = state["n_iter"] > 0 and d is not None and prev_flat_grad is not None
    flat_grad, loss, opt_cond, _, curvature = evaluate(self, orig_loss, prev_flat_grad if ahead else None, d, t,
                                                       tolerance_grad, tolerance_change,
                                                       (old_dirs, old_stps, ro, history_size) if ahead else None)
    if opt_cond:
        return orig_loss

    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        state["n_iter"] += 1

        stop = None  # torch's descent test, where evaluate computed it ahead
        if state["n_iter"] == 1:
            d = flat_grad.neg()
            old_dirs = []
            old_stps = []
            ro = []
            H_diag = 1
        else:
            y, s, accepted, ro_new, H_new, following = curvature
            if accepted:  # torch's ys > 1e-10
                if len(old_dirs) == history_size:
                    old_dirs.pop(0)
                    old_stps.pop(0)
                    ro.pop(0)
                old_dirs.append(y)
                old_stps.append(s)
                ro.append(ro_new)
                H_diag = H_new
            if "al" not in state:
                state["al"] = [None] * history_size
            if accepted and following is not None:  # computed by evaluate, from this history
                d, alphas, stop = following
                state["al"][:len(alphas)] = alphas
            else:
                d = direction(flat_grad, old_dirs, old_stps, ro, H_diag, state["al"])

        if prev_flat_grad is None:
            prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
        else:
            prev_flat_grad.copy_(flat_grad)
        prev_loss = loss

        if state["n_iter"] == 1:
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr
        else:
            t = lr

        if stop is None:
            gtd = flat_grad.dot(d)
            stop = gtd > -tolerance_change
        if stop:
            break

        ls_func_evals = 0
        self._add_grad(t, d)
        if n_iter != max_iter:
            loss = closure()
            flat_grad, loss, opt_cond, small, curvature = evaluate(self, loss, prev_flat_grad, d, t,
                                                                   tolerance_grad, tolerance_change,
                                                                   (old_dirs, old_stps, ro, history_size))
            ls_func_evals = 1

        current_evals += ls_func_evals
        state["func_evals"] += ls_func_evals

        if n_iter == max_iter:
            break
        if current_evals >= max_eval:
            break
        if opt_cond:
            break
        if small:  # torch's d.mul(t).abs().max() <= tolerance_change
            break
        if abs(loss - prev_loss) < tolerance_change:
            break

    state["d"] = d
    state["t"] = t
    state["old_dirs"] = old_dirs
    state["old_stps"] = old_stps
    state["ro"] = ro
    state["H_diag"] = H_diag
    state["prev_flat_grad"] = prev_flat_grad
    state["prev_loss"] = prev_loss
    return orig_loss


def evaluate(self, loss, prev_flat_grad, d, t, tolerance_grad, tolerance_change, history=None):
    """After a closure: the flat gradient, and as Python values the loss (``float(loss)``), the optimality
    test and, where ``prev_flat_grad`` is given, the progress test of the direction ``d`` and step ``t`` just
    taken, with the curvature pair the next iteration starts from: ``(y, s, ys > 1e-10, 1 / ys, ys / y.dot(y),
    following)`` (else None). One device op where every gradient is present and dense (``_lbfgs_after``, built
    from its second turn like any whole op), and one host read; until it is built, torch's own ops and reads
    (``_torchs_reads``).

    ``history`` (``old_dirs``, ``old_stps``, ``ro``, ``history_size``): the next iteration's direction is computed
    in the same op, as if the pair were accepted (``_lbfgs_after_direction``, once built for this history's
    length), and ``following`` is ``(d, alphas, stop)``, ``stop`` torch's descent test ``gtd >
    -tolerance_change`` read with the rest: an iteration reads once. Where the pair is refused the next
    iteration computes its direction itself; ``following`` is None where nothing was computed ahead."""
    from . import whole_ops

    grads = [p.grad for p in self._params]
    if any(g is None or g.layout is not torch.strided for g in grads):
        grads = [self._gather_flat_grad()]  # torch's zeros for a missing gradient (one tensor: its own view)
    on_device = isinstance(loss, torch.Tensor) and loss.device.type == "neuron" and loss.numel() == 1
    value = None if on_device else float(loss)
    ahead = prev_flat_grad is not None
    # (float(t): a 0-d step, a first iteration's, is read here, as torch's own _add_grad reads it)
    args = (grads, loss if on_device else None, prev_flat_grad, d if ahead else None, float(t) if ahead else 0.0,
            float(tolerance_grad), float(tolerance_change))
    following = None
    if ahead and history is not None:
        old_dirs, old_stps, ro, size = history
        drop = 1 if len(old_dirs) == size else 0  # the entry a full history drops for the pair
        more = (old_dirs[drop:], old_stps[drop:], ro[drop:])
        op = _after_direction_op()
        if all(r.__class__ is torch.Tensor for r in ro) and whole_ops.ready(op, args + more, {}):
            results = op(*args, *more)
            following = (results[7], results[8:])
    if following is None:
        op = _after_op()
        if not whole_ops.ready(op, args, {}):
            return _torchs_reads(value, *args)
        results = op(*args)
    flat_grad, packed = results[0], results[1].tolist()  # the one read
    if on_device:
        value, packed = packed[0], packed[1:]
    if not ahead:
        return flat_grad, value, bool(packed[0]), False, None
    if following is not None:
        following += (bool(packed[3]),)
    y, s, ys, ro_new, H_new = results[2:7]
    return flat_grad, value, bool(packed[0]), bool(packed[1]), (y, s, bool(packed[2]), ro_new, H_new, following)


def _torchs_reads(value, grads, loss, prev_flat_grad, d, t, tolerance_grad, tolerance_change):
    """What ``evaluate`` returns before ``_lbfgs_after`` is built (a fit's first iterations): torch's own ops and
    reads, one by one. A cold first step then compiles the kernels torch's step does and no others (the packed
    read's stack, its casts and its tolerance subtractions were 4 more compiles in a fit's first step)."""
    flat_grad = torch.cat([g.view(-1) for g in grads], 0)
    if value is None:
        value = float(loss)
    opt_cond = bool(flat_grad.abs().max() <= tolerance_grad)
    if prev_flat_grad is None:
        return flat_grad, value, opt_cond, False, None
    y = flat_grad.sub(prev_flat_grad)
    s = d.mul(t)
    ys = y.dot(s)
    small = bool(s.abs().max() <= tolerance_change)
    accepted = bool(ys > 1e-10)
    return flat_grad, value, opt_cond, small, (y, s, accepted, 1.0 / ys if accepted else None,
                                               ys / y.dot(y) if accepted else None, None)


def _after(grads, loss, prev_flat_grad, d, t, tolerance_grad, tolerance_change):
    """``_lbfgs_after``'s body (traced) and its Meta kernel: torch's ops for what ``evaluate`` returns, then
    the values it reads packed in one tensor (in the loss's dtype, which holds it exactly, the tests as 0 or 1)."""
    flat_grad = torch.cat([g.view(-1) for g in grads], 0)
    # ``a <= tolerance`` as ``a - tolerance <= 0`` (the same test: a difference of floats is 0 only where they
    # are equal): a subtraction takes a run-time float, so one kernel serves every tolerance (a comparison with
    # it would bake the value in)
    tests = [flat_grad.abs().max().sub(tolerance_grad) <= 0]
    results = [flat_grad]
    if prev_flat_grad is not None:
        y = flat_grad.sub(prev_flat_grad)
        s = d.mul(t)
        ys = y.dot(s)
        tests += [s.abs().max().sub(tolerance_change) <= 0, ys > 1e-10]
        results += [y, s, ys, 1.0 / ys, ys / y.dot(y)]
    dtype = loss.dtype if loss is not None else flat_grad.dtype
    packed = torch.stack(([loss.reshape(())] if loss is not None else []) + [test.to(dtype) for test in tests])
    return [flat_grad, packed, *results[1:]]


def _after_op():
    return define("_lbfgs_after", "_lbfgs_after(Tensor[] grads, Tensor? loss, Tensor? prev_flat_grad, Tensor? d, "
                  "float t, float tolerance_grad, float tolerance_change) -> Tensor[]", _after, _after)


def _after_direction(grads, loss, prev_flat_grad, d, t, tolerance_grad, tolerance_change, old_dirs, old_stps, ro):
    """``_lbfgs_after_direction``'s body (traced) and Meta kernel: ``_after``'s results, then what the next
    iteration computes from them where the pair is accepted: its direction from the history with the pair
    appended (``old_dirs`` and the rest come without the entry a full history drops) and ``H_diag`` the new
    ``ys / y.dot(y)``, its alphas, and torch's descent test ``gtd > -tolerance_change`` packed last (as
    ``gtd + tolerance_change > 0``, the same test: a sum of floats is 0 only where they cancel exactly)."""
    flat_grad, packed, y, s, ys, ro_new, H_new = _after(grads, loss, prev_flat_grad, d, t, tolerance_grad,
                                                        tolerance_change)
    al = [None] * (len(old_dirs) + 1)
    following = _two_loop(flat_grad, [*old_dirs, y], [*old_stps, s], [*ro, ro_new], H_new, al)
    stop = flat_grad.dot(following).add(tolerance_change) > 0
    packed = torch.cat([packed, stop.to(packed.dtype).reshape(1)])
    return [flat_grad, packed, y, s, ys, ro_new, H_new, following, *al]


def _after_direction_op():
    return define("_lbfgs_after_direction", "_lbfgs_after_direction(Tensor[] grads, Tensor? loss, "
                  "Tensor? prev_flat_grad, Tensor? d, float t, float tolerance_grad, float tolerance_change, "
                  "Tensor[] old_dirs, Tensor[] old_stps, Tensor[] ro) -> Tensor[]", _after_direction, _after_direction)
