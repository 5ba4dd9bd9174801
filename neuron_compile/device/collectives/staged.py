"""A C++ process group's collectives (``init_process_group("gloo")``) on neuron tensors, staged through the host.

gloo's ``ProcessGroup`` is C++: its collectives reach the dispatcher ops ``c10d::allreduce_``...,
whose PrivateUse1 kernels are ours (``_torch_hooks.collectives_on_device_through``): ``staged_collective``
copies the neuron tensors to the host, runs the op's CPU kernel (gloo) on the copies and writes the
results back. A failure names the collective, the rank and the group; one of gloo's transport (a dead
peer closes gloo's connections) tells ``runtime.collectives.peer_failed``, so the process exits without
the distributed XLA client's shutdown barrier (``peer_failed``; the ``neuron`` group's own works report
there too).

Those ops get the reduce op boxed (a ``ReduceOp`` ScriptObject without methods): a PREMUL_SUM's factor
cannot be read there, and gloo refuses the op. So the reductions torch.distributed's functions call on a
C++ group (``ProcessGroup.allreduce``, ``reduce_scatter_single``...) are wrapped once
(``premul_sum_on_cpp_groups``): where the options ask for PREMUL_SUM and a tensor is on the device, the
inputs are multiplied by the factor on the device (``reduce_ops``) and gloo runs a SUM. Everything else
passes through untouched (CPU tensors with PREMUL_SUM meet gloo's own refusal, as without us); the
``neuron`` group (a Python subclass) overrides every one of these methods itself.
"""

from __future__ import annotations

import functools

import torch

from . import reduce_ops
from .._torch_hooks import NAME, redispatch_cpu


def is_neuron(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == NAME


# the arguments each c10d op writes its results into (the rest it only reads)
_WRITTEN = frozenset({"tensors", "output_tensors", "output_tensor", "outputs", "output_lists", "output"})
_READ_ONLY_OPS = frozenset({"send"})


def staged_collective(op, *args, **kwargs):
    """A C++ group's collective (gloo's, ``init_process_group("gloo")``) on neuron tensors: the neuron
    tensors' host copies go to the op's CPU kernel, which runs the group's CPU backend; once it finished
    (waited here: gloo runs on its own threads) the results are written back into the neuron tensors.
    Returns what the CPU kernel returns, with the neuron tensors in place of their host copies. A failure
    names the collective, the rank and the group."""
    from torch.utils._pytree import tree_map

    name = op._schema.name.split("::")[-1]
    schema_args = op._schema.arguments
    pairs = []  # (neuron tensor, host copy, written)
    by_id = {}

    def stage(written):
        def to_host(value):
            if not is_neuron(value):
                return value
            with torch.no_grad():
                host = value.detach().cpu().contiguous()
            pairs.append((value, host, written))
            by_id[id(host)] = value
            return host
        return to_host

    host_args = []
    for position, value in enumerate(args):
        argument = schema_args[position].name if position < len(schema_args) else ""
        host_args.append(tree_map(stage(argument in _WRITTEN and name not in _READ_ONLY_OPS), value))
    host_kwargs = {key: tree_map(stage(key in _WRITTEN and name not in _READ_ONLY_OPS), value)
                   for key, value in kwargs.items()}
    group = next((a for a in args if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type())), None)
    try:
        result = redispatch_cpu(op, *host_args, **host_kwargs)
    except Exception as error:  # noqa: BLE001 - any failure becomes the collective's error
        raise _c10d_error(name, group, error) from error
    try:
        work = result[-1] if isinstance(result, tuple) else result
        work.wait()
    except Exception as error:  # noqa: BLE001 - failed waiting on the peers
        error = _c10d_error(name, group, error)
        peer_failed(str(error))
        raise error from error.__cause__
    with torch.no_grad():
        for tensor, host, written in pairs:
            if written:
                tensor.copy_(host)
    return tree_map(lambda v: by_id.get(id(v), v) if isinstance(v, torch.Tensor) else v, result)


def _c10d_error(collective: str, group, error: Exception) -> RuntimeError:
    try:  # the op's group is a boxed ProcessGroup (a ScriptObject)
        group = torch.distributed.ProcessGroup.unbox(group)
        where = f"rank {group.rank()} (world size {group.size()}, group {group.group_name!r})"
    except Exception:  # noqa: BLE001 - a group that cannot say: the rank in the default group
        where = f"rank {torch.distributed.get_rank()}" if torch.distributed.is_initialized() else "this rank"
    failure = RuntimeError(f"torch.distributed: {collective} on neuron tensors (staged through the group's CPU "
                           f"backend) failed on {where}: {error}")
    failure.__cause__ = error
    return failure


def peer_failed(reason: str) -> None:
    """A collective failed: where gloo's transport failed (``gloo/transport/...`` in the message: a peer's
    connection closed or reset, a receive timed out), the process leaves without the distributed XLA client's
    shutdown barrier (``runtime.collectives.peer_failed``). Other failures (gloo refuses an argument when the
    work is waited on too) say nothing of the peers."""
    if "gloo/transport/" not in reason:
        return
    from neuron_compile.runtime import distributed as collectives

    collectives.peer_failed(reason)


# a C++ group's reductions called from Python, with where their inputs are: in place (the list of tensors
# they reduce into), or read only (copies are multiplied), and as one tensor, a list or a list of lists
_SUMMED = {"allreduce": (0, True), "allreduce_coalesced": (0, True), "reduce": (0, True),
           "reduce_scatter": (1, False), "reduce_scatter_single": (1, False), "_reduce_scatter_base": (1, False),
           "reduce_scatter_single_coalesced": (1, False), "reduce_scatter_tensor_coalesced": (1, False)}


def premul_sum_on_cpp_groups() -> None:
    """Wrap ``torch.distributed.ProcessGroup``'s reductions (``_SUMMED``) once: a PREMUL_SUM of neuron tensors
    becomes their product with its factor, then a SUM."""
    cls = getattr(torch.distributed, "ProcessGroup", None)
    for name, (position, in_place) in _SUMMED.items():
        original = getattr(cls, name, None)
        if original is not None and not getattr(original, "_neuron_premul_sum", False):
            setattr(cls, name, _premultiplying(original, name, position, in_place))


def _premultiplying(original, name: str, position: int, in_place: bool):
    @functools.wraps(original)
    def reduction(self, *args, **kwargs):
        opts = args[-1] if len(args) > position + 1 else kwargs.get("opts")
        red_op = getattr(getattr(opts, "reduceOp", None), "op", None)
        if red_op != torch.distributed.ReduceOp.PREMUL_SUM or len(args) <= position:
            return original(self, *args, **kwargs)
        inputs = args[position]
        flat = [inputs] if isinstance(inputs, torch.Tensor) else [
            t for item in inputs for t in (item if isinstance(item, (list, tuple)) else [item])]
        if not any(is_neuron(t) for t in flat):
            return original(self, *args, **kwargs)  # gloo's own answer, as without the device
        try:
            reduce_ops.check(red_op, flat)
        except TypeError as error:
            raise RuntimeError(f"torch.distributed: {name} on neuron tensors failed on rank {self.rank()} "
                               f"(world size {self.size()}): {error}") from error
        factor = opts.reduceOp.factor
        opts.reduceOp = torch.distributed.ReduceOp.SUM

        def scaled(value):
            if isinstance(value, torch.Tensor):
                return reduce_ops.premultiply(value, factor, in_place)
            return [scaled(item) for item in value]

        args = (*args[:position], scaled(inputs), *args[position + 1:])
        return original(self, *args, **kwargs)

    reduction._neuron_premul_sum = True
    return reduction
