"""Reading and building StableHLO ops through the generic MLIR Python API.

torch-mlir ships the StableHLO dialect but no generated Python op classes for
it, so passes build ops with ``ir.Operation.create`` and read attributes by
name. This module keeps those spellings in one place: shapes and element
types of values, i64 array attributes, zero scalars, ``stablehlo.pad`` and
``stablehlo.slice``, the public functions of a module, and the values an op's
regions read from outside it.

Identity: key dicts by ``ir.Value`` (hashes and compares by the value's
pointer, stable while the value lives), never by an op. The bindings hash an
``Operation`` by something that changes when its operands are rewired, so an
op put in a dict before a ``replace_all_uses_with`` may not be found after it
(that made ``fuse`` pass a region's own value to its composite, which then
dangled: "using value defined outside the region", and segfaults). Analyses
number a block's ops by position and map each result value to its op's index.

Cost: importing this module registers ``passes.dialect_stubs`` as a dialect
search prefix (see there): without it every StableHLO op handed to Python
costs a failed import (~30 us).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from torch_mlir import ir
from torch_mlir._mlir_libs import _mlir

_STUBS = __name__.rsplit(".", 1)[0] + ".dialect_stubs"
if _STUBS not in _mlir.globals.dialect_search_modules:
    _mlir.globals.append_dialect_search_prefix(_STUBS)

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


def captured_values(op) -> list[ir.Value]:
    """Values read inside ``op``'s regions but defined outside ``op``, in
    first-use order (e.g. a ``stablehlo.while`` body reading a weight).
    Empty for ops without regions and for isolated bodies like a reduce's."""
    if not len(op.regions):
        return []
    inside: set = set()
    out: list = []
    seen: set = set()

    def visit(o) -> None:
        for region in o.regions:
            for block in region.blocks:
                inside.update(block.arguments)
                for nested in block.operations:
                    for v in nested.operands:
                        if v not in inside and v not in seen:
                            seen.add(v)
                            out.append(v)
                    visit(nested)
                    inside.update(nested.results)

    visit(op)
    return out


def nested_ops(op) -> list:
    """Every op inside ``op``'s regions, outer before inner."""
    out = []
    for region in op.regions:
        for block in region.blocks:
            for nested in block.operations:
                out.append(nested)
                out.extend(nested_ops(nested))
    return out
