"""Benchmark of the StableHLO passes on a GPT-2-style model (issue 4).

Builds GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4)) with random
weights (no download), inference on a 4x128 batch, lowers it with make_fx +
torch-mlir's stateless FX importer (parameters as function arguments, as the
backend hands them over), then for each pipeline variant reports what the
passes did (padded matmuls, regions by kind, estimated bytes saved) and the
steady per-call time on the XLA CPU executor. Variants are compiled first and
then timed round-robin, so machine noise hits all of them alike.

    /work/venv/bin/python benchmarks/bench_passes.py [--calls 3] [--rounds 15] [--out FILE.md]

``--compile-time`` measures instead how long the passes themselves take on the
graphs the backend hands them: for each ``gpt<N>`` of ``--depths`` (the
built-in GPT-2-style model, as in compile_ladder.py) ``neuron-compile dump
--passes none`` saves the StableHLO of every graph (inference, or forward and
backward with ``--train``), then a fresh process per graph parses it and runs
the default pipeline, best of ``--repeat``, per pass. ``--baseline COMMIT``
times that commit's ``passes/`` package (``git archive``) the same way, side
by side; a baseline that crashes or fails on a graph is reported as such.

    /work/venv/bin/python benchmarks/bench_passes.py --compile-time --depths 2,8,32 --train --baseline 96a7fd7
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_compile.cli.bench import machine_line

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "passes"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from neuron_compile.passes import PROFILES, parse_pipeline  # noqa: E402
from pass_models import lower, to_device  # noqa: E402

VARIANTS = {
    "none": PROFILES["none"],
    "no padding": "canonicalize,fuse",
    "default": PROFILES["default"],
    "pad max-ratio=2 (attention K 64->128)": "canonicalize,pad-to-multiple{max-ratio=2.0},fuse",
    "neuron": PROFILES["neuron"],
    "neuron + free-dims=both (vocab 50257->50304)": "canonicalize,pad-to-multiple{max-ratio=inf,free-dims=both},fuse",
}


def gpt2_module(batch: int = 4, seq: int = 128):
    from torch.func import functional_call
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=seq, attn_implementation="eager")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)

    def fn(*args):
        *ws, x, a = args
        out = functional_call(model, dict(zip(names, ws)), (x,), {"attention_mask": a, "use_cache": False})
        return out.logits

    inputs = [v.detach() for v in state.values()] + [ids, mask]
    with torch.no_grad():
        text = lower(fn, *inputs)
        eager = fn(*inputs).numpy()
    return text, [t.numpy() for t in inputs], eager


def compile_xla(text: str):
    from jax._src.lib import xla_client
    from jax.extend.backend import get_backend

    client = get_backend("cpu")
    devices = xla_client.DeviceList(tuple(client.local_devices()[:1]))
    return client.compile_and_load(text, devices, xla_client.CompileOptions())


# ---------------------------------------------------------------- compile time of the passes

# Runs in a fresh process with the passes package under test first on sys.path:
# parse one module per repeat, run the pipeline, report per-pass seconds.
TIME_ONE = r"""
import json, sys, time
from torch_mlir import ir
from neuron_compile.passes import parse_pipeline
from neuron_compile.passes.pipeline import new_context
path, spec, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path).read()
best = None
for _ in range(repeat):
    with new_context():
        module = ir.Module.parse(text)
        ops = 0
        def count(_op):
            global ops
            ops += 1
            return ir.WalkResult.ADVANCE
        module.operation.walk(count)
        start = time.perf_counter()
        stats = parse_pipeline(spec).run(module)
        total = time.perf_counter() - start
        module.operation.verify()
    run = {"ops": ops, "total": total, "passes": {s.name: s.seconds for s in stats},
           "fired": {s.name: s.fired for s in stats}}
    if best is None or run["total"] < best["total"]:
        best = run
