"""`dot-layout{min-work=4194304}`: give XLA's CPU library the matmuls it is fast at.

A weight gradient is ``dW = X^T . dY``: a ``dot_general`` contracting dim 0 of
both operands (``[K,M] x [K,N] -> [M,N]``, "transposed lhs"), or a plain one
on ``transpose(X)``, which is what ``mm(x.t(), dy)`` lowers to. XLA's CPU
backend (jaxlib 0.10.2) folds any transpose we put in front of such a dot back
into it (``TransposeFolding``, because Eigen can read a transposed operand),
and YNNPACK, its fast matmul library, does not take a transposed lhs, so the
dot runs in Eigen. Measured on this machine (K=512, milliseconds, XLA alone):

    M x N        Eigen (as is)   lhs transposed first   swapped (below)
    256 x 256        0.50              0.45                 0.66
    256 x 512        0.97              0.98                 1.01
    512 x 256        1.19              0.84                 0.87
    1024 x 256       2.53              1.84                 1.69
    8192 x 256      18.12             15.08                13.34   (LM head)
    256 x 8192      11.74             11.20                15.46

Eigen is as fast as YNNPACK while ``M <= N`` and up to 1.4x slower beyond,
so the pass rewrites a rank-2 dot with a transposed lhs when ``M > N`` and the
dot has at least ``min-work`` multiply-adds, in whichever of two exact forms
moves fewer bytes:

* transpose the lhs: ``dot(transpose(X), dY)``, moving ``K*M`` elements;
* swap the operands: ``transpose(dot(transpose(dY), X))``, computing
  ``dW^T = dY^T . X`` as a plain matmul, moving ``K*N + M*N`` (the dY
  transpose is skipped when dY is already ``[N,K]``).

Each new transpose is followed by a ``stablehlo.optimization_barrier``, which
XLA removes only after ``TransposeFolding`` has run, so the transpose stays a
copy and the dot stays plain. The products and sums are the same ones; only
the order of the sums may differ, as between any two matmul kernels (float
rounding, about 1e-6 relative). It fires once per dot rewritten; details
count the two forms.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from .pass_result import PassResult
from .stablehlo_ops import defining_op, element_type, i64_array, ints, is_static, shape, tensor_type


def _barrier(value: ir.Value, loc, ip) -> ir.Value:
    return ir.Operation.create("stablehlo.optimization_barrier", results=[value.type], operands=[value],
                               loc=loc, ip=ip).results[0]


def _transpose(value: ir.Value, loc, ip) -> ir.Value:
    """transpose(value) of a rank-2 value."""
    rows, cols = shape(value)
    return ir.Operation.create("stablehlo.transpose", results=[tensor_type((cols, rows), element_type(value))],
                               operands=[value], attributes={"permutation": i64_array((1, 0))}, loc=loc,
                               ip=ip).results[0]


def _dot(op, lhs: ir.Value, rhs: ir.Value, lhs_contracting: int, rhs_contracting: int, result_type, ip) -> ir.Value:
    """A dot_general like ``op`` (its precision and algorithm attributes) on new operands."""
    attributes = {name: op.attributes[name] for name in op.attributes}
    attributes["dot_dimension_numbers"] = _stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[], rhs_batching_dimensions=[],
        lhs_contracting_dimensions=[lhs_contracting], rhs_contracting_dimensions=[rhs_contracting])
    return ir.Operation.create("stablehlo.dot_general", results=[result_type], operands=[lhs, rhs],
                               attributes=attributes, loc=op.location, ip=ip).results[0]


def _dimension_numbers(op):
    return _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])


def _transposed_lhs(op, dn):
    """The dot's lhs as a ``[K,M]`` value when XLA will see it transposed, else None: either the
    dot contracts its dim 0, or it contracts dim 1 of a ``transpose`` (what ``mm(a.t(), b)``
    lowers to), which XLA folds into the dot."""
    lhs = op.operands[0]
    if list(dn.lhs_batching_dimensions) or len(shape(lhs)) != 2:
        return None
    if list(dn.lhs_contracting_dimensions) == [0]:
        return lhs
    producer = defining_op(lhs)
    if producer is not None and producer.name == "stablehlo.transpose" and ints(producer.attributes["permutation"]) == [1, 0]:
        return producer.operands[0]
    return None


def plan(op, min_work: int):
    """``("transpose-lhs" | "swap", lhs as [K,M])`` or None for one ``stablehlo.dot_general``."""
    rhs, res = op.operands[1], op.results[0]
    if not all(is_static(v) for v in (*op.operands, res)) or not isinstance(element_type(res), ir.FloatType):
        return None
    dn = _dimension_numbers(op)
    src = _transposed_lhs(op, dn)
    if src is None or len(shape(rhs)) != 2:
        return None
    (k, m), rc = shape(src), dn.rhs_contracting_dimensions[0]
    n = shape(rhs)[1 - rc]
    if m <= n or k * m * n < min_work:
        return None
    swap_moves = (k * n if rc == 0 else 0) + m * n
    return ("swap" if swap_moves < k * m else "transpose-lhs"), src


@dataclass(frozen=True)
class DotLayout:
    name = "dot-layout"
    min_work: int = 1 << 22

    def __post_init__(self):
        if self.min_work < 0:
            raise ValueError(f"min-work must be at least 0, got {self.min_work}")

    def apply(self, module: ir.Module) -> PassResult:
        found = []

        def visit(op):
            if op.name == "stablehlo.dot_general":
                planned = plan(op, self.min_work)
                if planned:
                    found.append((op, *planned))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        counts = {"transpose-lhs": 0, "swap": 0}
        for op, form, src in found:
            lhs, rhs, res = op.operands[0], op.operands[1], op.results[0]
            rc = _dimension_numbers(op).rhs_contracting_dimensions[0]
            ip, loc = ir.InsertionPoint(op), op.location
            with loc:
                if form == "transpose-lhs":
                    new = _dot(op, _barrier(_transpose(src, loc, ip), loc, ip), rhs, 1, rc, res.type, ip)
                else:  # dW^T = dY^T . X, then transposed back
                    m, n = shape(res)
                    dy_t = _barrier(_transpose(rhs, loc, ip), loc, ip) if rc == 0 else rhs  # [N,K]
                    product = _dot(op, dy_t, src, 1, 0, tensor_type((n, m), element_type(res)), ip)
                    new = _transpose(_barrier(product, loc, ip), loc, ip)
            res.replace_all_uses_with(new)
            op.erase()
            # the transpose the dot read, now unused (ir.Value compares by value with ==, not `is`)
            if lhs != src and not list(lhs.uses):
                defining_op(lhs).erase()
            counts[form] += 1
        return PassResult(fired=sum(counts.values()), details=counts)
