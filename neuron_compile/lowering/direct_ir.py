"""The StableHLO writer of ``direct``: values (``V``), ``@main``'s body (``Function``), exact constants.

Ops are written in MLIR's generic syntax (``"stablehlo.add"(%a, %b) : (...) -> ...``),
which needs no knowledge of each op's custom assembly; float constants as their
bit patterns in hex, so inf, NaN and -0.0 are exact.
"""

from __future__ import annotations

import math

import torch

_ELEMENT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
            torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "ui8",
            torch.bool: "i1"}
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


class NoRule(Exception):
    """This node (or its arguments) has no direct rule: the graph goes through Torch-MLIR."""


def _type(shape, dtype) -> str:
    element = _ELEMENT.get(dtype)
    if element is None or any(not isinstance(d, int) for d in shape):
        raise NoRule(f"{dtype} {tuple(shape)}")
    return f"tensor<{'x'.join(map(str, shape))}x{element}>" if shape else f"tensor<{element}>"


def _literal(value, dtype) -> str:
    """``value`` as an element of ``dtype``, converted as torch converts a Python number (a float bit
    pattern in hex, so every value, inf and NaN included, is exact)."""
    if dtype is torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        bits = torch.tensor([float(value)], dtype=torch.float64).to(dtype).view(_BITS[dtype]).item()
        width = torch.finfo(dtype).bits
        return f"0x{bits & ((1 << width) - 1):0{width // 4}X}"
    if isinstance(value, float) and not math.isfinite(value):
        raise NoRule("a non-finite integer constant")
    return str(torch.tensor(value).to(dtype).item())


class V:
    """An SSA value of the function: its name, shape and dtype."""

    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name: str, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    @property
    def type(self) -> str:
        return _type(self.shape, self.dtype)


def _compare_type(dtype) -> str:
    if dtype.is_floating_point:
        return "FLOAT"
    return "UNSIGNED" if dtype in (torch.bool, torch.uint8) else "SIGNED"


class Function:
    """The body of ``@main`` being written."""

    def __init__(self):
        self.lines: list[str] = []
        self.count = 0

    def _name(self) -> str:
        self.count += 1
        return f"%v{self.count}"

    def op(self, name: str, operands, shape, dtype, attrs: str = "") -> V:
        out = V(self._name(), shape, dtype)
        types = ", ".join(o.type for o in operands)
        attr = f" {{{attrs}}}" if attrs else ""
        self.lines.append(f'    {out.name} = "stablehlo.{name}"({", ".join(o.name for o in operands)}){attr} : '
                          f"({types}) -> {out.type}")
        return out

    def const(self, value, dtype, shape=()) -> V:
        out = V(self._name(), (), dtype)
        self.lines.append(f'    {out.name} = "stablehlo.constant"() {{value = dense<{_literal(value, dtype)}> : '
                          f"{out.type}}} : () -> {out.type}")
        return self.broadcast(out, shape)

    def convert(self, v: V, dtype) -> V:
        return v if v.dtype is dtype else self.op("convert", [v], v.shape, dtype)

    def reshape(self, v: V, shape) -> V:
        return v if v.shape == tuple(shape) else self.op("reshape", [v], shape, v.dtype)

    def broadcast(self, v: V, shape) -> V:
        shape = tuple(shape)
        if v.shape == shape:
            return v
        if len(v.shape) > len(shape) or any(a not in (1, b) for a, b in zip(v.shape[::-1], shape[::-1])):
            raise NoRule(f"broadcast {v.shape} -> {shape}")
        dims = range(len(shape) - len(v.shape), len(shape))
        return self.op("broadcast_in_dim", [v], shape, v.dtype, f"broadcast_dimensions = {_array(dims)}")

    def slice(self, v: V, dim: int, start: int, length: int, step: int = 1) -> V:
        """``length`` elements of ``v`` along ``dim`` from ``start``, every ``step``-th."""
        starts, limits, steps, shape = [0] * len(v.shape), list(v.shape), [1] * len(v.shape), list(v.shape)
        starts[dim], limits[dim], steps[dim] = start, start + (length - 1) * step + 1 if length else start, step
        shape[dim] = length
        return self.op("slice", [v], shape, v.dtype, f"start_indices = {_array(starts)}, limit_indices = "
                       f"{_array(limits)}, strides = {_array(steps)}")

    def operand(self, x, dtype, shape) -> V:
        """A tensor (``V``) or a Python number as a value of ``dtype`` at ``shape``."""
        if isinstance(x, V):
            return self.broadcast(self.convert(x, dtype), shape)
        if isinstance(x, (bool, int, float)):
            return self.const(x, dtype, shape)
        raise NoRule(f"operand {type(x).__name__}")

    def compare(self, a: V, b: V, direction: str) -> V:
        attrs = (f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
                 f"compare_type = #stablehlo<comparison_type {_compare_type(a.dtype)}>")
        return self.op("compare", [a, b], a.shape, torch.bool, attrs)

    def reduce(self, v: V, dims, body: str, init, dtype) -> V:
        dims = sorted(set(dims))
        if not dims:
            return self.convert(v, dtype)
        v = self.convert(v, dtype)
        shape = [n for i, n in enumerate(v.shape) if i not in dims]
        return self.region("reduce", [v, self.const(init, dtype)], shape, dtype, body, f"dimensions = {_array(dims)}")

    def region(self, name: str, operands, shape, dtype, body: str | None, attrs: str) -> V:
        """An op whose region combines two elements of ``dtype`` (a reduce's, a scatter's) with the StableHLO
        op ``body``, or keeps the second (``body`` None: a scatter's replacing update)."""
        out = V(self._name(), shape, dtype)
        scalar = _type((), dtype)
        a, b, s = out.name + "a", out.name + "b", out.name + "s"
        inner = [f'      {s} = "stablehlo.{body}"({a}, {b}) : ({scalar}, {scalar}) -> {scalar}'] if body else []
        self.lines += [
            f'    {out.name} = "stablehlo.{name}"({", ".join(o.name for o in operands)}) ({{',
            f"    ^bb0({a}: {scalar}, {b}: {scalar}):", *inner,
            f'      "stablehlo.return"({s if body else b}) : ({scalar}) -> ()',
            f"    }}) {{{attrs}}} : ({', '.join(o.type for o in operands)}) -> {out.type}"]
        return out


def _array(values) -> str:
    text = ", ".join(str(int(v)) for v in values)
    return f"array<i64: {text}>" if text else "array<i64>"
