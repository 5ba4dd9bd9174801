"""The commands that run a model through the backend: ``demo``, ``dump``, ``compile``, ``explain``.

Each is ``cmd_<name>(args) -> exit code`` over the path a user's
``torch.compile(..., backend="neuron")`` takes, with the spec loaded and the
backend options checked by ``common``:

* ``demo``: the built-in GPT-2-style transformer, inference and AdamW steps,
  neuron beside eager, and the compile report (``--device neuron``: on the
  device, ``demo_device``);
* ``dump``: every stage of every graph into a folder (``dump_index`` lists it);
* ``compile``: ahead of time into the cache, per bucket size, in ``--jobs``
  fresh processes (``python -m neuron_compile compile``) sharing the cache;
* ``explain``: graph breaks, recompiles, ops that don't lower (a graph that
  fails runs eagerly so the rest is still looked at), bucketed dims, cache hits, and which
  registered kernel served each composite and custom op.
"""

from __future__ import annotations

import copy
import json
import logging
import statistics
import sys
import textwrap
import time

from .common import (PROG, CompileFailure, UsageError, _backend_options, _fail_paragraph, _load, _run_spec, _unwrap,
                     emit_json)


# ---- demo ----------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    """GPT-2-style transformer: inference and AdamW steps, neuron beside eager."""
    if args.device == "neuron":
        from .demo_device import cmd_demo_device

        return cmd_demo_device(args)
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
        "steady_train_step_ms": {"neuron": statistics.median(times_mine[1:]) * 1e3 if len(times_mine) > 1 else None,
                                 "eager": statistics.median(times_eager[1:]) * 1e3 if len(times_eager) > 1 else None},
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

    from ..options import Options
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


# ---- explain -------------------------------------------------------------------------------------

def cmd_explain(args) -> int:
    import torch
    import torch._dynamo

    import neuron_compile

    from ..capture.backend import neuron_backend
    from ..options import Options
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
    logger.setLevel(min(logger.getEffectiveLevel(), logging.DEBUG))
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
    kernels = [{"graph": r.graph, **k} for r in reports for k in r.kernels]  # which kernel served which site
    result = {
        "spec": args.spec, "inputs": [c.describe_inputs() for c in calls],
        "graphs": explained.graph_count, "graph_breaks": explained.graph_break_count, "breaks": breaks,
        "ops_per_graph": [len(ops) for ops in explained.ops_per_graph],
        "recompiles": recompiles, "lowering_failures": failures,
        "bucketing": bucketing, "dynamic_dims": dims, "exact_shape_reasons": exact_reasons.messages, "compiled": [r.as_dict()["graph"] for r in reports], "cache": cache,
        "kernels": kernels,
    }
    if args.json:
        emit_json(args, result)
    else:
        _print_explain(result)
    return 1 if failures else 0


class _ExactShapeReasons(logging.Handler):
    """Collects the backend's "compiles per exact shape: <reason>" messages (why a graph was not
    bucketed, or stopped being: a debug line each)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
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
    print(f"\nkernels: {len(r['kernels'])} site(s) served by registered kernels")
    for k in r["kernels"]:
        print(f"  {k['graph']}: {k['kind']} {k['site']} <- kernel {k['kernel']} (from {k['origin']})")
    print("\ncache:")
    for c in r["cache"]:
        print(f"  {c['graph']}: {c['cache']}" + "".join(f"\n    {n}" for n in c["notes"]))
