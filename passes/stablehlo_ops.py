"""Reading and building StableHLO ops through the generic MLIR Python API.

torch-mlir ships the StableHLO dialect but no generated Python op classes for
it, so passes build ops with ``ir.Operation.create`` and read attributes by
name. This module keeps those spellings in one place: shapes and element
types of values, i64 array attributes, zero scalars, ``stablehlo.pad`` and
``stablehlo.slice``, the public functions of a module, and a stable
topological re-sort of a block (outlining may leave a use above its def).

Ops are compared through ``op.operation`` (the bindings hand out fresh OpView
wrappers; the underlying Operation hashes and compares by identity).
"""
from __future__ import annotations

import heapq
import math
from typing import Iterable, Sequence

from torch_mlir import ir

# Ops that compute each output element from the same-index elements of their
# operands (all operands and the result have one shape).
ELEMENTWISE = frozenset(
    "stablehlo." + n
    for n in (
        "abs add and atan2 cbrt ceil clamp compare convert cosine divide "
        "exponential exponential_minus_one floor is_finite log log_plus_one "
        "logistic maximum minimum multiply negate not or power remainder "
        "round_nearest_afz round_nearest_even rsqrt select sign sine sqrt "
        "subtract tan tanh xor"
    ).split()
)
# Ops that only move or replicate data; cheap to pull into a region.
LAYOUT = frozenset(
    "stablehlo." + n for n in ("broadcast_in_dim reshape transpose".split())
)
CONSTANTS = frozenset(("stablehlo.constant", "arith.constant"))


def key(op) -> ir.Operation:
    """Hashable identity of an op (OpView or Operation)."""
    return op.operation


def shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def element_type(value: ir.Value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type


def is_static(value: ir.Value) -> bool:
    t = value.type
    return isinstance(t, ir.RankedTensorType) and ir.RankedTensorType(t).has_static_shape


def byte_size(value: ir.Value) -> int:
    """Bytes of a statically shaped tensor value (0 if unknown)."""
    if not is_static(value):
        return 0
    t = ir.RankedTensorType(value.type)
    et = t.element_type
    width = getattr(et, "width", None)
    if width is None and isinstance(et, ir.ComplexType):
        width = 2 * ir.FloatType(ir.ComplexType(et).element_type).width
    return math.prod(t.shape) * max(1, (width or 32) // 8)


def tensor_type(dims: Sequence[int], et: ir.Type) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(dims), et)


def i64_array(values: Iterable[int]) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


def ints(attr: ir.Attribute) -> list[int]:
    return [int(v) for v in ir.DenseI64ArrayAttr(attr)]


def defining_op(value: ir.Value):
    """The op producing ``value``, or None for a block argument."""
    return value.owner if isinstance(value, ir.OpResult) else None


def users(value: ir.Value) -> list:
    return [use.owner for use in value.uses]


def zero_scalar(et: ir.Type, ip: ir.InsertionPoint) -> ir.Value:
    """``stablehlo.constant dense<0> : tensor<et>`` at ``ip``."""
    if isinstance(et, ir.IntegerType):
        zero = ir.IntegerAttr.get(et, 0)
    else:
        zero = ir.FloatAttr.get(et, 0.0)
    attr = ir.DenseElementsAttr.get_splat(tensor_type([], et), zero)
    return ir.Operation.create(
        "stablehlo.constant", results=[attr.type], attributes={"value": attr}, ip=ip
    ).result


def build_pad(x: ir.Value, target: Sequence[int], ip: ir.InsertionPoint) -> ir.Value:
    """Zero-pad ``x`` at the high end of every dim up to ``target``."""
    dims = shape(x)
    et = element_type(x)
    zero = zero_scalar(et, ip)
    return ir.Operation.create(
        "stablehlo.pad",
        results=[tensor_type(target, et)],
        operands=[x, zero],
        attributes={
            "edge_padding_low": i64_array([0] * len(dims)),
            "edge_padding_high": i64_array(t - d for t, d in zip(target, dims)),
            "interior_padding": i64_array([0] * len(dims)),
        },
        ip=ip,
    ).result


def build_slice(x: ir.Value, limits: Sequence[int], ip: ir.InsertionPoint) -> ir.Value:
    """``x[0:limits[0], 0:limits[1], ...]``."""
    return ir.Operation.create(
        "stablehlo.slice",
        results=[tensor_type(limits, element_type(x))],
        operands=[x],
        attributes={
            "start_indices": i64_array([0] * len(limits)),
            "limit_indices": i64_array(limits),
            "strides": i64_array([1] * len(limits)),
        },
        ip=ip,
    ).result


def public_functions(module: ir.Module) -> list:
    """The module's non-private func.func ops (the graphs passes rewrite)."""
    out = []
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        vis = op.attributes["sym_visibility"] if "sym_visibility" in op.attributes else None
        if vis is not None and ir.StringAttr(vis).value == "private":
            continue
        out.append(op)
    return out


def entry_block(func) -> ir.Block:
    return func.regions[0].blocks[0]


def sort_block_topologically(block: ir.Block) -> None:
    """Stable topological re-sort of ``block`` (terminator stays last).

    Keeps the original order wherever it is already valid, so an untouched
    block prints unchanged.
    """
    ops = list(block.operations)
    body, terminator = ops[:-1], ops[-1]
    index = {key(op): i for i, op in enumerate(body)}
    deps: dict[int, set[int]] = {i: set() for i in range(len(body))}
    users_of: dict[int, list[int]] = {i: [] for i in range(len(body))}
    for i, op in enumerate(body):
        for producer in _producers(op):
            j = index.get(key(producer))
            if j is not None and j != i:
                deps[i].add(j)
    for i, ds in deps.items():
        for j in ds:
            users_of[j].append(i)
    ready = [i for i, ds in deps.items() if not ds]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users_of[i]:
            deps[u].discard(i)
            if not deps[u]:
                heapq.heappush(ready, u)
    if len(order) != len(body):
        raise RuntimeError("cycle in block while re-sorting after outlining")
    if order == list(range(len(body))):
        return
    for i in order:
        body[i].move_before(terminator)


def _producers(op) -> list:
    """Ops in the same block whose results ``op`` (or its regions) read."""
    out = []
    for v in op.operands:
        p = defining_op(v)
        if p is not None:
            out.append(p)
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                out.extend(_producers(inner))
    return out