print(json.dumps(best))
"""


def dump_graphs(depth: int, train: bool, into: Path) -> dict[str, Path]:
    """StableHLO before passes of every graph of gpt<depth>, as the backend makes it."""
    out = into / f"gpt{depth}{'-train' if train else ''}"
    cmd = [str(Path(sys.executable).with_name("neuron-compile")), "dump", f"gpt{depth}",
           "--passes", "none", "--out", str(out)] + (["--train"] if train else [])
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(into / "cache")}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return {f"gpt{depth} {p.parent.name.split('.')[-1]}": p for p in sorted(out.glob("pid*/*/02-stablehlo.mlir"))}


def time_passes(package_root: Path, path: Path, spec: str, repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", TIME_ONE, str(path), spec, str(repeat)],
                          capture_output=True, text=True, env=env, cwd=package_root)
    if proc.returncode == -11:
        return {"error": "segfault"}
    if proc.returncode != 0:
        errors = [ln.strip() for ln in proc.stderr.splitlines() if "error:" in ln] or ["?"]
        return {"error": "fails: " + errors[-1].split("error:", 1)[-1].strip().replace("|", "/")[:70]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_time(args) -> int:
    depths = [int(d) for d in args.depths.split(",")]
    spec = parse_pipeline(args.pipeline).spec
    with tempfile.TemporaryDirectory(prefix="bench-passes-") as tmp:
        tmp = Path(tmp)
        roots = {"now": ROOT}
        if args.baseline:
            base = tmp / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "passes"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            roots = {args.baseline: base, "now": ROOT}
        graphs: dict[str, Path] = {}
        for depth in depths:
            graphs.update(dump_graphs(depth, args.train, tmp))
            print(f"dumped gpt{depth}", file=sys.stderr)
        results = {label: {g: time_passes(root, p, spec, args.repeat) for g, p in graphs.items()}
                   for label, root in roots.items()}
    names = [p.name for p in parse_pipeline(spec).passes]
    lines = [f"pipeline `{spec}`, best of {args.repeat} per graph, each graph in a fresh process; "
             f"machine: {machine_line()}", "",
             "| graph | ops | " + " | ".join(f"{label}: {n} ms" for label in results for n in names)
             + " | " + " | ".join(f"{label}: total ms" for label in results) + " |",
             "| --- | --- |" + " --- |" * (len(results) * (len(names) + 1))]
    for g in graphs:
        now = results["now"][g]
        cells = []
        for label in results:
            r = results[label][g]
            cells += ["-" if "error" in r else f"{r['passes'][n] * 1e3:.0f}" for n in names]
        totals = [r["error"] if "error" in r else f"{r['total'] * 1e3:.0f}" for r in (results[l][g] for l in results)]
        lines.append(f"| {g} | {now.get('ops', '?')} | " + " | ".join(cells) + " | " + " | ".join(totals) + " |")
    lines.append("")
    for label in results:
        ok = [r for r in results[label].values() if "error" not in r]
        b = fit_exponent([r["ops"] for r in ok], [r["total"] for r in ok])
        lines.append(f"- {label}: total time ~ ops^{b:.2f} over {len(ok)} graphs" if b is not None
                     else f"- {label}: too few graphs to fit")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0


def fit_exponent(xs, ys):
    """b in y = a * x^b, least squares on logs."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3, help="calls per variant per round (best taken)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--compile-time", action="store_true", help="time the passes themselves on gpt<N> graphs")
    ap.add_argument("--depths", default="2,8,32", help="--compile-time: gpt depths")
    ap.add_argument("--train", action="store_true", help="--compile-time: forward and backward graphs")
    ap.add_argument("--repeat", type=int, default=3, help="--compile-time: runs per graph (best taken)")
    ap.add_argument("--pipeline", default="default", help="--compile-time: pipeline or profile")
    ap.add_argument("--baseline", help="--compile-time: also time this commit's passes/")
    args = ap.parse_args(argv)
    if args.compile_time:
        return compile_time(args)

    import jax

    text, inputs, eager = gpt2_module()
    device_inputs = to_device(inputs)
    rows = {}
    for label, spec in VARIANTS.items():
        pipeline = parse_pipeline(spec)
        t0 = time.perf_counter()
        out_text, stats = pipeline.run_on_text(text)
        pass_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        exe = compile_xla(out_text)
        compile_s = time.perf_counter() - t0
        result = exe.execute_sharded(device_inputs).disassemble_into_single_device_arrays()
        err = float(np.abs(np.asarray(result[0][0]) - eager).max())
        by_name = {s.name: s for s in stats}
        pad = by_name.get("pad-to-multiple")
        fuse = by_name.get("fuse")
        rows[label] = {
            "spec": pipeline.spec,
            "exe": exe,
            "pass_s": pass_s,
            "compile_s": compile_s,
            "err": err,
            "padded": pad.fired if pad else 0,
            "work_ratio": pad.details["work_ratio"] if pad else 1.0,
            "regions": fuse.details["regions"] if fuse else {},
            "ops_per_region": fuse.details["ops_per_region"] if fuse else {},
            "bytes_saved": fuse.details["bytes_saved"] if fuse else 0,
            "times": [],
        }
    # Round-robin: each round times every variant back to back (best of
    # --calls), so a slow spell on this shared machine hits all of them; the
    # ratio to "none" is taken within each round (paired), then the median.
    for row in rows.values():
        for _ in range(2):  # warm-up
            jax.block_until_ready(row["exe"].execute_sharded(device_inputs).disassemble_into_single_device_arrays())
        row["ratios"] = []
    for _ in range(args.rounds):
        sample = {}
        for label, row in rows.items():
            best = math.inf
            for _ in range(args.calls):
                t0 = time.perf_counter()
                outs = row["exe"].execute_sharded(device_inputs).disassemble_into_single_device_arrays()
                jax.block_until_ready(outs)
                best = min(best, time.perf_counter() - t0)
            row["times"].append(best)
            sample[label] = best
        for label, row in rows.items():
            row["ratios"].append(sample[label] / sample["none"])

    lines = [
        "| variant | pipeline | padded ops (work ratio) | regions by kind | est. bytes saved | ms/call (median of rounds) | ms/call (min) | vs none (median of paired ratios) | max abs err vs eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in rows.items():
        med = statistics.median(row["times"])
        regions = ", ".join(f"{k} {v}" for k, v in row["regions"].items()) or "-"
        lines.append(
            f"| {label} | `{row['spec'] or '(empty)'}` | {row['padded']} ({row['work_ratio']:.3f}) | {regions} | "
            f"{row['bytes_saved'] / 2**20:.1f} MiB | {med * 1e3:.2f} | {min(row['times']) * 1e3:.2f} | "
            f"{statistics.median(row['ratios']):.3f} | {row['err']:.2e} |"
        )
    report = "\n".join(lines)
    neuron = rows["neuron"]
    detail = (
        f"\nops per region (neuron profile): {neuron['ops_per_region']}\n"
        f"pass time / XLA compile time per variant: "
        + ", ".join(f"{k}: {r['pass_s']:.2f}s/{r['compile_s']:.2f}s" for k, r in rows.items())
        + f"\n{args.rounds} rounds; per round and variant the best of {args.calls} calls; machine: {machine_line()}\n"
    )
    print(report + detail)
    if args.out:
        Path(args.out).write_text(report + "\n" + detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
