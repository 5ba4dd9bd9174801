"""Eager collectives of neuron tensors run by XLA on the distributed PJRT client, no host copy.

The ``neuron`` process group (``process_group.py``) sends its all-reduces, all-gathers into one tensor,
reduce-scatters from one tensor, broadcasts and even all-to-alls of neuron tensors here, one at a time or
coalesced (its whole-world group, or a subgroup whose size divides the world): one small StableHLO
module of the collectives (``lowering.functional_collectives.eager_module``), compiled once per kinds, shapes, dtypes
and op on the client compiled graphs' collectives use (``runtime/distributed.py``), run on the tensors' own
buffers, which cross to that client and back through DLPack (the same host memory).
"""

from __future__ import annotations

import torch

from .._torch_hooks import NAME

DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64})
_REDUCTIONS = {}  # ReduceOp's RedOpType -> the lowering's name, filled on first use
_EXECUTABLES: dict = {}  # (per call: kind, shapes, dtype; op, replica groups) -> the XlaExecutable


def run(calls: list, op: str | None, groups: list) -> None:
    """XLA's collectives ``calls`` (``(kind, source, output)``: ``all_reduce``, ``all_gather``,
    ``reduce_scatter`` or ``all_to_all`` along dim 0, or ``("broadcast", root)``) of neuron tensors over this
    rank's group (``groups[0]`` of the replica groups ``groups``, which cover the world) on the distributed
    client, as one executable, each result written into its neuron tensor ``output`` (``source`` itself for
    an all-reduce or a broadcast): the buffers cross there and back through DLPack (the same host memory)
    and the results are written by device copies, no host copy. One executable per kinds, shapes, dtypes
    and op, compiled by every rank at its first such call (every rank makes the same collectives in the
    same order: DDP's buckets, FSDP2's per-module gathers, a coalesced batch)."""
    from neuron_compile.runtime.executor import DistributedBridge, XlaExecutable

    from ...lowering.functional_collectives import eager_module
    from ...lowering.splice import tensor_type
    from ..opkernel import COUNTS

    size = len(groups[0])
    sources, results = [], []
    for kind, source, output in calls:
        if source.dim() == 0:  # a 0-d tensor (a step count, BatchNorm's batch count): one row of one element
            source = source.reshape(1)
        if kind == "all_gather":  # the output may be stacked (size, n, ...): the gathered rows, viewed so
            shape = (size * source.shape[0], *source.shape[1:])
        elif kind == "reduce_scatter":  # the input may be stacked (size, n, ...): rows of the output's rows
            shape = tuple(output.shape)
            source = source.reshape(size * output.shape[0], *output.shape[1:])
        else:
            shape = tuple(source.shape)
        sources.append(source if source.is_contiguous() else source.contiguous())
        results.append(torch.empty(shape, dtype=output.dtype, device="meta"))
    layout = tuple(map(tuple, groups))
    key = (tuple((kind, tuple(s.shape), tuple(r.shape), s.dtype) for (kind, _, _), s, r in zip(calls, sources, results)),
           op, layout)
    executable = _EXECUTABLES.get(key)
    if executable is None:
        module = eager_module([(kind, s, r) for (kind, _, _), s, r in zip(calls, sources, results)], op, groups,
                              tensor_type)
        executable = XlaExecutable.compile(module)
        first, s = calls[0][0], sources[0]
        executable.what = (f"{first if isinstance(first, str) else first[0]} ({op or 'gather'}) of a "
                           f"{tuple(s.shape)} {s.dtype} neuron tensor"
                           + (f" and {len(calls) - 1} more, coalesced" if len(calls) > 1 else ""))
        _EXECUTABLES[key] = executable
    bridge = DistributedBridge(executable.target, NAME)
    buffers = executable.run_buffers([bridge.to_buffer(s.detach()) for s in sources])
    to_tensor = bridge.result(NAME)
    with torch.no_grad():
        for buffer, (_, _, output) in zip(buffers, calls):
            output.copy_(to_tensor(buffer).view(output.shape))
    COUNTS["device_collectives"] = COUNTS.get("device_collectives", 0) + len(calls)


def reduction(red_op) -> str | None:
    """The lowering's name of a ``ReduceOp`` (its ``RedOpType``), or None where XLA has none here: BAND, BOR
    and BXOR stage through gloo (XLA CPU's gloo collectives refuse an ``and`` reduction: "Unsupported
    reduction computation"); PREMUL_SUM reaches XLA as the SUM of its multiplied input
    (``distributed.NeuronProcessGroup._reduction``)."""
    if not _REDUCTIONS:
        ops = torch.distributed.ReduceOp
        _REDUCTIONS.update({ops.SUM: "sum", ops.AVG: "avg", ops.MAX: "max", ops.MIN: "min", ops.PRODUCT: "product"})
    return _REDUCTIONS.get(red_op)
