"""The commands that look after what is compiled: ``cache``, ``inspect``, ``repro``.

* ``cache stats|ls|verify|clear|prune``: the artifact cache (``runtime.cache``)
  in ``--cache-dir`` or the options' folder; ``verify`` exits 1 on a broken entry;
* ``inspect``: an artifact's manifest, or its StableHLO, by file or key prefix;
* ``repro``: re-run the failing pipeline a ``LoweringError`` saved, exit 1 when
  it still fails.
"""

from __future__ import annotations

import sys
import time

from .common import CompileFailure, UsageError, _fail_paragraph, emit_json

# ---- cache and inspect ---------------------------------------------------------------------------

def _artifact_cache(args):
    try:
        from neuron_compile.runtime.cache import ArtifactCache
    except ImportError as exc:
        raise CompileFailure(f"the artifact cache is not available in this build (runtime.cache: {exc}).") from None
    from ..options import Options

    options = Options.resolve()
    path = args.cache_dir or options.cache_dir
    cap = getattr(options, "cache_max_bytes", None)
    return ArtifactCache(path, max_bytes=cap) if cap else ArtifactCache(path)


def _parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(value[-1:], 1)
    try:
        return int(float(value[:-1] if scale != 1 else value) * scale)
    except ValueError:
        raise UsageError(f"--max-bytes takes a size such as 500M or 2G, not {text!r}.") from None


def cmd_cache(args) -> int:
    cache = _artifact_cache(args)
    action = args.action
    if action == "stats":
        stats = cache.stats()
        if args.json:
            emit_json(args, stats)
        else:
            print(f"cache {stats['path']}: {stats['entries']} artifact(s), {stats['bytes']:,} bytes "
                  f"(cap {stats['max_bytes']:,}), {stats['index_entries']} index entries")
            for name, value in sorted(stats.get("totals", {}).items()):
                print(f"  {name:<24} {value:g}" if isinstance(value, float) else f"  {name:<24} {value}")
        return 0
    if action == "ls":
        entries = cache.entries()
        if args.json:
            emit_json(args, entries)
        else:
            from tabulate import tabulate

            rows = [[e["key"][:16], e.get("graph") or "?", f"{e['bytes']:,}",
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["last_used"])), e.get("created") or ""]
                    for e in entries]
            print(tabulate(rows, headers=["key", "graph", "bytes", "last used", "created"]))
            print(f"\n{len(entries)} artifact(s) in {cache.root}")
        return 0
    if action == "verify":
        results = cache.verify()
        bad = [r for r in results if not r[1]]
        if args.json:
            emit_json(args, [{"path": p, "ok": ok, "reason": why} for p, ok, why in results])
        else:
            for path, _ok, why in bad:
                print(f"BROKEN {path}: {why}")
            print(f"{len(results) - len(bad)} of {len(results)} entries ok in {cache.root}")
        if bad:
            print(_fail_paragraph(f"{len(bad)} broken cache entries; `neuron-compile cache prune` removes them."),
                  file=sys.stderr)
            return 1
        return 0
    if action == "clear":
        removed = cache.clear()
        if args.json:
            emit_json(args, {"removed": removed})
        else:
            print(f"removed {removed} artifact(s) from {cache.root}")
        return 0
    if action == "prune":
        removed = cache.prune(max_bytes=_parse_bytes(args.max_bytes))
        if args.json:
            emit_json(args, {"removed": removed, "bytes_left": cache.stats()["bytes"]})
        else:
            print(f"removed {removed} artifact(s) from {cache.root}; {cache.stats()['bytes']:,} bytes left")
        return 0
    raise UsageError(f"unknown cache action {action!r}")


def cmd_inspect(args) -> int:
    from pathlib import Path

    try:
        from neuron_compile.runtime.artifact import ArtifactError, read_artifact, stablehlo_text
    except ImportError as exc:
        raise CompileFailure(f"the artifact format is not available in this build (runtime.artifact: {exc}).") from None
    path = Path(args.artifact)
    if not path.is_file():
        # a key (or a unique prefix of one) in the cache
        matches = [e for e in _artifact_cache(args).entries() if e["key"].startswith(args.artifact)]
        if len(matches) != 1:
            raise UsageError(f"{args.artifact} is neither an artifact file nor "
                             f"{'a unique' if matches else 'a'} key in the cache.")
        path = Path(matches[0]["path"])
    try:
        artifact = read_artifact(path)
    except (OSError, ArtifactError) as exc:
        raise UsageError(f"{path} is not a readable artifact: {exc}") from None
    info = {"path": str(path), "bytes": path.stat().st_size, "stablehlo_bytes": len(artifact.stablehlo),
            "executable_bytes": len(artifact.executable), "manifest": artifact.manifest}
    if args.stablehlo:
        print(stablehlo_text(artifact))
        return 0
    if args.json:
        emit_json(args, info)
        return 0
    m = artifact.manifest
    print(f"artifact {path} ({info['bytes']:,} bytes: StableHLO {info['stablehlo_bytes']:,}, "
          f"executable {info['executable_bytes']:,})")
    for name in ("graph", "kind", "key", "created", "pipeline"):
        if name in m:
            print(f"  {name:<10} {m[name]}")
    for name in ("inputs", "outputs"):
        if name in m:
            shapes = ", ".join(f"{t.get('dtype')}{t.get('shape')}" for t in m[name])
            print(f"  {name:<10} {shapes}")
    for name in ("versions", "stages"):
        if isinstance(m.get(name), dict):
            print(f"  {name:<10} " + ", ".join(f"{k}={v}" for k, v in m[name].items()))
    print("  (--json for the whole manifest, --stablehlo for the module)")
    return 0


# ---- repro ---------------------------------------------------------------------------------------

def cmd_repro(args) -> int:
    from pathlib import Path

    from ..lowering import repro

    folder = Path(args.dir)
    missing = [n for n in ("input.mlir", "pipeline.txt") if not (folder / n).is_file()]
    if missing:
        raise UsageError(f"{folder} is not a reproducer folder (it lacks {', '.join(missing)}); LoweringError "
                         "messages name the folder to pass here.")
    output = repro(folder)
    print(output)
    if output.startswith("pipeline succeeded"):
        return 0
    print(_fail_paragraph(f"the failure reproduces (pipeline {(folder / 'pipeline.txt').read_text().strip()})."),
          file=sys.stderr)
    return 1
