"""Autograd for custom ops served by a kernel.

A kernel registered with ``backward=`` makes its op trainable: the op gets a
PyTorch autograd formula (``torch.library.register_autograd``) whose backward
calls a companion op, ``neuron_kernels::<ns>__<op>_backward(grad, <the op's
arguments>) -> Tensor[]`` (one gradient per tensor argument). In a compiled
graph that companion op is served by the backward kernel, as the forward op
is by the forward kernel; run eagerly, it runs the backward kernel through
JAX on the CPU. A custom op with neither our backward nor one of its own gets
a formula that raises an error naming the kernel and saying what to register
(PyTorch's own error would only say that no formula exists).
"""

from __future__ import annotations

import torch

from .kernel_registry import Kernel, KernelError, lookup

NAMESPACE = "neuron_kernels"
_LIB = None
# companion op "neuron_kernels::x" -> the forward kernel's name
BACKWARD_OPS: dict[str, str] = {}


def _library():
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
    return _LIB


def backward_op_name(name: str) -> str:
    return name.replace("::", "__") + "_backward"


def attach_autograd(kernel: Kernel) -> None:
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(kernel.name)
    if kernel.backward is None:
        if opdef is not None and opdef._backward_fn is None:
            opdef.register_autograd(_no_backward(kernel.name))
        return
    schema = _schema(kernel.name)
    if len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
        raise KernelError(f"kernel {kernel.name!r}: a backward kernel needs an op that returns one Tensor, "
                          f"not {schema.returns}")
    companion = backward_op_name(kernel.name)
    qualified = f"{NAMESPACE}::{companion}"
    if qualified not in BACKWARD_OPS:
        _define_companion(kernel.name, companion, schema)
    BACKWARD_OPS[qualified] = kernel.name
    arguments = list(schema.arguments)
    tensor_positions = [i for i, a in enumerate(arguments) if _is_tensor(a)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*(inputs[i] for i in tensor_positions))
        ctx.others = [None if i in tensor_positions else value for i, value in enumerate(inputs)]

    def backward(ctx, grad):
        values = list(ctx.others)
        for i, saved in zip(tensor_positions, ctx.saved_tensors):
            values[i] = saved
        args = [v for a, v in zip(arguments, values) if not a.kwarg_only]
        kwargs = {a.name: v for a, v in zip(arguments, values) if a.kwarg_only}
        grads = getattr(getattr(torch.ops, NAMESPACE), companion)(grad, *args, **kwargs)
        out = [None] * len(arguments)
        for i, g in zip(tensor_positions, grads):
            out[i] = g if values[i] is not None else None  # an optional tensor left out: empty stand-in
        return tuple(out)

    torch.library.register_autograd(kernel.name, backward, setup_context=setup_context)


def _schema(name: str):
    namespace, op = name.split("::")
    packet = getattr(getattr(torch.ops, namespace), op)
    return packet.default._schema


def _is_tensor(argument) -> bool:
    return str(argument.type) in ("Tensor", "Optional[Tensor]", "Tensor?")


def _define_companion(name: str, companion: str, schema) -> None:
    text = str(schema)
    args = text[text.index("(") + 1:text.rindex(") ->")]
    lib = _library()
    lib.define(f"{companion}(Tensor grad{', ' + args if args else ''}) -> Tensor[]")
    arguments = list(schema.arguments)
    tensors = [i for i, a in enumerate(arguments) if _is_tensor(a)]

    def slots(grad, args, kwargs) -> list:  # per tensor argument its value (an optional one may be None)
        values = list(args) + [kwargs.get(a.name, a.default_value) for a in arguments[len(args):]]
        return [values[i] for i in tensors]

    def fake(grad, *args, **kwargs):  # contiguous, as the kernel's results are (empty_like would keep a view's strides)
        return [grad.new_empty(0) if t is None else t.new_empty(t.shape) for t in slots(grad, args, kwargs)]

    def eager(grad, *args, **kwargs):  # the backward kernel through JAX on the CPU
        return run_backward_eagerly(name, grad, args, kwargs, slots(grad, args, kwargs))

    lib.impl(companion, eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{companion}", fake, lib=lib)


def _no_backward(name: str):
    def backward(ctx, *grads):
        raise KernelError(
            f"the custom op {name!r} is served by a neuron_compile kernel that has no backward, and the op has no "
            f"autograd formula: it cannot be trained. Register one: neuron_compile.kernels.register_kernel("
            f"{name!r}, forward_fn, backward=backward_fn) (a JAX function (grad, *args) -> one gradient per tensor "
            f"argument), or torch.library.register_autograd({name!r}, ...); or run it under torch.no_grad().")

    return backward


def run_backward_eagerly(name: str, grad: torch.Tensor, args: tuple, kwargs: dict, slots: list) -> list[torch.Tensor]:
    """The companion backward op on real tensors: the backward kernel through JAX on the CPU."""
    import jax

    kernel = lookup(name)
    if kernel is None or kernel.backward is None:
        raise RuntimeError(f"neuron_compile: the backward kernel of {name!r} is no longer registered")

    def to_jax(value):
        return jax.dlpack.from_dlpack(value.detach().cpu().contiguous()) if isinstance(value, torch.Tensor) else value

    with jax.enable_x64(True):
        grads = kernel.backward(to_jax(grad), *map(to_jax, args), **{k: to_jax(v) for k, v in kwargs.items()})
        grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
        out = []
        for g, t in zip(grads, slots):
            if t is None:
                out.append(grad.new_empty(0))
            else:
                out.append(torch.zeros_like(t) if g is None else
                           torch.from_dlpack(jax.numpy.asarray(g)).to(device=t.device, dtype=t.dtype).clone())
    return out
