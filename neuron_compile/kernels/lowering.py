"""How the compile path calls registered kernels.

* ``kernel_rule(node)``: for an FX node calling a custom op that a kernel
  serves (or the companion backward op of one, ``autograd``), a JAX rule in
  the form ``lowering.splice`` takes: the node then lowers through JAX inside
  the same StableHLO module as the rest of its graph. The kernel's results
  must have the op's shapes and dtypes exactly.
* ``swap_composite_kernels(module)``: for each ``stablehlo.composite
  "neuron.<kind>"`` left by the fuse pass, the StableHLO text of the kernel
  registered for that kind (``composite_lookup``: lowered by ``jax.jit`` at the
  composite's operand types), which ``passes.swap`` puts in as the
  composite's decomposition.

Every failure is a ``KernelLoweringError`` naming the kernel and saying what to
do; the registry holds the kernels (``registry``).
"""

from __future__ import annotations

import torch

from ..lowering.diagnostics import LoweringError, user_source_line
from .autograd import BACKWARD_OPS, NAMESPACE
from .kernel_registry import Kernel, composite_kernels, discover, lookup


class KernelLoweringError(LoweringError):
    """A registered kernel failed to lower, or returned what its op or composite does not."""


def _fail(kernel: Kernel, what: str, problem: str, source: str | None = None, op: str | None = None
          ) -> KernelLoweringError:
    lines = [f"neuron_compile's kernel {kernel.name!r} (version {kernel.version}, from {kernel.origin}) {problem} "
             f"for {what}."]
    if source:
        lines.append(f"It comes from your code at {source}")
    lines.append("What to do: fix the kernel (it must return the results the default lowering would: same "
                 "shapes and dtypes), or unregister it (neuron_compile.kernels.unregister_kernel) to use the "
                 "default lowering.")
    # op: the node's ATen-style name where there is one, so that fallback=eager can run that op eagerly
    return KernelLoweringError("\n".join(lines), op=op or kernel.name, source=source, repro_dir=None,
                               stage="kernels")


def _node_kernel(node: torch.fx.Node) -> tuple[Kernel, bool] | None:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name
    if name.startswith(NAMESPACE + "::"):
        forward = BACKWARD_OPS.get(name)
        kernel = lookup(forward) if forward else None
        return (kernel, True) if kernel is not None and kernel.backward is not None else None
    if "::" not in name or name.startswith(("aten::", "prims::")):
        return None
    discover()
    kernel = lookup(name)
    return (kernel, False) if kernel is not None and not kernel.is_composite else None


def _op(node: torch.fx.Node) -> str:
    return str(node.target).replace("::", ".")


def kernels_in_graph(gm: torch.fx.GraphModule) -> dict[str, Kernel]:
    """FX node name -> the kernel serving it."""
    found = {}
    for node in gm.graph.nodes:
        served = _node_kernel(node)
        if served is not None:
            found[node.name] = served[0]
    return found


def kernel_rule(node: torch.fx.Node):
    """The JAX rule ``lowering.splice`` calls as ``rule(out, *args, **kwargs)``, or None."""
    served = _node_kernel(node)
    if served is None:
        return None
    kernel, is_backward = served
    what = f"FX node `{node.name}` ({node.target})"

    def rule(out, *args, **kwargs):
        try:
            if is_backward:
                grads = kernel.backward(*args, **kwargs)
                result = _gradients(grads, out, kernel, what, node)
            else:
                result = kernel.fn(*args, **kwargs)
        except LoweringError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the kernel raised, name it
            raise _fail(kernel, what, f"failed to lower ({type(exc).__name__}: {exc})",
                        user_source_line(node), _op(node)) from exc
        _check(result, out, kernel, what, node)
        return result

    return rule


def _gradients(grads, out: list, kernel: Kernel, what: str, node):
    import jax.numpy as jnp

    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    if len(grads) != len(out):
        raise _fail(kernel, what, f"returned {len(grads)} gradients from its backward; the op has "
                                  f"{len(out)} tensor arguments", user_source_line(node), _op(node))
    return [jnp.zeros(o.shape, _dtype(o.dtype)) if g is None else g for g, o in zip(grads, out)]


def _dtype(dtype: torch.dtype):
    from ..lowering.jax_rules import _np_dtype

    return _np_dtype(dtype)


def _check(result, out, kernel: Kernel, what: str, node) -> None:
    """The kernel's results against the op's fake outputs: same structure, shapes and dtypes."""
    import jax.numpy as jnp

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(outs):
        raise _fail(kernel, what, f"returned {len(results)} values; the op returns {len(outs)}",
                    user_source_line(node), _op(node))
    for i, (r, o) in enumerate(zip(results, outs)):
        r = jnp.asarray(r)
        got = f"{r.dtype}{list(r.shape)}"
        want = f"{jnp.dtype(_dtype(o.dtype))}{list(o.shape)}"
        if got != want:
            raise _fail(kernel, what, f"returned {got} as result {i}; the op's signature says {want}",
                        user_source_line(node), _op(node))


# --------------------------------------------------------------------------- composites


def has_composite_kernels() -> bool:
    return bool(composite_kernels())


def composite_lookup(site) -> tuple[str, str] | None:
    """``passes.swap``'s callback: (kernel name, StableHLO text of a module whose @main takes the
    composite's operands) for a composite a kernel serves, or None (the decomposition stays)."""
    kernel = lookup(site.name)
    if kernel is None or not kernel.is_composite:
        return None
    what = f"the composite {site.symbol} ({site.name} {site.signature})"
    try:
        if kernel.match is not None and not kernel.match(site):
            return None
        if kernel.stablehlo is not None:
            return kernel.name, kernel.stablehlo
        import jax

        from ..lowering.splice import jax_to_stablehlo

        avals = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in site.operands]
        return kernel.name, jax_to_stablehlo(kernel.fn, avals)
    except LoweringError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the kernel raised, name it
        raise _fail(kernel, what, f"failed to lower ({type(exc).__name__}: {exc})") from exc


def swap_composite_kernels(module) -> list[dict]:
    """``passes.swap`` with our lookup: one ``{site, kind, kernel, origin}`` per composite a kernel now serves."""
    from neuron_compile.passes.swap import SwapError, swap_composites

    try:
        swaps = swap_composites(module, composite_lookup)
    except SwapError as exc:
        kernel = lookup(exc.kernel) or Kernel(exc.kernel)
        raise _fail(kernel, f"the composite {exc.site.symbol} ({exc.site.name} {exc.site.signature})",
                    f"does not fit: {exc}") from None
    return [{"site": symbol, "kind": "composite", "kernel": name, "origin": lookup(name).origin}
            for symbol, name in swaps]
