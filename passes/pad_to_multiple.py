"""`pad-to-multiple{multiple=128,max-ratio=4.0,free-dims=lhs}`: pad matmuls and convolutions.

Trainium lays tensors on 128 SBUF partitions and multiplies on a 128x128
array, so a Neuron-style compiler wants the dims of a matmul that land on
partitions to be multiples of 128. This pass pads them with zeros and slices
the result back, in four layers (as Inductor's pad_mm does):

1. arithmetic (pure): ``padded_length(n, multiple)``, ``padded_shape``;
2. legality: ``dot_general_plan`` / ``convolution_plan`` say which operand
   dims may be padded and to what (static shapes; contracting dims padded on
   both sides alike; the free dims that map to partitions; for convolution
   the input and output feature dims, only when ungrouped), or None;
3. profitability: ``should_pad`` keeps a plan whose padded-to-original work
   ratio is at most ``max-ratio`` (``inf`` pads everything);
4. rewrite: pad operands with ``stablehlo.pad`` (zeros at the high end), run
   the op on padded shapes, ``stablehlo.slice`` the result back.

Which free dims: on the tensor engine the contracting dim and the stationary
operand's free dim sit on the 128 partitions (the latter becomes the output's
partition dim); the moving operand's free dim streams through in tiles of up
to 512 and needs no padding. dot_general puts the lhs free dims first in its
result, so ``free-dims=lhs`` (the default) pads contracting + lhs free dims;
``free-dims=both`` also pads the rhs free dims (a 128x128-tile layout of the
output). Measured on XLA CPU (benchmarks/results/passes.md), padding the rhs
free dim of GPT-2's LM head (50257 -> 50304) costs a copy of the padded
weight and of the sliced logits on every call.

Why it is exact: a zero contracting entry adds ``0*x = 0`` to every sum; a
zero free row or column only produces result entries that the slice drops.

Pads a producer already provides are not repeated: a value padded for two
consumers is padded once (memo per value and target), and an operand that is
``slice(P)`` of a value P known to be zero beyond the slice (a zero pad, or a
padded dot_general of such values) is taken from P directly (P itself, or P
sliced or zero-padded to the target where the two consumers pad different
dims). A chain of
padded matmuls therefore stays padded between them. This reuse assumes finite
values: a padded row times an ``inf`` gives NaN, which the slice would drop
but a reused P carries into the next contraction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from .pass_result import PassResult
from .stablehlo_ops import (
    build_pad,
    build_slice,
    defining_op,
    entry_block,
    ints,
    is_static,
    public_functions,
    shape,
    tensor_type,
    element_type,
    zero_scalar,
)

# ---------------------------------------------------------------- arithmetic


def padded_length(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= n (n >= 0, multiple >= 1)."""
    if multiple < 1 or n < 0:
        raise ValueError(f"padded_length({n}, {multiple})")
    return -(-n // multiple) * multiple


def padded_shape(dims: Sequence[int], pad_dims: Sequence[int], multiple: int) -> tuple[int, ...]:
    """``dims`` with the entries at ``pad_dims`` rounded up to ``multiple``."""
    pad = set(pad_dims)
    return tuple(padded_length(d, multiple) if i in pad else d for i, d in enumerate(dims))


# ---------------------------------------------------------------- legality


@dataclass(frozen=True)
class PadPlan:
    """Padded operand shapes for one op, and the work before/after."""

    kind: str
    lhs_target: tuple[int, ...]
    rhs_target: tuple[int, ...]
    result_shape: tuple[int, ...]
    padded_result: tuple[int, ...]
    work: int
    padded_work: int

    @property
    def ratio(self) -> float:
        return self.padded_work / self.work if self.work else math.inf

    @property
    def changes(self) -> bool:
        return self.padded_result != self.result_shape or self.padded_work != self.work


def _numeric(value: ir.Value) -> bool:
    et = element_type(value)
    return isinstance(et, ir.FloatType) or (
        isinstance(et, ir.IntegerType) and ir.IntegerType(et).width > 1
    )


def dot_general_plan(op, multiple: int, free_dims: str = "lhs") -> Optional[PadPlan]:
    """Pad contracting dims (both sides alike) and the lhs free dims (and the
    rhs free dims with ``free_dims="both"``)."""
    lhs, rhs = op.operands[0], op.operands[1]
    res = op.results[0]
    if not all(is_static(v) and _numeric(v) for v in (lhs, rhs, res)):
        return None
    dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    ls, rs = shape(lhs), shape(rhs)
    lf = [d for d in range(len(ls)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rs)) if d not in rb and d not in rc]
    if any(ls[a] != rs[b] for a, b in zip(lc, rc)) or 0 in ls or 0 in rs:
        return None
    lhs_target = padded_shape(ls, lc + lf, multiple)
    rhs_target = padded_shape(rs, rc + (rf if free_dims == "both" else []), multiple)
    padded_result = tuple(
        [ls[d] for d in lb] + [lhs_target[d] for d in lf] + [rhs_target[d] for d in rf]
    )
    if tuple([ls[d] for d in lb] + [ls[d] for d in lf] + [rs[d] for d in rf]) != shape(res):
        return None  # not the result layout dot_general defines; leave it alone

    def work(l_dims, r_dims):
        return (
            math.prod(l_dims[d] for d in lb)
            * math.prod(l_dims[d] for d in lf)
            * math.prod(l_dims[d] for d in lc)
            * math.prod(r_dims[d] for d in rf)
        )

    return PadPlan(
        "dot_general", lhs_target, rhs_target, shape(res), padded_result,
        work(ls, rs), work(lhs_target, rhs_target),
    )


