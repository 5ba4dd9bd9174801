"""The two cache keys of a graph, as named parts (``runtime.cache_key.CacheKey``).

* ``fx_cache_key``: known before any lowering, so a process that meets a graph
  it has compiled before does no Torch-MLIR lowering and no XLA compile. Parts:
  the planned FX graph in a canonical form (``fx_graph_text``: node names, user
  variable names and stack traces left out, every op, argument, constant and
  value type in), the input signature (shape, stride, dtype of each XLA
  parameter), the pass pipeline spec, the source fingerprint of our own code
  (lowering rules and passes change executables without a version bump), and
  the toolchain parts (tool versions, XLA platform and compile options).
* ``stablehlo_cache_key``: known after lowering, the key artifacts are stored
  under. Parts: the StableHLO printed without debug locations (the same graph
  from two source lines or two processes is one key), the input signature, the
  pipeline spec, our source fingerprint and the toolchain parts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from pathlib import Path

import torch
import torch.fx

from neuron_compile.runtime.cache_key import CacheKey, toolchain_parts

from ._version import __version__


# Modules that cannot change what an FX graph compiles to (the CLI, reports, dumps, the cache's
# bookkeeping): editing them must not invalidate every cached executable. Everything else is in.
_NOT_IN_FINGERPRINT = {
    "neuron_compile/__main__.py", "neuron_compile/cli/__init__.py", "neuron_compile/cli/__main__.py",
    "neuron_compile/cli/entry.py", "neuron_compile/cli/common.py", "neuron_compile/cli/commands.py",
    "neuron_compile/cli/cache_commands.py", "neuron_compile/cli/models.py", "neuron_compile/cli/specs.py",
    "neuron_compile/report.py", "neuron_compile/dump.py", "neuron_compile/options.py", "neuron_compile/runtime/cache.py",
    "neuron_compile/runtime/compile_cache.py",
}


def _our_sources() -> list[tuple[str, Path]]:
    """(name, file) of every source of ours, named as installed: ``neuron_compile/...``, with ``passes/``
    and ``runtime/`` (kept at the repository's top, installed as ``neuron_compile.passes`` and
    ``neuron_compile.runtime``) under ``neuron_compile/`` wherever their folders are."""
    here = Path(__file__).resolve().parent
    roots = {"neuron_compile": [here]}
    for sub in ("passes", "runtime"):
        spec = importlib.util.find_spec(f"neuron_compile.{sub}")
        roots[f"neuron_compile/{sub}"] = [Path(p).resolve() for p in spec.submodule_search_locations]
    found = {}
    for prefix, folders in roots.items():
        for folder in folders:
            for path in folder.rglob("*.py"):
                found[path] = f"{prefix}/{path.relative_to(folder).as_posix()}"
    return sorted((name, path) for path, name in found.items())


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """SHA-256 over the sources of neuron_compile, passes and runtime (like Inductor's torch_key).

    The version number alone is not enough: an edited lowering rule or pass
    changes executables without a version bump.
    """
    digest = hashlib.sha256()
    for name, path in _our_sources():
        if name not in _NOT_IN_FINGERPRINT:
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _value_type(value) -> str:
    if isinstance(value, torch.Tensor):
        # a storage offset is in only when nonzero (as_strided reads it): offset-0 keys stay as they were
        offset = value.storage_offset() if value.layout == torch.strided else 0
        return (f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}s{list(value.stride())}"
                + (f"o{offset}" if offset else ""))
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_type(v) for v in value) + ")"
    return type(value).__name__ if value is not None else "-"


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def _tensor_constant(tensor: torch.Tensor) -> str:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd calls the compiler under its FakeTensorMode: read real constants outside it
    with unset_fake_temporarily():
        data = tensor.detach().cpu().contiguous()
        # reshape(-1) first: a 0-d tensor can't be viewed as bytes ("view Float as Byte")
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return f"tensor<{_value_type(tensor)}>#{hashlib.sha256(raw).hexdigest()[:32]}"


def _arg(value, index: dict) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{index[value]}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_arg(v, index) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}={_arg(v, index)}" for k, v in value.items()) + "}"
    if isinstance(value, torch.Tensor):
        return _tensor_constant(value)
    if isinstance(value, float):
        return repr(value)  # repr is exact for floats
    return repr(value)


def fx_graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph as one line per node: position, op, target, arguments by position, value type.

    Names are replaced by positions, so the same computation traced from other
    source lines, variable names or processes gives the same text; the stack
    traces (node.meta["stack_trace"]) are not part of it. Tensor constants
    (get_attr) are included by content hash.
    """
    index: dict[torch.fx.Node, int] = {}
    lines = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "get_attr":
            value = gm
            for atom in str(node.target).split("."):
                value = getattr(value, atom)
            target = _tensor_constant(value) if isinstance(value, torch.Tensor) else _target_name(type(value))
        elif node.op in ("placeholder", "output"):
            target = ""
        else:
            target = _target_name(node.target)
        args = _arg(node.args, index)
        kwargs = _arg(dict(node.kwargs), index) if node.kwargs else ""
        lines.append(f"{i} {node.op} {target} {args}{kwargs} : {_value_type(node.meta.get('val'))}")
    return "\n".join(lines)


def input_signature(gm: torch.fx.GraphModule) -> list[str]:
    """dtype[shape]s[stride] of each placeholder (after planning: exactly the XLA parameters)."""
    return [_value_type(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]


def output_signature(gm: torch.fx.GraphModule) -> list[str]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [_value_type(v.meta.get("val")) for v in out.args[0]]


def _ours() -> dict:
    return {"version": __version__, "source": source_fingerprint()}


def _kernels(gm: torch.fx.GraphModule | None) -> dict:
    """Registered kernels that may serve this graph: name, version and a digest of their source (the
    custom ops' kernels it calls, and every composite kernel); no part at all when there are none."""
    from .kernels.lowering import kernels_in_graph
    from .kernels.kernel_registry import composite_kernels

    found = {k.fingerprint() for k in composite_kernels()}
    if gm is not None:
        found |= {k.fingerprint() for k in kernels_in_graph(gm).values()}
    return {"kernels": sorted(found)} if found else {}


def fx_cache_key(gm: torch.fx.GraphModule, pipeline_spec: str, lowering: str = "direct",
                 donated: tuple = ()) -> CacheKey:
    from .lowering.functional_collectives import key_parts

    return CacheKey.build("fx", {
        **({"donated": [list(pair) for pair in donated]} if donated else {}),  # (XLA parameter, result) pairs
        "fx_graph": fx_graph_text(gm),
        "input_signature": input_signature(gm),
        "pass_pipeline": pipeline_spec,
        "lowering": lowering,  # the same graph written directly or through Torch-MLIR: two executables
        "neuron_compile": _ours(),
        **toolchain_parts(),
        **_kernels(gm),
        **key_parts(gm),  # a graph with collectives: world size, rank, groups
    })


_LOC = re.compile(r"\s*loc\([^\n]*?\)(?=\s*$)|^#loc.*$", re.MULTILINE)


def strip_debug_locations(text: str) -> str:
    """StableHLO text without ``loc(...)`` annotations or ``#loc`` aliases."""
    return _LOC.sub("", text)


def stablehlo_cache_key(stablehlo_text: str, signature: list[str], pipeline_spec: str,
                        distributed: dict | None = None) -> CacheKey:
    return CacheKey.build("stablehlo", {
        **(distributed or {}),
        "stablehlo": strip_debug_locations(stablehlo_text),
        "input_signature": signature,
        "pass_pipeline": pipeline_spec,
        "neuron_compile": _ours(),
        **toolchain_parts(),
        **_kernels(None),  # a custom op's kernel is in the text already; a composite's is swapped in later
    })
