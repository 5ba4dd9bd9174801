"""``neuron-compile``: the offline command line for the neuron backend.

Every command is a small function ``cmd_<name>(args) -> exit code`` over the
same path the backend takes (``torch.compile(..., backend="neuron")``), so what
the CLI shows is what a user's run does. Conventions, shared by all commands:

* exit 0 on success, 1 when a compile fails (or numbers disagree), 2 on bad
  usage (bad flags, a spec that cannot be loaded, an unknown pass name);
* errors go to stderr as one readable paragraph, never a traceback
  (``NEURON_COMPILE_TRACEBACK=1`` shows one for debugging the CLI itself);
* ``--json`` prints what a machine reads.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import sys
import textwrap
import time

PROG = "neuron-compile"


class UsageError(Exception):
    """Bad usage: exit 2."""


class CompileFailure(Exception):
    """A compile failed or the numbers disagree: exit 1."""


def _fail_paragraph(message: str, limit: int = 1200) -> str:
    """One paragraph: a traceback-like message keeps its last line; long ones are cut."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = [lines[0].split("Traceback")[0].strip(), lines[-1]]
    text = " ".join(line for line in lines if line)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{PROG}: error: {text}"


def emit_json(args, value) -> None:
    """JSON goes to the real stdout; with --json, everything else a model prints goes to stderr."""
    print(json.dumps(value, indent=2, default=str), file=getattr(args, "stdout", None) or sys.stdout)


def _print_err(message: str) -> None:
    print(_fail_paragraph(message), file=sys.stderr)


def _unwrap(exc: BaseException) -> BaseException:
    """Dynamo wraps backend errors in BackendCompilerFailed; the cause is what the user needs."""
    seen = 0
    while seen < 5:
        inner = getattr(exc, "inner_exception", None)
        if inner is None:
            break
        exc, seen = inner, seen + 1
    return exc


# ---- shared helpers ----------------------------------------------------------------------------

def _load(spec: str):
    from .specs import load_spec

    return load_spec(spec)


def _backend_options(args) -> dict:
    """Options for torch.compile(..., backend="neuron"), after checking the pass pipeline."""
    options = {}
    passes = getattr(args, "passes", None)
    if passes is not None:
        _check_pipeline(passes)
        options["passes"] = passes
    elif os.environ.get("NEURON_COMPILE_PASSES"):
        _check_pipeline(os.environ["NEURON_COMPILE_PASSES"])
    return options


def _check_pipeline(spec: str) -> None:
    from ..compiler import resolve_pipeline
    from ..capture.options import Options

    try:
        resolve_pipeline(Options.resolve({"passes": spec}))
    except Exception as exc:  # passes.PipelineError (a ValueError) or anything the parser raises
        raise UsageError(f"the pass pipeline {spec!r} is not valid: {exc}") from None


def _train_step(model, loaded):
    """One forward + backward; a non-scalar output is summed into a loss."""
    out = loaded.call(model)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "loss") and out.loss is not None:
        out = out.loss
    loss = out if out.dim() == 0 else out.float().sum()
    loss.backward()
    return loss.detach()


