"""The private ``torch.optim`` API the device routes: Adam's and AdamW's foreach step function, SGD's
for-loop and foreach step functions, and LBFGS's step, rewritten where it reads a value on the host.

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


# torch 2.13's LBFGS.step passes 0-d tensors as ``alpha``: torch's argument parser reads each on the host before
# the op is dispatched (CUDA too), 2 reads per history entry an iteration (20 of an iteration's 25 with a
# history of 10). On the device each read runs the queue and waits for it; here the same product is issued as
# a tensor op, and nothing is read
LBFGS_REWRITES = (
    ("q.add_(old_dirs[i], alpha=-al[i])", "q.add_(old_dirs[i] * -al[i])"),
    ("r.add_(old_stps[i], alpha=al[i] - be_i)", "r.add_(old_stps[i] * (al[i] - be_i))"),
)


def lbfgs_step_without_reads(original):
    """torch's ``LBFGS.step`` (``original``, as ``lbfgs_step_through`` passes it) with ``LBFGS_REWRITES``
    made in its source: compiled once against ``torch.optim.lbfgs``'s globals, with its file and line
    numbers (a traceback shows torch's lines). A rewrite that no longer finds its line raises, naming it:
    torch changed ``LBFGS.step``."""
    import inspect
    import textwrap

    from torch.optim import lbfgs

    raw = inspect.unwrap(original)
    lines, first = inspect.getsourcelines(raw)
    source = textwrap.dedent("".join(lines))
    for old, new in LBFGS_REWRITES:
        if source.count(old) != 1:
            raise RuntimeError(f"torch changed torch.optim.LBFGS.step: its line {old!r} is not there once; "
                               f"neuron_compile.device._optim_hooks.LBFGS_REWRITES must follow it")
        source = source.replace(old, new)
    namespace = dict(vars(lbfgs))
    exec(compile("\n" * (first - 1) + source, inspect.getsourcefile(raw), "exec"), namespace)  # noqa: S102
    step = namespace[raw.__name__]
    step.__qualname__ = raw.__qualname__
    return step


def _route(module, names, handler) -> None:
    """Replace each function ``module.<name>`` by a router to ``handler`` (once: a router is marked
    ``_neuron``); under Dynamo the router calls torch's own (``dynamo_skips.traced_through``)."""
    from ..dynamo_skips import traced_through

    for name in names:
        if not getattr(getattr(module, name), "_neuron", False):
            setattr(module, name, traced_through(getattr(module, name), handler))
