"""Eager collectives of neuron tensors run by XLA on the distributed PJRT client, no host copy.

The ``neuron`` process group (``distributed.py``) sends an all-reduce, an all-gather into one tensor and a
reduce-scatter from one tensor of neuron tensors here (its whole-world group, or a subgroup whose size
divides the world): one small StableHLO
module of the collective (``lowering.collectives.eager_module``), compiled once per kind, shapes, dtype and
op on the client compiled graphs' collectives use (``runtime/collectives.py``), run on the tensor's own
buffer, which crosses to that client and back through DLPack (the same host memory).
"""

from __future__ import annotations

import torch

from ._torch_hooks import NAME

DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64})
_REDUCTIONS = {}  # ReduceOp's RedOpType -> the lowering's name, filled on first use
_EXECUTABLES: dict = {}  # (kind, shapes, dtype, op, world) -> the XlaExecutable


def run(kind: str, source, output, op: str | None, groups: list) -> None:
    """XLA's ``kind`` collective (``all_reduce``, ``all_gather``, ``reduce_scatter`` along dim 0) of the
    neuron tensor ``source`` over this rank's group (``groups[0]`` of the replica groups ``groups``, which
    cover the world) on the distributed client, written into the neuron tensor
    ``output`` (``source`` itself for an all-reduce): the buffer crosses there and back through DLPack
    (the same host memory) and the result is written by a device copy, no host copy. One executable per
    kind, shapes, dtype and op, compiled by every rank at its first such collective (every rank makes the
    same collectives in the same order: DDP's buckets, FSDP2's per-module gathers)."""
    from runtime.executor import DistributedBridge, XlaExecutable

    from ..lowering.collectives import eager_module
    from ..lowering.splice import tensor_type
    from .opkernel import COUNTS

    size = len(groups[0])
    if kind == "all_gather":  # the output may be stacked (size, n, ...): the gathered rows, viewed so
        shape = (size * source.shape[0], *source.shape[1:])
    else:
        shape = tuple(output.shape)
    if kind == "reduce_scatter":  # the input may be stacked (size, n, ...): rows of the output's rows
        source = source.reshape(size * output.shape[0], *output.shape[1:])
    result = torch.empty(shape, dtype=output.dtype, device="meta")
    layout = tuple(map(tuple, groups))
    key = (kind, tuple(source.shape), tuple(result.shape), source.dtype, op, layout)
    executable = _EXECUTABLES.get(key)
    if executable is None:
        executable = XlaExecutable.compile(eager_module(kind, source, result, op, groups, tensor_type))
        executable.what = f"{kind} ({op or 'gather'}) of a {tuple(source.shape)} {source.dtype} neuron tensor"
        _EXECUTABLES[key] = executable
    bridge = DistributedBridge(executable.target, NAME)
    source = source if source.is_contiguous() else source.contiguous()
    (buffer,) = executable.run_buffers([bridge.to_buffer(source.detach())])
    with torch.no_grad():
        output.copy_(bridge.result(NAME)(buffer).view(output.shape))
    COUNTS["device_collectives"] = COUNTS.get("device_collectives", 0) + 1


def reduction(red_op) -> str | None:
    """The lowering's name of a ``ReduceOp`` (its ``RedOpType``), or None where XLA has none here."""
    if not _REDUCTIONS:
        ops = torch.distributed.ReduceOp
        _REDUCTIONS.update({ops.SUM: "sum", ops.AVG: "avg", ops.MAX: "max", ops.MIN: "min", ops.PRODUCT: "product"})
    return _REDUCTIONS.get(red_op)
