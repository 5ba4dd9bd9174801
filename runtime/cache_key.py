"""Cache keys built from named parts, each printable with its hash, so a miss explains itself.

The pattern of JAX's ``jax/_src/cache_key.py`` and Inductor's
``FxGraphHashDetails``: a key is an ordered set of named parts (the IR, the
input signature, the pass pipeline, tool versions, compile options, the
platform); each part is hashed on its own and the key is the hash of the named
part hashes. Two keys that differ can then say which part differed
(``CacheKey.diff``), and ``describe()`` prints every part with its hash.

This module is generic: it knows nothing of FX. ``toolchain_parts()`` gives the
parts every key shares (the versions of the external tools, the XLA platform
and compile options); ``neuron_compile.graph_keys`` adds the FX-level and
StableHLO-level parts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from dataclasses import dataclass

__all__ = ["CacheKey", "hash_text", "toolchain_parts", "tool_versions"]


def hash_text(value) -> str:
    """Hex SHA-256 of a str, bytes, or any JSON-able value (sorted keys)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(data).hexdigest()


def _preview(value, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class CacheKey:
    """A key: ``parts`` maps a part name to its hash; ``previews`` to a short printable value."""

    kind: str  # "fx" or "stablehlo": keys of different kinds never collide
    parts: tuple[tuple[str, str], ...]
    previews: tuple[tuple[str, str], ...] = ()

    @classmethod
    def build(cls, kind: str, values: dict) -> "CacheKey":
        """``values``: part name -> str/bytes/JSON-able value (hashed here)."""
        parts = tuple((name, hash_text(v)) for name, v in values.items())
        previews = tuple((name, _preview(v) if not isinstance(v, (bytes, bytearray)) else f"<{len(v)} bytes>")
                         for name, v in values.items())
        return cls(kind, parts, previews)

    @functools.cached_property
    def digest(self) -> str:
        return hash_text({"kind": self.kind, "parts": [list(p) for p in self.parts]})

    def part_hashes(self) -> dict[str, str]:
        return dict(self.parts)

    def as_manifest(self) -> dict:
        previews = dict(self.previews)
        return {name: {"hash": h, "value": previews.get(name, "")} for name, h in self.parts}

    def diff(self, other_parts: dict[str, str]) -> list[str]:
        """Names of the parts whose hash differs from ``other_parts`` (missing counts as differing)."""
        mine = self.part_hashes()
        names = list(mine) + [n for n in other_parts if n not in mine]
        return [n for n in names if mine.get(n) != other_parts.get(n)]

    def describe(self) -> str:
        previews = dict(self.previews)
        lines = [f"{self.kind} key {self.digest[:16]}"]
        for name, h in self.parts:
            lines.append(f"  {name:<22} {h[:16]}  {previews.get(name, '')}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.kind}:{self.digest[:16]}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of the external tools that shape an executable."""
    return {name: _version(name) for name in ("torch", "torch-mlir", "jax", "jaxlib")}


def xla_compile_options() -> dict:
    """What XLA is told besides the module: serialized CompileOptions (hashed) and XLA_FLAGS."""
    from .executor import _compile_options

    return {
        "compile_options": hash_text(bytes(_compile_options().SerializeAsString())),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def toolchain_parts() -> dict:
    """The key parts every key shares: tool versions, XLA platform, XLA compile options."""
    from .executor import platform_description

    return {
        "tool_versions": tool_versions(),
        "platform": platform_description(),
        "xla_compile_options": xla_compile_options(),
    }
