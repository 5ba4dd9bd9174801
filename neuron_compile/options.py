"""Backend options: ``torch.compile(..., options={...})`` first, environment second.

Every option has one environment variable, so an unchanged script can be
steered from the shell. Unknown option names are an error that lists the
known ones (a typo must not be silently ignored).

| option     | environment variable          | default                 |
|------------|-------------------------------|-------------------------|
| passes     | NEURON_COMPILE_PASSES         | passes.DEFAULT_PIPELINE |
| cache      | NEURON_COMPILE_CACHE (0 = off)| on                      |
| cache_dir  | NEURON_COMPILE_CACHE_DIR      | $XDG_CACHE_HOME/neuron_compile |
| cache_max_bytes | NEURON_COMPILE_CACHE_MAX_BYTES | 2 GiB (least recently used evicted) |
| dump_dir   | NEURON_COMPILE_DUMP_DIR       | off                     |
| fallback   | NEURON_COMPILE_FALLBACK       | "error" (or "eager")    |
| verify     | NEURON_COMPILE_VERIFY (1 = on)| off: verify IR after every pass |
| buckets    | NEURON_COMPILE_BUCKETS        | 128: symbolic sizes padded to multiples of 128; a list "128,512,1024"; 0/off: exact shapes |
| collectives | NEURON_COMPILE_COLLECTIVES   | "compiled": into the executable where they can be (or "eager": on torch.distributed) |
| lowering   | NEURON_COMPILE_LOWERING       | "direct": the device's eager ops written as StableHLO where every op has a rule (or "torch-mlir": always Torch-MLIR) |

TorchNeuron's (torch-neuronx's) own variables are read too where they mean
the same thing (``ALIASES``), ours first when both are set:
``TORCH_NEURONX_NEFF_CACHE_DIR`` (its persistent compile cache) for
``cache_dir``, and ``TORCH_NEURONX_DEBUG_DIR`` (where it writes each graph's
FX graph, StableHLO and executable) for ``dump_dir``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


# our variable -> TorchNeuron's of the same meaning (Neuron 2.33's env-vars reference)
ALIASES = {
    "NEURON_COMPILE_CACHE_DIR": "TORCH_NEURONX_NEFF_CACHE_DIR",
    "NEURON_COMPILE_DUMP_DIR": "TORCH_NEURONX_DEBUG_DIR",
}


def _env(name: str) -> str | None:
    """``name``'s value, else its TorchNeuron alias's (``ALIASES``); empty counts as unset."""
    value = os.environ.get(name)
    if not value and name in ALIASES:
        value = os.environ.get(ALIASES[name])
    return value or None


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


DEFAULT_CACHE_MAX_BYTES = 2 << 30


def _env_bytes(name: str, default: int) -> int:
    value = (os.environ.get(name) or "").strip()
    if not value:
        return default
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    scale = units.get(value[-1].lower(), 1)
    try:
        return int(float(value[:-1] if scale != 1 else value) * scale)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a size in bytes (e.g. 2000000000, 500M, 2G)") from None


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "neuron_compile")


def parse_buckets(value) -> object:
    """``128`` -> multiples of 128; ``"64,128,512"`` -> those sizes (then multiples of the last); 0/off -> exact."""
    if isinstance(value, (list, tuple)):
        sizes = tuple(sorted(int(v) for v in value))
    elif isinstance(value, int):
        sizes = value
    else:
        text = str(value).strip().lower()
        if text in ("", "0", "off", "none", "false", "exact"):
            return 0
        parts = [p for p in text.replace(" ", "").split(",") if p]
        try:
            sizes = int(parts[0]) if len(parts) == 1 else tuple(sorted(int(p) for p in parts))
        except ValueError:
            raise ValueError(f"option buckets must be an int, a list of ints or 'off', not {value!r}") from None
    if (isinstance(sizes, int) and sizes < 0) or (isinstance(sizes, tuple) and (not sizes or sizes[0] <= 0)):
        raise ValueError(f"option buckets must be positive, not {value!r}")
    return sizes


@dataclass(frozen=True)
class Options:
    passes: str | None = None  # None: the passes package's default pipeline
    cache: bool = True
    cache_dir: str = ""
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    dump_dir: str | None = None
    fallback: str = "error"
    verify: bool = False
    buckets: object = 128  # int multiple, sorted tuple of sizes, or 0 (exact shapes only)
    collectives: str = "compiled"  # or "eager": functional collectives run on torch.distributed
    lowering: str = "direct"  # or "torch-mlir": no direct StableHLO for the device's eager ops

    @classmethod
    def resolve(cls, user: dict | None = None) -> "Options":
        user = dict(user or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(user) - known)
        if unknown:
            raise ValueError(
                f"unknown neuron backend option(s) {unknown}; known options: {sorted(known)}"
            )
        env = {
            "passes": os.environ.get("NEURON_COMPILE_PASSES"),
            "cache": _env_flag("NEURON_COMPILE_CACHE", True),
            "cache_dir": _env("NEURON_COMPILE_CACHE_DIR") or default_cache_dir(),
            "cache_max_bytes": _env_bytes("NEURON_COMPILE_CACHE_MAX_BYTES", DEFAULT_CACHE_MAX_BYTES),
            "dump_dir": _env("NEURON_COMPILE_DUMP_DIR"),
            "fallback": os.environ.get("NEURON_COMPILE_FALLBACK") or "error",
            "verify": _env_flag("NEURON_COMPILE_VERIFY", False),
            "buckets": os.environ.get("NEURON_COMPILE_BUCKETS", "128"),
            "collectives": os.environ.get("NEURON_COMPILE_COLLECTIVES") or "compiled",
            "lowering": os.environ.get("NEURON_COMPILE_LOWERING") or "direct",
        }
        env.update(user)
        env["buckets"] = parse_buckets(env["buckets"])
        if env["fallback"] not in ("error", "eager"):
            raise ValueError(f"option fallback must be 'error' or 'eager', not {env['fallback']!r}")
        if env["collectives"] not in ("compiled", "eager"):
            raise ValueError(f"option collectives must be 'compiled' or 'eager', not {env['collectives']!r}")
        if env["lowering"] not in ("direct", "torch-mlir"):
            raise ValueError(f"option lowering must be 'direct' or 'torch-mlir', not {env['lowering']!r}")
        return cls(**env)
