"""Pass names to pass classes, and option text to pass fields.

A pass is a frozen dataclass with a class attribute ``name`` and an
``apply(module) -> PassResult``; its dataclass fields are its options. The
textual form ``pad-to-multiple{multiple=128,max-ratio=4.0}`` parses straight
into ``PadToMultiple(multiple=128, max_ratio=4.0)``: option names with dashes
map to fields with underscores, values convert by the field's type (int,
float, bool, str). ``format_pass`` writes the canonical form back, every
option spelled out in field order, so two spellings of one pipeline give one
cache key.
"""
from __future__ import annotations

import dataclasses
import math
import typing

from .canonicalize import Canonicalize
from .dot_layout import DotLayout
from .fuse import Fuse
from .pad_to_multiple import PadToMultiple

PASSES: dict[str, type] = {cls.name: cls for cls in (Canonicalize, PadToMultiple, Fuse, DotLayout)}


class PipelineError(ValueError):
    """A bad pipeline string, or a pass that broke the module."""


def known_passes() -> str:
    return ", ".join(sorted(PASSES))


def lookup(name: str) -> type:
    try:
        return PASSES[name]
    except KeyError:
        raise PipelineError(f"unknown pass {name!r}; known passes: {known_passes()}") from None


def option_names(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}


def _convert(pass_name: str, option: str, kind: type, text: str):
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        return kind(text)
    except ValueError:
        raise PipelineError(
            f"pass {pass_name!r}: option {option!r} expects {kind.__name__}, got {text!r}"
        ) from None


def make_pass(name: str, options: dict[str, str]):
    """Instantiate pass ``name`` from textual options (``{"max-ratio": "4"}``)."""
    cls = lookup(name)
    fields = option_names(cls)
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for opt, text in options.items():
        field = fields.get(opt)
        if field is None:
            known = ", ".join(fields) or "none"
            raise PipelineError(f"pass {name!r} has no option {opt!r} (options: {known})")
        kwargs[field.name] = _convert(name, opt, hints[field.name], text)
    try:
        return cls(**kwargs)
    except ValueError as e:  # a pass's own __post_init__ range checks
        raise PipelineError(f"pass {name!r}: {e}") from None


def _format_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return repr(v) if isinstance(v, float) else str(v)


def pass_options(p) -> dict:
    return {f.name.replace("_", "-"): getattr(p, f.name) for f in dataclasses.fields(p)}


def format_pass(p) -> str:
    opts = pass_options(p)
    if not opts:
        return p.name
    return p.name + "{" + ",".join(f"{k}={_format_value(v)}" for k, v in opts.items()) + "}"