# ---- demo ----------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    """GPT-2-style transformer: inference and AdamW steps, neuron beside eager."""
    import torch

    import neuron_compile

    from .models import GPTConfig, TinyGPT

    neuron_compile.reset()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(n_layer=args.layers)
    eager = TinyGPT(cfg)
    mine = copy.deepcopy(eager)
    compiled = torch.compile(mine, backend="neuron")
    batch, seq = 4, 32
    if not args.json:
        params = sum(p.numel() for p in eager.parameters())
        print(f"{PROG} demo: GPT-2-style transformer, {cfg.n_layer} layers, {cfg.n_embd} wide, {cfg.n_head} heads, "
              f"vocab {cfg.vocab_size}, {params / 1e3:.0f}k parameters (random weights), batch {batch} x {seq} tokens")

    # inference: logits, neuron beside eager
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    with torch.no_grad():
        want = eager(ids)
        start = time.perf_counter()
        got = compiled(ids)
        infer_first = time.perf_counter() - start
    logits_diff = (got - want).abs().max().item()

    # training: forward + backward compiled, AdamW steps eager on both copies
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=args.lr)
    opt_mine = torch.optim.AdamW(mine.parameters(), lr=args.lr)
    rows, times_eager, times_mine = [], [], []
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))  # one batch, so the loss visibly falls
    for step in range(args.steps):
        losses = []
        for model, opt, times in ((eager, opt_eager, times_eager), (compiled, opt_mine, times_mine)):
            start = time.perf_counter()
            loss = model(ids, labels=ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        rows.append((step, losses[0], losses[1], abs(losses[0] - losses[1])))

    worst = max([logits_diff] + [r[3] for r in rows])
    ok = worst <= args.tol
    reports = neuron_compile.compile_reports()
    summary = {
        "model": {"layers": cfg.n_layer, "width": cfg.n_embd, "heads": cfg.n_head, "vocab": cfg.vocab_size,
                  "batch": batch, "seq": seq},
        "inference_logits_max_abs_diff": logits_diff,
        "inference_first_call_s": infer_first,
        "steps": [{"step": s, "eager_loss": e, "neuron_loss": n, "abs_diff": d} for s, e, n, d in rows],
        "max_abs_diff": worst,
        "tolerance": args.tol,
        "ok": ok,
        "first_train_step_s": times_mine[0] if times_mine else None,
        "steady_train_step_ms": {"neuron": _median(times_mine[1:]) * 1e3 if len(times_mine) > 1 else None,
                                 "eager": _median(times_eager[1:]) * 1e3 if len(times_eager) > 1 else None},
        "compile_reports": [r.as_dict() for r in reports],
    }
    if args.json:
        emit_json(args, summary)
    else:
        from tabulate import tabulate

        print(f"\ninference: max |logits neuron - eager| = {logits_diff:.2e}  (first call, compile included: "
              f"{infer_first:.1f} s)")
        print(f"\ntraining: {args.steps} AdamW steps (lr {args.lr}), forward + backward through the neuron backend\n")
        print(tabulate(rows, headers=["step", "eager loss", "neuron loss", "|diff|"], floatfmt=("d", ".6f", ".6f", ".2e")))
        if len(times_mine) > 1:
            print(f"\nfirst neuron step {times_mine[0]:.1f} s (compiles forward and backward); steady step "
                  f"{summary['steady_train_step_ms']['neuron']:.1f} ms neuron vs "
                  f"{summary['steady_train_step_ms']['eager']:.1f} ms eager")
        print("\ncompile report (per graph and stage):\n")
        print(neuron_compile.format_table(reports))
        verdict = "OK" if ok else "MISMATCH"
        print(f"\n{verdict}: max |neuron - eager| = {worst:.2e} (tolerance {args.tol:g})")
    if not ok:
        print(_fail_paragraph(f"the neuron backend disagrees with eager: max abs difference {worst:.2e} is above "
                              f"the tolerance {args.tol:g}."), file=sys.stderr)
        return 1
    return 0


def _median(values):
    values = sorted(values)
    if not values:
        return float("nan")
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# ---- dump ----------------------------------------------------------------------------------------

_STAGE_FILES = {
    "00-fx-graph.py": "FX graph (readable code)",
    "01-torch.mlir": "Torch-MLIR (torch backend form)",
    "02-stablehlo.mlir": "StableHLO before passes",
    "04-final.mlir": "StableHLO after passes (what XLA compiles)",
    "manifest.json": "artifact manifest",
    "report.json": "compile report",
}


def _describe_file(name: str) -> str:
    if name.startswith("03-pass-"):
        return "StableHLO after pass " + name[len("03-pass-"):-len(".mlir")].split("-", 1)[-1]
    return _STAGE_FILES.get(name, "")


def _file_order(name: str):
    # 03-pass-10-x sorts after 03-pass-9-y
    parts = name.split("-")
    if name.startswith("03-pass-") and len(parts) > 2 and parts[2].isdigit():
        return ("03", int(parts[2]), name)
    return (name[:2], -1, name)


def dump_index(folder, graph_names: list[str]) -> list[dict]:
    """The graph folders this run wrote under ``folder``, in compile order, each with its files."""
    import re
    from pathlib import Path

    folder = Path(folder)
    wanted = {re.sub(r"[^\w.-]", "_", g) for g in graph_names}
    graphs = []
    for sub in folder.iterdir() if folder.is_dir() else []:
        base = re.sub(r"-\d+$", "", sub.name)
        if not sub.is_dir() or base not in wanted:
            continue
        files = sorted((p for p in sub.iterdir() if p.is_file()), key=lambda p: _file_order(p.name))
        first = files[0].stat().st_mtime if files else sub.stat().st_mtime
        graphs.append((first, sub, files))
    graphs.sort(key=lambda g: (g[0], g[1].name))
    return [{"graph": sub.name, "path": str(sub),
             "files": [{"name": f.name, "bytes": f.stat().st_size, "what": _describe_file(f.name)} for f in files]}
            for _, sub, files in graphs]


def _run_spec(compiled, loaded, train: bool):
    import torch

    if train:
        return _train_step(compiled, loaded)
    with torch.no_grad():
        return loaded.call(compiled)


def cmd_dump(args) -> int:
    import shutil
    import tempfile
    from pathlib import Path

    import torch

    import neuron_compile

    from ..dump import process_folder

    options = _backend_options(args)
    loaded = _load(args.spec)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the dump folder {out}: {exc}") from None
    # A fresh cache (and no memory hits) so every stage really runs and is written.
    cache_dir = tempfile.mkdtemp(prefix="neuron-compile-dump-cache-")
    options.update(dump_dir=str(out), cache_dir=cache_dir)
    _forget_memory_cache()
    neuron_compile.reset()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(loaded.model, backend="neuron", options=options)
        _run_spec(compiled, loaded, args.train)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    reports = neuron_compile.compile_reports()
    folder = process_folder(out)
    index = dump_index(folder, [r.graph for r in reports])
    if args.json:
        emit_json(args, {"spec": args.spec, "folder": str(folder), "graphs": index})
        return 0
    mode = "training (forward + backward)" if args.train else "inference"
    print(f"dump of {args.spec}, {mode}: {len(index)} graph(s) in {folder}")
    nodes = {r.graph: r.nodes for r in reports}
    for g in index:
        print(f"\n{g['graph']}/  ({nodes.get(g['graph'].rsplit('-', 1)[0], nodes.get(g['graph'], '?'))} FX nodes)")
        for f in g["files"]:
            print(f"  {f['name']:<44} {f['bytes']:>9,} B  {f['what']}")
    return 0


def _forget_memory_cache() -> None:
    try:
        from ..compiler import MEMORY

        MEMORY.clear()
    except ImportError:
        pass


# ---- compile (ahead of time) ---------------------------------------------------------------------

def _parse_sizes(text: str | None) -> list[int | None]:
    if not text:
        return [None]
    try:
        sizes = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise UsageError(f"--buckets takes comma-separated sizes such as 32,64,128, not {text!r}.") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise UsageError(f"--buckets sizes must be positive integers, not {text!r}.")
    return sizes


def _compile_items(args):
    modes = ["inference"] + (["train"] if args.train else [])
    return [(size, mode) for size in _parse_sizes(args.buckets) for mode in modes]


def _hits_and_compiles(reports) -> tuple[int, int]:
    hits = sum(1 for r in reports if r.cache in ("memory", "disk"))
    return hits, len(reports) - hits


def cmd_compile(args) -> int:
    import torch
    from tqdm import tqdm

    import neuron_compile

    from ..capture.options import Options
    from .specs import resize

    options = _backend_options(args)
    loaded = _load(args.spec)
    items = _compile_items(args)
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1.")
    sizes = [size for size in dict.fromkeys(size for size, _ in items) if size is not None]
    bucketing = "buckets" in Options.__dataclass_fields__
    if sizes and bucketing:
        options["buckets"] = ",".join(str(size) for size in sorted(sizes))
    resolved = Options.resolve(options)
    if args.jobs > 1 and len(items) > 1:
        results = _compile_in_workers(args, items)
    else:
        neuron_compile.reset()
        torch._dynamo.reset()
        limit = len(items) + 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, limit)
        compiled = torch.compile(loaded.model, backend="neuron", options=options, dynamic=False)
        results = []
        bar = tqdm(items, desc=f"compiling {args.spec}", unit="shape", disable=args.json, file=sys.stderr)
        for size, mode in bar:
            one = loaded if size is None else resize(loaded, args.bucket_dim, size)
            if size is not None and bucketing and size > 1:
                _mark_dynamic(one, args.bucket_dim)
            before = len(neuron_compile.compile_reports())
            start = time.perf_counter()
            _run_spec(compiled, one, mode == "train")
            seconds = time.perf_counter() - start
            new = neuron_compile.compile_reports()[before:]
            hits, compiles = _hits_and_compiles(new)
            results.append({"size": size, "mode": mode, "inputs": one.describe_inputs(), "graphs": len(new),
                            "hits": hits, "compiles": compiles, "seconds": round(seconds, 3),
                            "cache": [r.cache or "off" for r in new]})
            bar.set_postfix(hits=sum(r["hits"] for r in results), compiles=sum(r["compiles"] for r in results))
    totals = {"graphs": sum(r["graphs"] for r in results), "hits": sum(r["hits"] for r in results),
              "compiles": sum(r["compiles"] for r in results)}
    how = (f"dimension {args.bucket_dim} symbolic, one executable per bucket ({resolved.buckets})"
           if sizes and bucketing else "exact sizes" if sizes else "the example inputs as given")
    summary = {"spec": args.spec, "cache_dir": resolved.cache_dir if resolved.cache else None,
               "bucketing": how, "items": results, **totals}
    if args.json:
        emit_json(args, summary)
        return 0
    from tabulate import tabulate

    rows = [[r["size"] if r["size"] is not None else "as given", r["mode"], r["inputs"], r["graphs"], r["hits"],
             r["compiles"], f"{r['seconds']:.2f}"] for r in results]
    print(tabulate(rows, headers=["size", "mode", "inputs", "graphs", "cache hits", "new compiles", "seconds"]))
    where = f"cache {resolved.cache_dir}" if resolved.cache else "cache off (NEURON_COMPILE_CACHE=0): nothing kept"
    print(f"\n{totals['graphs']} graph(s): {totals['hits']} cache hit(s), {totals['compiles']} new compile(s); {where}")
    return 0