def convolution_plan(op, multiple: int, free_dims: str = "lhs") -> Optional[PadPlan]:
    """Pad input features (input and kernel alike) and output features."""
    lhs, rhs = op.operands[0], op.operands[1]
    res = op.results[0]
    if len(op.operands) != 2 or not all(is_static(v) and _numeric(v) for v in (lhs, rhs, res)):
        return None
    for attr in ("feature_group_count", "batch_group_count"):
        if attr in op.attributes and ir.IntegerAttr(op.attributes[attr]).value != 1:
            return None  # padding features would move the group boundaries
    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    ls, rs, os_ = shape(lhs), shape(rhs), shape(res)
    lhs_target = padded_shape(ls, [dn.input_feature_dimension], multiple)
    rhs_target = padded_shape(
        rs, [dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension], multiple
    )
    padded_result = padded_shape(os_, [dn.output_feature_dimension], multiple)

    def work(in_f, out_f):
        spatial = math.prod(os_[d] for d in dn.output_spatial_dimensions)
        window = math.prod(rs[d] for d in dn.kernel_spatial_dimensions)
        return os_[dn.output_batch_dimension] * spatial * window * in_f * out_f

    return PadPlan(
        "convolution", lhs_target, rhs_target, os_, padded_result,
        work(ls[dn.input_feature_dimension], os_[dn.output_feature_dimension]),
        work(lhs_target[dn.input_feature_dimension], padded_result[dn.output_feature_dimension]),
    )


PLANNERS = {
    "stablehlo.dot_general": dot_general_plan,
    "stablehlo.convolution": convolution_plan,
}

# ---------------------------------------------------------------- profitability


def should_pad(plan: PadPlan, max_ratio: float) -> bool:
    """Worth it when something changes and the extra work stays within max_ratio."""
    return plan.changes and plan.ratio <= max_ratio


# ---------------------------------------------------------------- rewrite


def _is_zero_splat(value: ir.Value) -> bool:
    op = defining_op(value)
    if op is None or op.name not in ("stablehlo.constant", "arith.constant"):
        return False
    attr = op.attributes["value"]
    if not isinstance(attr, ir.DenseElementsAttr) or not ir.DenseElementsAttr(attr).is_splat:
        return False
    splat = ir.DenseElementsAttr(attr).get_splat_value()
    if isinstance(splat, ir.FloatAttr):
        return ir.FloatAttr(splat).value == 0.0
    return isinstance(splat, ir.IntegerAttr) and ir.IntegerAttr(splat).value == 0


def zero_beyond(value: ir.Value, memo: dict) -> tuple[int, ...]:
    """Extents E such that ``value`` is zero at every index outside [0, E).

    E == shape(value) when nothing is known. Known: a zero ``stablehlo.pad``
    at the high end (E = operand shape), and a dot_general whose operands are
    zero beyond their extents in free dims (E from those extents).
    """
    full = shape(value)
    op = defining_op(value)
    if op is None:
        return full
    if value in memo:
        return memo[value]
    extents = full
    if (
        op.name == "stablehlo.pad"
        and _is_zero_splat(op.operands[1])
        and not any(ints(op.attributes["edge_padding_low"]))
        and not any(ints(op.attributes["interior_padding"]))
    ):
        extents = shape(op.operands[0])
    elif op.name == "stablehlo.dot_general" and all(is_static(v) for v in op.operands):
        dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
        le, re_ = zero_beyond(op.operands[0], memo), zero_beyond(op.operands[1], memo)
        ls = shape(op.operands[0])
        extents = tuple(
            [ls[d] for d in lb]
            + [le[d] for d in range(len(ls)) if d not in lb and d not in lc]
            + [re_[d] for d in range(len(re_)) if d not in rb and d not in rc]
        )
    memo[value] = extents
    return extents


