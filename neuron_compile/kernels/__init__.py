"""Kernels: hand-written lowerings swapped in by name.

* ``kernel_registry``: ``register_kernel`` (a decorator), the entry-point group
  ``neuron_compile.kernels`` (installed kernel packages, loaded at the first
  compile), lookups and the fingerprints that go into cache keys;
* ``autograd``: a custom op's backward kernel made its PyTorch autograd formula;
* ``lowering``: what the compile path calls (a custom op's JAX rule, a
  composite's replacement StableHLO, the checks and errors naming the kernel);
* ``attention``: the kernel we ship, ``neuron::attention`` (a custom op, with
  its backward, and a transformers attention function calling it);
* ``rms_norm``: ``neuron::rms_norm``, a custom op with a JAX kernel, for layers
  swapped in by Hugging Face's ``kernels`` library (``hf``).

Nothing here imports JAX until a kernel is lowered.
"""

from typing import Callable

from .autograd import attach_autograd
from .kernel_registry import (ENTRY_POINT_GROUP, Kernel, KernelError, add, kernels, make_kernel, rediscover,
                              unregister_kernel)


def register_kernel(target, fn: Callable | None = None, *, version: str = "1", backward: Callable | None = None,
                    match: Callable | None = None, stablehlo: str | None = None, origin: str = "code"):
    """Register a kernel for a composite kind (``"neuron.rms_norm"``) or a custom op (``"ns::op"`` or the op
    object). A decorator on a JAX function (``@register_kernel("ns::op", backward=...)``), or a call with
    ``fn`` or ``stablehlo`` (a module's text whose ``@main`` takes the operands). ``version`` goes into cache
    keys with the functions' source; ``match(site)`` may decline a composite (``passes.swap.CompositeSite``);
    ``backward(grad, *args)`` returns one gradient per tensor argument of a custom op and makes it trainable.
    A custom op registered without a backward, and without an autograd formula of its own, gets one that
    raises an error saying so. Returns ``fn`` (the decorator returns the function it decorates)."""
    def register(function):
        kernel = make_kernel(target, function, version=version, backward=backward, match=match,
                             stablehlo=stablehlo, origin=origin)
        add(kernel)
        if not kernel.is_composite:
            attach_autograd(kernel)
        return function

    if fn is not None or stablehlo is not None:
        return register(fn)
    return register

__all__ = ["ENTRY_POINT_GROUP", "Kernel", "KernelError", "kernels", "register_kernel", "rediscover",
           "unregister_kernel"]