def _mark_dynamic(loaded, dim: int) -> None:
    """Make ``dim`` of every input that has it symbolic, so the backend buckets it."""
    import torch._dynamo

    for t in list(loaded.args) + list(loaded.kwargs.values()):
        if t.dim() > dim:
            torch._dynamo.mark_dynamic(t, dim)


def _compile_in_workers(args, items) -> list[dict]:
    """Split the sizes over ``--jobs`` fresh processes sharing the disk cache."""
    import subprocess

    from tqdm import tqdm

    sizes = [s for s in dict.fromkeys(size for size, _ in items)]
    groups = [sizes[i::args.jobs] for i in range(args.jobs)]
    procs = []
    for group in (g for g in groups if g):
        cmd = [sys.executable, "-m", "neuron_compile", "compile", args.spec, "--json", "--jobs", "1",
               "--bucket-dim", str(args.bucket_dim)]
        if group != [None]:
            cmd += ["--buckets", ",".join(str(s) for s in group)]
        if args.train:
            cmd.append("--train")
        if args.passes is not None:
            cmd += ["--passes", args.passes]
        procs.append((group, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = []
    with tqdm(total=len(items), desc=f"compiling {args.spec} ({len(procs)} jobs)", unit="shape", disable=args.json,
              file=sys.stderr) as bar:
        for group, proc in procs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise CompileFailure(f"a compile worker for sizes {group} failed (exit {proc.returncode}): "
                                     f"{err.strip().splitlines()[-1] if err.strip() else 'no message'}")
            done = json.loads(out)["items"]
            results += done
            bar.update(len(done))
    order = {item: i for i, item in enumerate(items)}
    return sorted(results, key=lambda r: order.get((r["size"], r["mode"]), 0))


# ---- cache and inspect ---------------------------------------------------------------------------

def _artifact_cache(args):
    try:
        from runtime.cache import ArtifactCache
    except ImportError as exc:
        raise CompileFailure(f"the artifact cache is not available in this build (runtime.cache: {exc}).") from None
    from ..capture.options import Options

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
        from runtime.artifact import ArtifactError, read_artifact, stablehlo_text
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


# ---- explain -------------------------------------------------------------------------------------

def cmd_explain(args) -> int:
    import torch
    import torch._dynamo

    import neuron_compile

    from ..capture.backend import neuron_backend
    from ..capture.options import Options
    from .specs import resize

    options = _backend_options(args)
    loaded = _load(args.spec)

    # 1. graph breaks: what Dynamo captures, and why it stops
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(loaded.model)(*loaded.args, **loaded.kwargs)
    breaks = []
    for reason in explained.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        breaks.append({"reason": " ".join(str(reason.reason).split())[:400],
                       "where": f"{frame.filename}:{frame.lineno} {frame.line or ''}".strip() if frame else None})

    # 2. lowering, graph by graph: a graph that fails runs eagerly so the rest still gets looked at
    torch._dynamo.reset()
    neuron_compile.reset()
    failures = []

    def backend(gm, example_inputs):
        try:
            return neuron_backend(gm, example_inputs, options=options)
        except Exception as exc:  # noqa: BLE001 - recorded and shown
            failures.append(_lowering_failure(exc, len(failures)))
            return gm.forward

    compiled = torch.compile(loaded.model, backend=backend)
    exact_reasons = _ExactShapeReasons()
    logger = logging.getLogger("neuron_compile")
    level = logger.level
    logger.addHandler(exact_reasons)
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    calls = [loaded] + [resize(loaded, args.dim, s) for s in _parse_sizes(args.sizes) if s is not None]
    for one in calls:
        try:
            _run_spec(compiled, one, args.train)
        except Exception as exc:  # a backward graph fails when backward runs
            failures.append(_lowering_failure(exc, len(failures)))
    logger.removeHandler(exact_reasons)
    logger.setLevel(level)
    # 3. recompiles: guard failures Dynamo recorded, per code object
    recompiles = []
    for code, reasons in torch._dynamo.utils.guard_failures.items():
        name = getattr(code, "co_name", str(code))
        for reason in reasons:
            recompiles.append({"function": name, "reason": " ".join(str(reason).split())[:400]})
    reports = neuron_compile.compile_reports()
    # 4. dimensions: a symbolic graph is bucketed ("bucket s0->128") or, when bucketing cannot be
    # proven exact (the reason is logged by the backend), specialized per exact shape
    dims = [{"graph": r.graph, "bucketed": r.signature.startswith("bucket "),
             "specialized_for": r.signature.removeprefix("bucket ")} for r in reports if r.signature]
    resolved = Options.resolve(options)
    buckets = getattr(resolved, "buckets", None)
    if buckets is None:
        bucketing = "no bucketing yet: every concrete shape is compiled exactly (symbolic graphs are specialized)"
    elif not buckets:
        bucketing = "bucketing off (buckets=0): every concrete shape is compiled exactly"
    else:
        bucketing = f"buckets={buckets}: symbolic sizes are padded to buckets where the analysis proves it exact"
    cache = [{"graph": r.graph, "cache": r.cache or "off", "notes": list(r.notes)} for r in reports]
    result = {
        "spec": args.spec, "inputs": [c.describe_inputs() for c in calls],
        "graphs": explained.graph_count, "graph_breaks": explained.graph_break_count, "breaks": breaks,
        "ops_per_graph": [len(ops) for ops in explained.ops_per_graph],
        "recompiles": recompiles, "lowering_failures": failures,
        "bucketing": bucketing, "dynamic_dims": dims, "exact_shape_reasons": exact_reasons.messages, "compiled": [r.as_dict()["graph"] for r in reports], "cache": cache,
    }
    if args.json:
        emit_json(args, result)
    else:
        _print_explain(result)
    return 1 if failures else 0


class _ExactShapeReasons(logging.Handler):
    """Collects the backend's "compiles per exact shape: <reason>" messages (why a graph was not bucketed)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if "per exact shape" in text:
            self.messages.append(text.removeprefix("neuron_compile: "))


def _lowering_failure(exc: BaseException, index: int) -> dict:
    from ..lowering import LoweringError

    inner = _unwrap(exc)
    if isinstance(inner, LoweringError):
        return {"op": inner.op, "source": inner.source, "stage": inner.stage, "repro": inner.repro_dir,
                "message": _fail_paragraph(str(inner)).split(": error: ", 1)[1]}
    return {"op": None, "source": None, "stage": None, "repro": None,
            "message": f"{type(inner).__name__}: " + _fail_paragraph(str(inner)).split(": error: ", 1)[1]}


def _print_explain(r: dict) -> None:
    print(f"explain {r['spec']} (inputs: {' | '.join(r['inputs'])})")
    print(f"\nDynamo: {r['graphs']} graph(s), {r['graph_breaks']} graph break(s); ops per graph {r['ops_per_graph']}")
    for b in r["breaks"]:
        print(f"  break: {b['reason']}" + (f"\n         at {b['where']}" if b["where"] else ""))
    print(f"\nrecompiles: {len(r['recompiles'])}")
    for c in r["recompiles"]:
        print(f"  {c['function']}: {c['reason']}")
    print(f"\nlowering: {len(r['compiled'])} graph(s) compiled, {len(r['lowering_failures'])} failed")
    for f in r["lowering_failures"]:
        what = f"op {f['op']}" if f["op"] else "a graph"
        print(f"  {what} does not lower" + (f" (from {f['source']})" if f["source"] else ""))
        print(textwrap.indent(textwrap.fill(f["message"][:600], 100), "    "))
    print(f"\ndimensions: {r['bucketing']}")
    for d in r["dynamic_dims"]:
        how = "bucketed" if d["bucketed"] else "specialized per exact shape"
        print(f"  {d['graph']} was symbolic; {how}: {d['specialized_for']}")
    for reason in r["exact_shape_reasons"]:
        print(f"  not bucketed: {reason}")
    print("\ncache:")
    for c in r["cache"]:
        print(f"  {c['graph']}: {c['cache']}" + "".join(f"\n    {n}" for n in c["notes"]))


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


# ---- argument parsing --------------------------------------------------------------------------

def _command(sub, name: str, help: str, example: str, description: str | None = None):
    parser = sub.add_parser(
        name, help=help,
        description=textwrap.dedent(description or help),
        epilog="example:\n  " + example.strip().replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Offline tools for the neuron torch.compile backend: stage dumps, ahead-of-time compiles, "
                    "cache care, compile-time benchmarks.",
        epilog="example:\n  neuron-compile demo\n  neuron-compile dump mlp --out /tmp/dump\n\n"
               "exit codes: 0 success, 1 compile failure, 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(sub, "demo", "train a small GPT-2-style transformer through the neuron backend beside eager",
                 "neuron-compile demo --steps 5",
                 """\
                 Build a small GPT-2-style transformer (random weights, no download), run
                 inference and a few AdamW training steps through torch.compile(backend="neuron")
                 beside eager, print the losses side by side and the per-stage compile report.
                 Exits 1 when neuron and eager disagree beyond --tol.""")
    p.add_argument("--steps", type=int, default=5, help="AdamW steps (default 5)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--tol", type=float, default=1e-3, help="largest allowed |neuron - eager| (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=cmd_demo)

    spec_help = "model: a built-in name, path/to/file.py:factory or package.module:factory (see `neuron-compile specs`)"
    passes_help = "pass pipeline or profile (none, default, neuron), e.g. 'canonicalize,fuse'"

    p = _command(sub, "specs", "list the built-in model specs and the spec syntax", "neuron-compile specs")
    p.set_defaults(run=cmd_specs)

    p = _command(sub, "dump", "write every stage of every graph to a folder and print its index",
                 "neuron-compile dump mlp --out /tmp/dump --passes canonicalize",
                 """\
                 Compile a model with the neuron backend (a fresh cache, so every stage runs) and
                 write, per graph and in order: the FX graph, the Torch-MLIR module, the StableHLO
                 before passes and after each pass, the final StableHLO, the artifact manifest and
                 the compile report, under OUT/pid<process>/<graph>/. The same files are written for
                 any torch.compile(..., backend="neuron") run when NEURON_COMPILE_DUMP_DIR is set.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--out", required=True, help="dump folder")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--train", action="store_true", help="forward + backward (training graphs)")
    p.add_argument("--json", action="store_true", help="print the index as JSON")
    p.set_defaults(run=cmd_dump)

    p = _command(sub, "compile", "compile ahead of time into the cache, reporting hits and new compiles",
                 "neuron-compile compile demo --train --buckets 16,32 --bucket-dim 1 --jobs 2",
                 """\
                 Compile a model's graphs ahead of time into the artifact cache (NEURON_COMPILE_CACHE_DIR)
                 with a progress bar, and report how many graphs were cache hits and how many were
                 compiled. --buckets: dimension --bucket-dim of every input is made symbolic and each
                 listed size becomes a bucket (the backend's buckets option), compiled once; a run
                 with the same buckets then finds every bucket in the cache. A graph the bucketing
                 analysis cannot prove exact is compiled at each listed size exactly.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--buckets", help="comma-separated bucket sizes for dimension --bucket-dim, e.g. 128,256,512")
    p.add_argument("--bucket-dim", type=int, default=0, help="the input dimension --buckets sets (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="compile in N worker processes sharing the cache")
    p.add_argument("--train", action="store_true", help="also compile the training graphs (forward + backward)")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=cmd_compile)

    from .bench import add_bench_parsers

    add_bench_parsers(sub, _command, spec_help, passes_help)

    p = _command(sub, "cache", "show, check and trim the artifact cache",
                 "neuron-compile cache stats\nneuron-compile cache prune --max-bytes 500M",
                 """\
                 stats: size and cumulative counters; ls: one line per artifact; verify: check every
                 artifact's checksum and key (exit 1 if any is broken); clear: remove everything;
                 prune: drop broken entries and evict least recently used artifacts down to --max-bytes.""")
    p.add_argument("action", choices=["stats", "ls", "verify", "clear", "prune"])
    p.add_argument("--cache-dir", help="cache folder (default: NEURON_COMPILE_CACHE_DIR or ~/.cache/neuron_compile)")
    p.add_argument("--max-bytes", help="prune down to this size (500M, 2G...; default: the cache's cap)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_cache)

    p = _command(sub, "inspect", "print an artifact's manifest (or its StableHLO)",
                 "neuron-compile inspect ~/.cache/neuron_compile/artifacts/ab/ab12....ncart\n"
                 "neuron-compile inspect ab12 --stablehlo   # a key prefix from `cache ls`")
    p.add_argument("artifact", help="an artifact file, or a cache key (prefix)")
    p.add_argument("--cache-dir", help="cache folder to look keys up in")
    p.add_argument("--stablehlo", action="store_true", help="print the artifact's StableHLO module")
    p.add_argument("--json", action="store_true", help="print the manifest and sizes as JSON")
    p.set_defaults(run=cmd_inspect)

    p = _command(sub, "explain", "graph breaks, recompiles, ops that don't lower, dims, cache misses",
                 "neuron-compile explain mlp --sizes 4,16",
                 """\
                 Run a model through Dynamo's explain (graph breaks and their causes), then through the
                 neuron backend graph by graph (a graph that does not lower is reported, with its op,
                 source line and reproducer, and run eagerly so the rest is still looked at). --sizes
                 calls again with other sizes of dimension --dim to show recompiles and their causes.
                 Exits 1 when a graph does not lower.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--sizes", help="also call with these sizes of dimension --dim, e.g. 4,16")
    p.add_argument("--dim", type=int, default=0, help="the input dimension --sizes sets (default 0)")
    p.add_argument("--train", action="store_true", help="forward + backward")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_explain)

    p = _command(sub, "repro", "re-run a saved failing lowering pipeline",
                 "neuron-compile repro /tmp/neuron_compile_repro/g0.forward-abc123",
                 """\
                 Re-run the pipeline saved by a LoweringError (the folder its message names) and print the
                 diagnostics. Exits 1 when the failure reproduces, 0 when the pipeline now succeeds.""")
    p.add_argument("dir", help="the reproducer folder (holds input.mlir and pipeline.txt)")
    p.set_defaults(run=cmd_repro)
    return parser


def cmd_specs(args) -> int:
    from .specs import builtin_help

    print("built-in model specs:\n" + builtin_help())
    print("\nyour own: path/to/file.py:factory or package.module:factory, where factory() returns\n"
          "(model, example_inputs), example_inputs a tuple of tensors or a dict of keyword tensors.")
    return 0


def _version() -> str:
    try:
        from .._version import __version__

        return __version__
    except Exception:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code or 0)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    return run(args)


def run(args) -> int:
    from .specs import SpecError

    args.stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr) if getattr(args, "json", False) else contextlib.nullcontext():
            return args.run(args)
    except (UsageError, SpecError) as exc:
        _print_err(str(exc))
        return 2
    except CompileFailure as exc:
        _print_err(str(exc))
        return 1
    except KeyboardInterrupt:
        _print_err("interrupted.")
        return 130
    except Exception as exc:  # a compile failure somewhere in torch.compile
        if os.environ.get("NEURON_COMPILE_TRACEBACK"):
            raise
        inner = _unwrap(exc)
        from ..lowering import LoweringError

        if isinstance(inner, LoweringError):
            _print_err(str(inner))
        else:
            _print_err(f"compile failed with {type(inner).__name__}: {inner}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