class _Rewriter:
    """State of one run over one function: memo of pads, counters."""

    def __init__(self, block: ir.Block):
        self.block = block
        self.pads: dict = {}  # (value, target) -> padded value
        self.zero_memo: dict = {}
        self.reused = 0

    def padded(self, x: ir.Value, target: tuple[int, ...], ip: ir.InsertionPoint) -> ir.Value:
        if shape(x) == target:
            return x
        memo_key = (x, target)
        if memo_key in self.pads:
            self.reused += 1
            return self.pads[memo_key]
        out = self._from_producer(x, target, ip)
        if out is not None:
            self.reused += 1
        else:
            out = build_pad(x, target, ip)
        self.pads[memo_key] = out
        return out

    def _from_producer(self, x, target, ip) -> Optional[ir.Value]:
        """x = P[0:s] with P zero beyond s: take P (or P[0:target]) instead of padding x."""
        op = defining_op(x)
        if op is None or op.name != "stablehlo.slice":
            return None
        if any(ints(op.attributes["start_indices"])) or any(
            s != 1 for s in ints(op.attributes["strides"])
        ):
            return None
        p = op.operands[0]
        s, e, ps = shape(x), zero_beyond(p, self.zero_memo), shape(p)
        if not all(ed <= sd for ed, sd in zip(e, s)):
            return None
        # resize P to target: slice dims where P is larger, zero-pad where smaller
        if any(t < q for t, q in zip(target, ps)):
            p = build_slice(p, [min(t, q) for t, q in zip(target, ps)], ip)
        if shape(p) != target:
            p = build_pad(p, target, ip)
        return p

    def rewrite(self, op, plan: PadPlan) -> None:
        ip = ir.InsertionPoint(op)
        lhs = self.padded(op.operands[0], plan.lhs_target, ip)
        rhs = self.padded(op.operands[1], plan.rhs_target, ip)
        attrs = {a: op.attributes[a] for a in op.attributes}
        new = ir.Operation.create(
            op.name,
            results=[tensor_type(plan.padded_result, element_type(op.results[0]))],
            operands=[lhs, rhs],
            attributes=attrs,
            regions=0,
            loc=op.location,
            ip=ip,
        )
        out = new.result
        if plan.padded_result != plan.result_shape:
            out = build_slice(out, plan.result_shape, ip)
        op.results[0].replace_all_uses_with(out)
        op.erase()


def erase_dead(block: ir.Block, names=("stablehlo.slice", "stablehlo.pad", "stablehlo.constant")) -> int:
    """Erase unused pure ops the rewrite may orphan (repeat until none)."""
    erased = 0
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.operations)):
            if op.name in names and all(not list(r.uses) for r in op.results):
                op.erase()
                erased += 1
                changed = True
    return erased


@dataclass(frozen=True)
class PadToMultiple:
    name = "pad-to-multiple"
    multiple: int = 128
    max_ratio: float = 4.0
    free_dims: str = "lhs"

    def __post_init__(self):
        if self.free_dims not in ("lhs", "both"):
            raise ValueError(f"free-dims must be 'lhs' or 'both', got {self.free_dims!r}")
        if self.multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {self.multiple}")
        if not self.max_ratio >= 1.0:
            raise ValueError(f"max-ratio must be >= 1.0, got {self.max_ratio}")

    def apply(self, module: ir.Module) -> PassResult:
        counts = {"dot_general": 0, "convolution": 0}
        illegal = unprofitable = reused = 0
        work = padded_work = 0
        with module.context, ir.Location.unknown():
            for func in public_functions(module):
                block = entry_block(func)
                rw = _Rewriter(block)
                for op in list(block.operations):
                    planner = PLANNERS.get(op.name)
                    if planner is None:
                        continue
                    plan = planner(op, self.multiple, self.free_dims)
                    if plan is None:
                        illegal += 1
                        continue
                    if not should_pad(plan, self.max_ratio):
                        unprofitable += plan.changes
                        continue
                    rw.rewrite(op, plan)
                    counts[plan.kind] += 1
                    work += plan.work
                    padded_work += plan.padded_work
                reused += rw.reused
                erase_dead(block)
        fired = sum(counts.values())
        return PassResult(
            fired=fired,
            details={
                **counts,
                "illegal": illegal,
                "unprofitable": unprofitable,
                "reused_pads": reused,
                "work_ratio": round(padded_work / work, 4) if work else 1.0,
            },
        )
