"""Python that Dynamo traces in place of PyTorch's: it sits outside the packages the device hides from
Dynamo (``dynamo_skips.COMPILE_STACK``: a frame of those is never traced, and a
substitution there would be a skipped function, a Dynamo error).

* ``associative_scan``: the frontend's substitution (``decompositions/associative_scan.py`` installs it):
  PyTorch's ``associative_scan`` op for a generic-mode scan in a frame traced for our backend.
* ``flex_validate_device``: FlexAttention's device check with the neuron device admitted
  (``decompositions/flex_attention.py`` installs it).

Module globals only: Dynamo reads them by name.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch._higher_order_ops.associative_scan  # noqa: F401  (imported by torch's own __init__)
from torch.utils import _pytree as pytree

# the module, not the function the package re-exports under the same name
_scan = sys.modules["torch._higher_order_ops.associative_scan"]
frontend = None  # PyTorch's frontend, a copy Dynamo inlines as it is (set by install)


def associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise"):
    """What Dynamo traces for ``associative_scan``: the op for a generic-mode scan that needs no
    gradient in a frame traced for our backend, PyTorch's frontend otherwise. (PyTorch's autograd
    for the op materializes ``n x n`` matrices per element: 140 GB for Mamba's backward at 256
    tokens, so a scan that needs a gradient keeps the recursion.) Module globals only: Dynamo
    reads them by name."""
    leaves, spec = pytree.tree_flatten(xs)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in leaves)
    if combine_mode != "generic" or not leaves or grad or not for_neuron():
        return frontend(combine_fn, xs, dim, reverse, combine_mode)
    leaves = [torch.movedim(x, dim, 0) for x in leaves]
    if reverse:
        leaves = [torch.flip(x, [0]) for x in leaves]
    flat = functools.partial(_scan.wrap_combine_fn_flat, combine_fn=combine_fn, spec=spec, num_leaves=len(leaves))
    out = _scan.associative_scan_op(flat, leaves, additional_inputs=())
    if reverse:
        out = [x.flip([0]) for x in out]
    return pytree.tree_unflatten([torch.movedim(x, 0, dim) for x in out], spec)


@torch.compiler.assume_constant_result
def for_neuron() -> bool:
    """Whether the frame Dynamo is tracing now is traced for our backend (read at trace time: a
    constant of the trace). Other backends (Inductor's scan needs a GPU) keep PyTorch's recursion."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = getattr(InstructionTranslator, "current_tx", lambda: None)()
    fn, seen = getattr(getattr(tx, "output", None), "compiler_fn", None), 0
    while fn is not None and seen < 8:  # Dynamo's debug wrapper, torch.compile's, options' partials
        if getattr(fn, "_neuron_compile_backend", False):
            return True
        fn = next((getattr(fn, a) for a in ("_torchdynamo_orig_backend", "compiler_fn", "func", "__wrapped__")
                   if getattr(fn, a, None) is not None), None)
        seen += 1
    return False


flex_checked_device = None  # torch's own FlexAttention device check (set by flex_attention.accept_device)
FLEX_DEVICE = "neuron"


def flex_validate_device(query, key, value):
    """``torch.nn.attention.flex_attention._validate_device`` with ``FLEX_DEVICE`` admitted, backward
    included (q, k and v are on one device: torch checked that before); every other device gets torch's
    own check. Module globals only: Dynamo reads them by name."""
    if query.device.type == FLEX_DEVICE:
        return None
    return flex_checked_device(query, key, value)
