"""Swap a kernel in for a composite, by name.

The fuse pass outlines regions as ``stablehlo.composite "neuron.<kind>"``
whose ``decomposition`` is a private function holding the original ops.
``swap_composites(module, lookup)`` asks ``lookup(site)`` about every
composite; an answer ``(kernel_name, text)`` is a module whose ``@main`` takes
the composite's operands and returns its results, with exactly its types. Its
functions are copied into the module (private, renamed
``kernel.<kernel>_<n>.<function>``) and the composite's ``decomposition``
points at the copy of ``@main``: the composite keeps its name and operands,
and executors that run a composite through its decomposition now run the
kernel. The old decomposition is dropped when nothing else calls it.

The text comes from another MLIR context (JAX's, for kernels written in JAX):
it is parsed here, so only text crosses. ``lookup`` is the caller's (the
kernel registry lives outside ``passes``); a type mismatch is a ``SwapError``
naming the kernel and the composite.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from torch_mlir import ir


class SwapError(ValueError):
    def __init__(self, message: str, *, kernel: str, site: "CompositeSite"):
        super().__init__(message)
        self.kernel = kernel
        self.site = site


@dataclass(frozen=True)
class CompositeSite:
    """What a kernel is told about the composite it may serve."""

    name: str  # "neuron.rms_norm"
    symbol: str  # its decomposition's symbol, "neuron.rms_norm_0": one per composite
    operands: tuple  # ((shape, dtype name), ...) with dtype names as numpy spells them
    results: tuple
    signature: str  # "(tensor<...>, ...) -> (tensor<...>)"
    decomposition: str  # the default decomposition's text


_ELEMENT = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
            "i32": "int32", "i16": "int16", "i8": "int8", "ui8": "uint8", "ui32": "uint32", "ui64": "uint64",
            "i1": "bool"}


def _shape_dtype(t: ir.Type) -> tuple:
    ranked = ir.RankedTensorType(t)
    return tuple(ranked.shape), _ELEMENT.get(str(ranked.element_type), str(ranked.element_type))


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    return {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations
            if op.operation.name == "func.func"}


def swap_composites(module: ir.Module, lookup) -> list[tuple[str, str]]:
    """Replace the decomposition of every composite ``lookup`` serves; ``(symbol, kernel)`` per swap."""
    swaps: list[tuple[str, str]] = []
    with module.context, ir.Location.unknown():
        functions = _functions(module)
        composites = []

        def visit(op):
            if op.name == "stablehlo.composite":
                composites.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        used: dict[str, int] = {}
        for op in composites:
            symbol = ir.FlatSymbolRefAttr(op.attributes["decomposition"]).value
            decomposition = functions.get(symbol)
            in_types = [v.type for v in op.operands]
            out_types = [r.type for r in op.results]
            signature = (f"({', '.join(map(str, in_types))}) -> ({', '.join(map(str, out_types))})")
            site = CompositeSite(ir.StringAttr(op.attributes["name"]).value, symbol,
                                 tuple(_shape_dtype(t) for t in in_types), tuple(_shape_dtype(t) for t in out_types),
                                 signature, decomposition.operation.get_asm(enable_debug_info=False)
                                 if decomposition is not None else "")
            answer = lookup(site)
            if answer is None:
                continue
            kernel, text = answer
            prefix = f"kernel.{re.sub(r'[^A-Za-z0-9_]', '_', kernel)}_{used.setdefault(kernel, len(swaps))}."
            main = _copy_in(module, ir.Module.parse(text), prefix, kernel, site)
            kernel_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            if list(kernel_type.inputs) != in_types or list(kernel_type.results) != out_types:
                got = (f"({', '.join(map(str, kernel_type.inputs))}) -> "
                       f"({', '.join(map(str, kernel_type.results))})")
                raise SwapError(f"kernel {kernel!r} has the signature {got}; the composite {symbol} needs "
                                f"{signature}", kernel=kernel, site=site)
            op.attributes["decomposition"] = ir.FlatSymbolRefAttr.get(ir.StringAttr(main.attributes["sym_name"]).value)
            swaps.append((symbol, kernel))
        _drop_unused(module, {s for s, _ in swaps})
    return swaps


def _copy_in(module: ir.Module, kernel_module: ir.Module, prefix: str, kernel: str, site) -> ir.Operation:
    """Copy the kernel module's functions into ``module``, private and renamed; the copy of @main."""
    functions = [op for op in kernel_module.body.operations if op.operation.name == "func.func"]
    names = {ir.StringAttr(op.attributes["sym_name"]).value for op in functions}
    if "main" not in names:
        raise SwapError(f"kernel {kernel!r}: its module has no @main", kernel=kernel, site=site)

    def visit(op):
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value in names:
            op.attributes["callee"] = ir.FlatSymbolRefAttr.get(prefix + ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        return ir.WalkResult.ADVANCE

    kernel_module.operation.walk(visit)
    main = None
    for op in functions:
        name = ir.StringAttr(op.attributes["sym_name"]).value
        op.attributes["sym_name"] = ir.StringAttr.get(prefix + name)
        op.attributes["sym_visibility"] = ir.StringAttr.get("private")
        for attr in ("arg_attrs", "res_attrs"):  # jax.result_info, layouts: not the composite's
            if attr in op.attributes:
                del op.attributes[attr]
        module.body.append(op.operation)
        if name == "main":
            main = op
    return main


def _drop_unused(module: ir.Module, symbols: set[str]) -> None:
    """Erase the replaced decompositions that no composite or call names any more."""
    text = module.operation.get_asm(enable_debug_info=False)
    for name, op in _functions(module).items():
        if name in symbols and len(re.findall(re.escape(f"@{name}") + r"(?![\w.$-])", text)) == 1:  # its definition
            op.operation.erase()
