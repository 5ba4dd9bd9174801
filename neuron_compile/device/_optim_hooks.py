"""The private ``torch.optim`` API the device routes: Adam's and AdamW's foreach step function, SGD's
for-loop and foreach step functions, and LBFGS's step, its two-loop recursion one call.

``torch.optim.adam._multi_tensor_adam``, ``torch.optim.sgd._single_tensor_sgd`` and ``_multi_tensor_sgd``
are private functions of torch; this module alone replaces them (``tests/test_device_hooks.py`` checks the
lookups it relies on and the sources ``optim.foreach_adam_`` and ``optim.foreach_sgd_`` mirror, so a torch
upgrade that changes any fails there, by name).
"""

from __future__ import annotations


def multi_tensor_adam_through(handler) -> None:
    """Adam's and AdamW's foreach step (``torch.optim.adam._multi_tensor_adam``, the default on a device in
    torch's foreach list, which PrivateUse1 is) calls ``handler(original, *args, **kwargs)``.

    ``torch.optim.adam.adam`` looks the function up in its module at every step (``func =
    _multi_tensor_adam``), and ``AdamW`` is ``Adam`` with decoupled weight decay, so one module attribute
    serves both. torch imports ``torch.optim`` before the device's autoload runs: a plain ``setattr``. Under
    Dynamo (a compiled optimizer step) the router calls torch's own (``dynamo_skips.traced_through``)."""
    import torch.optim.adam as adam

    _route(adam, ("_multi_tensor_adam",), handler)


def sgd_through(handler) -> None:
    """SGD's step functions (``torch.optim.sgd._single_tensor_sgd``, ``foreach=False``, and
    ``_multi_tensor_sgd``, the default on a foreach device) call ``handler(original, *args, **kwargs)``:
    ``torch.optim.sgd.sgd`` looks them up in its module at every step (``func = _multi_tensor_sgd`` /
    ``func = _single_tensor_sgd``)."""
    import torch.optim.sgd as sgd

    _route(sgd, ("_single_tensor_sgd", "_multi_tensor_sgd"), handler)


LBFGS_STEP = None  # torch's own LBFGS.step (under torch.no_grad()), once routed


def lbfgs_step_through(handler) -> None:
    """``torch.optim.LBFGS.step`` calls ``handler(original, self, closure)`` (torch's own under Dynamo), inside
    the profiling and hook wrapper ``Optimizer`` puts around a class's ``step`` (put there by the first
    optimizer made: before that, the router is what it wraps; after, it is wrapped again here)."""
    from torch.optim import lbfgs
    from torch.optim.optimizer import Optimizer

    from ..dynamo_skips import traced_through

    global LBFGS_STEP
    current = lbfgs.LBFGS.step
    if getattr(current, "_neuron", False):  # routed already (a wrapper copies the mark: functools.wraps)
        return
    hooked = getattr(current, "hooked", False)
    original = LBFGS_STEP = current.__wrapped__ if hooked else current  # torch's step, under torch.no_grad()
    routed = traced_through(original, handler)
    if hooked:
        routed = Optimizer.profile_hook_step(routed)
        routed.hooked = True
    lbfgs.LBFGS.step = routed


def lbfgs_methods_through(gather_flat_grad, add_grad) -> None:
    """``torch.optim.LBFGS._gather_flat_grad`` and ``_add_grad`` (private methods its step and line search call)
    call ``gather_flat_grad(original, self)`` and ``add_grad(original, self, step_size, update)`` (torch's own
    under Dynamo)."""
    from torch.optim import lbfgs

    _route(lbfgs.LBFGS, ("_gather_flat_grad",), gather_flat_grad)
    _route(lbfgs.LBFGS, ("_add_grad",), add_grad)


# torch 2.13's LBFGS.step computes its direction with a two-loop recursion over the history: 5 small ops a
# history entry each way (a history of 10: 102 ops an iteration, three quarters of a step's), and it passes
# 0-d tensors as ``alpha``, which torch's argument parser reads on the host before the op is dispatched (CUDA
# too; on the device each read runs the queue and waits for it). Here the block is one call,
# ``direction(flat_grad, old_dirs, old_stps, ro, H_diag, al)`` (``lbfgs.direction``: one device op once
# built, the same loops with the products as tensor ops until then); the rest of the block's lines are left
# blank, so every line after it keeps torch's number
LBFGS_DIRECTION = """\
q = flat_grad.neg()
for i in range(num_old - 1, -1, -1):
    al[i] = old_stps[i].dot(q) * ro[i]
    q.add_(old_dirs[i], alpha=-al[i])

# multiply by initial Hessian
# r/d is the final direction
d = r = torch.mul(q, H_diag)
for i in range(num_old):
    be_i = old_dirs[i].dot(r) * ro[i]
    r.add_(old_stps[i], alpha=al[i] - be_i)
"""
LBFGS_DIRECTION_CALL = "d = _neuron_direction(flat_grad, old_dirs, old_stps, ro, H_diag, al)\n"


def lbfgs_step_with_direction(original, direction):
    """torch's ``LBFGS.step`` (``original``, as ``lbfgs_step_through`` passes it) with its two-loop recursion
    (``LBFGS_DIRECTION``, at whatever indentation) a call to ``direction``: compiled once against
    ``torch.optim.lbfgs``'s globals, with its file and line numbers (a traceback shows torch's lines). A torch
    whose step no longer has that block once raises, naming it: torch changed ``LBFGS.step``."""
    import inspect
    import re
    import textwrap

    from torch.optim import lbfgs

    raw = inspect.unwrap(original)
    lines, first = inspect.getsourcelines(raw)
    source = textwrap.dedent("".join(lines))
    indents = set(re.findall(r"^( *)" + re.escape(LBFGS_DIRECTION.splitlines()[0]) + "$", source, re.MULTILINE))
    blocks = [textwrap.indent(LBFGS_DIRECTION, indent) for indent in indents]
    if len(blocks) != 1 or source.count(blocks[0]) != 1:
        raise RuntimeError("torch changed torch.optim.LBFGS.step: its two-loop recursion (neuron_compile.device."
                           "_optim_hooks.LBFGS_DIRECTION) is not there once; the device's step must follow it")
    call = textwrap.indent(LBFGS_DIRECTION_CALL, indents.pop())
    source = source.replace(blocks[0], call + "\n" * (LBFGS_DIRECTION.count("\n") - 1))
    namespace = dict(vars(lbfgs), _neuron_direction=direction)
    exec(compile("\n" * (first - 1) + source, inspect.getsourcefile(raw), "exec"), namespace)  # noqa: S102
    step = namespace[raw.__name__]
    step.__qualname__ = raw.__qualname__
    return step


def _route(module, names, handler) -> None:
    """Replace each function ``module.<name>`` (a module's or a class's) by a router to ``handler`` (once: a
    router is marked ``_neuron``); under Dynamo the router calls torch's own (``dynamo_skips.traced_through``)."""
    from ..dynamo_skips import traced_through

    for name in names:
        if not getattr(getattr(module, name), "_neuron", False):
            setattr(module, name, traced_through(getattr(module, name), handler))
