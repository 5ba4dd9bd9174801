"""`canonicalize`: fold what the importer left behind.

The torch-mlir importer leaves `arith.constant` tensors (alpha/beta of addmm,
the `n` of a mean, epsilons) behind `stablehlo.convert`s that StableHLO's own
folders do not look through, so a linear layer keeps a `multiply %x, 1`.
This pass

1. rewrites each tensor-typed `arith.constant` into the `stablehlo.constant`
   with the same value (same semantics, now visible to StableHLO folders);
2. folds `convert`, `reshape` and `broadcast_in_dim` of a splat constant into
   a splat constant of the result type (the upstream folder that would,
   `stablehlo-aggressive-folder`, is not registered in torch-mlir's build and
   the simplification pass leaves these), as a table of rules;
3. runs the upstream pipeline `func.func(stablehlo-aggressive-simplification),
   canonicalize, cse` (folds `reshape`/`broadcast` of constants, `x*1`,
   `x+0`, merges duplicates).

It fires once per constant rewritten or folded plus once per op removed.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir, passmanager
from torch_mlir._mlir_libs import _stablehlo
from torch_mlir._mlir_libs import _torchMlir  # noqa: F401  (registers upstream passes)

from .pass_result import PassResult

UPSTREAM = "builtin.module(func.func(stablehlo-aggressive-simplification),canonicalize,cse)"


def count_ops(module: ir.Module) -> int:
    n = 0

    def visit(_op):
        nonlocal n
        n += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return n


def arith_constants_to_stablehlo(module: ir.Module) -> int:
    """arith.constant dense<...> : tensor<...>  ->  stablehlo.constant (same value)."""
    found = []

    def visit(op):
        if op.name == "arith.constant" and isinstance(op.results[0].type, ir.RankedTensorType):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        value = op.attributes["value"]
        new = ir.Operation.create(
            "stablehlo.constant",
            results=[op.results[0].type],
            attributes={"value": value},
            loc=op.location,
            ip=ir.InsertionPoint(op),
        )
        op.results[0].replace_all_uses_with(new.result)
        op.erase()
    return len(found)


def _splat(value: ir.Value):
    """The scalar attribute of a splat constant, or None."""
    op = value.owner if isinstance(value, ir.OpResult) else None
    if op is None or op.name != "stablehlo.constant":
        return None
    try:
        attr = op.attributes["value"]
        if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
            return None
        return attr.get_splat_value()
    except TypeError:  # an element type the bindings have no class for (complex): not folded
        return None


def _scalar(attr) -> float | int | None:
    if isinstance(attr, ir.FloatAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    return None


def fold_convert_of_splat(op) -> ir.Attribute | None:
    """convert(splat c : A) -> splat T(c) : B   for int/float A and B.

    int -> float and float -> float round to nearest (what convert does);
    float -> int truncates toward zero and is folded only when exact; int ->
    int only when the value fits the target width.
    """
    c = _scalar(_splat(op.operands[0])) if _splat(op.operands[0]) is not None else None
    if c is None:
        return None
    out_type = op.results[0].type
    et = out_type.element_type
    if isinstance(et, ir.FloatType):
        scalar = ir.FloatAttr.get(et, float(c))
    elif isinstance(et, ir.IntegerType) and et.width > 1:
        if isinstance(c, float) and not c.is_integer():
            return None
        c = int(c)
        lo, hi = (0, 2**et.width - 1) if et.is_unsigned else (-(2 ** (et.width - 1)), 2 ** (et.width - 1) - 1)
        if not lo <= c <= hi:
            return None
        scalar = ir.IntegerAttr.get(et, c)
    else:
        return None
    return ir.DenseElementsAttr.get_splat(out_type, scalar)


def fold_reshape_of_splat(op) -> ir.Attribute | None:
    """reshape(splat c) -> splat c ; broadcast_in_dim(splat c) -> splat c."""
    splat = _splat(op.operands[0])
    if splat is None or not op.results[0].type.has_static_shape:
        return None
    return ir.DenseElementsAttr.get_splat(op.results[0].type, splat)


# (op name, rule): a rule returns the folded constant's value, or None for no match.
FOLD_RULES = {
    "stablehlo.convert": fold_convert_of_splat,
    "stablehlo.reshape": fold_reshape_of_splat,
    "stablehlo.broadcast_in_dim": fold_reshape_of_splat,
}


def fold_constants(module: ir.Module) -> int:
    ops = []

    def visit(op):
        if op.name in FOLD_RULES:
            ops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    folded = 0
    for op in ops:  # walk order is def-before-use, so chains fold in one sweep
        value = FOLD_RULES[op.name](op)
        if value is None:
            continue
        new = ir.Operation.create(
            "stablehlo.constant", results=[value.type], attributes={"value": value},
            loc=op.location, ip=ir.InsertionPoint(op),
        )
        op.results[0].replace_all_uses_with(new.result)
        op.erase()
        folded += 1
    return folded


@dataclass(frozen=True)
class Canonicalize:
    name = "canonicalize"

    def apply(self, module: ir.Module) -> PassResult:
        with module.context, ir.Location.unknown():
            before = count_ops(module)
            rewritten = arith_constants_to_stablehlo(module)
            folded = fold_constants(module)
            _stablehlo.register_stablehlo_passes()
            passmanager.PassManager.parse(UPSTREAM).run(module.operation)
            after = count_ops(module)
        removed = max(0, before - after)
        return PassResult(
            fired=rewritten + folded + removed,
            details={
                "arith_constants": rewritten,
                "folded_constants": folded,
                "ops_removed": removed,
                "ops_after": after,
            },
        )
