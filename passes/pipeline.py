"""A pipeline: an ordered list of configured passes, parsed from one string.

    canonicalize,pad-to-multiple{multiple=128},fuse

``parse_pipeline`` also takes a profile name from ``PROFILES`` ("none",
"default", "neuron"). ``Pipeline.spec`` is the canonical text (every option
spelled out), which is what goes into cache keys. ``Pipeline.run`` applies the
passes in order, times each one, and returns one ``PassStat`` per pass for the
compile report. With ``verify_each=True`` the module is verified after every
pass; a pass that raises or leaves invalid IR becomes a ``PipelineError``
naming the pass and a file holding the IR from before it, with the command
that reproduces the failure.

Profiles (chosen by measurement, see benchmarks/results/passes.md):
- "none": no passes.
- "default": what the XLA CPU executor runs no slower with. On the GPT-2
  benchmark (benchmarks/results/passes.md) padding the LM head's vocab dim
  (free-dims=both, 50257 -> 50304, +0.1% work) made calls 1.6x slower (a
  copy of the padded weight and of the sliced logits every call); padding
  attention's contracting dim 64 -> 128 (2x work there) measured +5-7%, inside
  this shared machine's noise floor (~6%); XLA's CPU dot gains nothing from
  128-multiples. So the default pads only the partition dims, and only where
  it adds at most 25% work (``max-ratio=1.25``): on GPT-2 it pads nothing
  and measured within noise of no passes. It ends with ``dot-layout``, which
  hands the large weight-gradient matmuls to XLA's faster CPU library.
- "neuron": pads every dot_general and convolution to 128 like the hardware
  (128 partitions, 128x128 tensor engine) would, whatever it costs on CPU.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from .pass_registry import PipelineError, format_pass, make_pass, pass_options

PROFILES: dict[str, str] = {
    "none": "",
    "default": "canonicalize,pad-to-multiple{multiple=128,max-ratio=1.25},fuse,dot-layout",
    "neuron": "canonicalize,pad-to-multiple{multiple=128,max-ratio=inf},fuse",
}
DEFAULT_PIPELINE: str = PROFILES["default"]


@dataclass
class PassStat:
    name: str
    options: dict[str, Any]
    fired: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def split_top_level(text: str) -> list[str]:
    """Split on commas outside braces: 'a{x=1,y=2},b' -> ['a{x=1,y=2}', 'b']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced '}}' at column {i} in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise PipelineError(f"unbalanced '{{' in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_pass(text: str):
    """'pad-to-multiple{multiple=128}' -> PadToMultiple(multiple=128, ...)."""
    name, _, rest = text.partition("{")
    name = name.strip()
    options: dict[str, str] = {}
    if rest:
        if not rest.endswith("}"):
            raise PipelineError(f"expected '}}' at the end of {text!r}")
        for item in split_top_level(rest[:-1]):
            if not item:
                continue
            opt, eq, value = item.partition("=")
            if not eq:
                raise PipelineError(f"option {item!r} of pass {name!r} is not 'name=value'")
            options[opt.strip()] = value.strip()
    if not name:
        raise PipelineError(f"empty pass name in {text!r}")
    return make_pass(name, options)


@dataclass(frozen=True)
class Pipeline:
    passes: tuple

    @property
    def spec(self) -> str:
        return ",".join(format_pass(p) for p in self.passes)

    def __str__(self) -> str:
        return self.spec

    def run(self, module: ir.Module, verify_each: bool = False) -> list[PassStat]:
        stats = []
        for p in self.passes:
            before = str(module) if verify_each else None
            start = time.perf_counter()
            try:
                result = p.apply(module)
                if verify_each:
                    module.operation.verify()
            except Exception as e:  # noqa: BLE001 - re-raised with a reproducer
                if not verify_each:
                    raise
                path = save_reproducer(before, p)
                raise PipelineError(
                    f"pass {format_pass(p)!r} failed: {e}\n"
                    f"IR before the pass saved to {path}\n"
                    f"reproduce: python -m neuron_compile.passes --pipeline '{format_pass(p)}' --verify-each {path}"
                ) from e
            seconds = time.perf_counter() - start
            stats.append(PassStat(p.name, pass_options(p), result.fired, seconds, result.details))
        return stats

    def run_on_text(self, mlir_text: str, verify_each: bool = False) -> tuple[str, list[PassStat]]:
        """Parse ``mlir_text`` in a fresh context, run, print."""
        with new_context():
            module = ir.Module.parse(mlir_text)
            stats = self.run(module, verify_each=verify_each)
            return str(module), stats


def new_context() -> "_EnteredContext":
    ctx = ir.Context()
    _stablehlo.register_dialect(ctx)
    return _EnteredContext(ctx)


class _EnteredContext:
    """``with new_context():`` enters both the context and an unknown location."""

    def __init__(self, ctx: ir.Context):
        self.ctx = ctx
        self._loc = None

    def __enter__(self) -> ir.Context:
        self.ctx.__enter__()
        self._loc = ir.Location.unknown()
        self._loc.__enter__()
        return self.ctx

    def __exit__(self, *exc):
        self._loc.__exit__(*exc)
        return self.ctx.__exit__(*exc)


def save_reproducer(text: str, p) -> str:
    fd, path = tempfile.mkstemp(prefix=f"passes-before-{p.name}-", suffix=".mlir")
    with os.fdopen(fd, "w") as f:
        f.write(f"// IR before pass {format_pass(p)}\n")
        f.write(text)
    return path


def parse_pipeline(text: str) -> Pipeline:
    """A pipeline string or a profile name -> Pipeline. '' is the empty pipeline."""
    text = (text or "").strip()
    if text in PROFILES:
        text = PROFILES[text]
    if not text:
        return Pipeline(())
    return Pipeline(tuple(parse_pass(part) for part in split_top_level(text) if part))
