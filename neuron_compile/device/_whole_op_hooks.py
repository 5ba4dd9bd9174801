"""The private torch APIs ``whole_ops`` stands on, in one place.

* ``OpOverload._op_dk``: an op's C++ composite kernel (eager's decomposition);
* ``torch._C._autograd._saved_tensors_hooks_set_tracing`` and ``_top_saved_tensors_default_hooks``:
  saved-tensor hooks off while a joint graph is traced, and whether any are set;
* ``torch._C._len_torch_dispatch_stack`` and ``torch._C._functorch.is_functorch_wrapped_tensor``: whether
  a call comes from a tracer (make_fx, FakeTensorMode, functionalization, DTensor) or a functorch
  transform, which must see the op's own decomposition;
* ``torch._functorch.partitioners.default_partition``: AOTAutograd's split of a joint forward-backward graph
  into a forward that also returns what the backward needs and that backward.

``tests/test_device_hooks.py`` checks each, so a torch upgrade that changes one fails there, by name.
"""

from __future__ import annotations

import contextlib

import torch


def composite(op, *args, **kwargs):
    """``op``'s C++ ``CompositeImplicitAutograd`` kernel: its decomposition as eager runs it (``op.decompose``
    prefers a Python decomposition torch registers for tracers: an LSTM's without its fused cell)."""
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


@contextlib.contextmanager
def saved_tensor_hooks_off():
    """Saved-tensor hooks (``torch.utils.checkpoint``'s, ``save_on_cpu``) skip the tensors autograd saves in
    here (Dynamo's switch while it traces): a joint graph traced inside a checkpointed forward is not
    part of it (the checkpoint counted its tensors, then found fewer when it recomputed)."""
    prior = torch._C._autograd._saved_tensors_hooks_set_tracing(True)
    try:
        yield
    finally:
        torch._C._autograd._saved_tensors_hooks_set_tracing(prior)


def saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks are set on this thread (``torch.utils.checkpoint``, ``save_on_cpu``)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True) is not None


def traced() -> bool:
    """Whether a ``__torch_dispatch__`` mode is active (make_fx, FakeTensorMode, a debug mode)."""
    return torch._C._len_torch_dispatch_stack() > 0


def wrapped(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a functorch transform's wrapper (vmap, grad, jvp)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(tensor)


def partition(joint: torch.fx.GraphModule, joint_inputs, num_fwd_outputs: int):
    """(forward, backward) GraphModules of a joint graph whose placeholders are ``primals_*`` and
    ``tangents_*`` and whose first ``num_fwd_outputs`` outputs are the forward's: the forward returns them,
    then the values the backward reads; the backward takes those values, then the tangents."""
    from torch._functorch.partitioners import default_partition

    return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
