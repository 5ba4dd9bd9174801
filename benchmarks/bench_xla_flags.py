"""XLA CPU compile options as a lever (issue 8): steady per-call time of our executables under XLA_FLAGS variants.

Each (variant, workload) runs in a fresh process with an empty cache (XLA_FLAGS
is read when the PJRT client starts and is part of our cache key), on the
workloads of ``bench_perf.py``: the GPT-2-style and tiny-llama models, inference
and a full training step (forward, backward, AdamW through eager). Variants
alternate round by round so machine noise hits them alike; the table gives the
median per-call time, its ratio to XLA's defaults, and the largest difference of
the logits (inference) or the loss (training) from eager.

    python benchmarks/bench_xla_flags.py [--rounds 3] [--steps 10] [--out benchmarks/results/xla_flags]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# jaxlib 0.10.2's XLA: XNNPACK is on by default, oneDNN off, fast math off (flags named in libjax_common.so).
VARIANTS = {
    "default": "",
    "no-xnnpack": "--xla_cpu_use_xnnpack=false",
    "onednn": "--xla_cpu_use_onednn=true",
    "fast-math": "--xla_cpu_enable_fast_math=true",
    "no-eigen-threads": "--xla_cpu_multi_thread_eigen=false",
}


def worker(workload: str, mode: str, steps: int) -> dict:
    import torch

    from bench_perf import build

    model, inputs = build(workload)
    fn = torch.compile(model, backend="neuron")
    if mode == "infer":
        model.eval()
        with torch.no_grad():
            diff = (fn(**inputs).logits - model(**inputs).logits).abs().max().item()
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                fn(**inputs)
                times.append(time.perf_counter() - start)
    else:
        model.train()
        reference = model(**inputs, labels=inputs["input_ids"]).loss.item()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times, diff = [], None
        for _ in range(steps + 1):
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = fn(**inputs, labels=inputs["input_ids"]).loss
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
            if diff is None:  # the first step's loss, before any update
                diff = abs(loss.item() - reference)
        times = times[1:]
    return {"per_call_s": statistics.median(times), "max_abs_diff": diff}


def run_fresh(flags: str, workload: str, mode: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=tmp, XLA_FLAGS=flags)
        done = subprocess.run([sys.executable, __file__, "--worker", f"{workload}:{mode}", "--steps", str(steps)],
                              capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1][:200] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workloads", default="gpt2:infer,gpt2:train,llama:infer,llama:train")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(HERE / "results" / "xla_flags"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        workload, mode = args.worker.split(":")
        print(json.dumps(worker(workload, mode, args.steps)))
        return 0

    from tabulate import tabulate

    from neuron_compile.cli.bench import machine_line

    variants = args.variants.split(",")
    runs: dict = {}
    for r in range(args.rounds):
        for item in args.workloads.split(","):
            workload, mode = item.split(":")
            for variant in variants:
                result = run_fresh(VARIANTS[variant], workload, mode, args.steps)
                runs.setdefault((item, variant), []).append(result)
                print(f"round {r} {item} {variant}: {result}", file=sys.stderr, flush=True)
    rows = []
    for item in args.workloads.split(","):
        base = _median(runs[(item, "default")], "per_call_s")
        for variant in variants:
            results = runs[(item, variant)]
            per_call = _median(results, "per_call_s")
            diff = max((r["max_abs_diff"] for r in results if "max_abs_diff" in r), default=None)
            errors = {r["error"] for r in results if "error" in r}
            rows.append([item, variant, VARIANTS[variant] or "(none)",
                         f"{per_call * 1e3:.1f}" if per_call else "-",
                         f"{per_call / base:.2f}" if per_call and base else "-",
                         f"{diff:.1e}" if diff is not None else "-", "; ".join(sorted(errors))[:120]])
    table = tabulate(rows, headers=["workload", "variant", "XLA_FLAGS", "per call ms", "/ default",
                                    "max |diff| vs eager", "error"], tablefmt="github")
    text = (f"# XLA CPU compile options: steady per-call time of the `neuron` backend\n\n"
            f"Machine: {machine_line()}. Fresh process and empty cache per cell, variants alternating, medians "
            f"of {args.rounds} rounds of {args.steps} steady calls/steps.\n"
            f"Rerun: `python benchmarks/bench_xla_flags.py --rounds {args.rounds} --steps {args.steps}`\n\n"
            f"{table}\n")
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({":".join(k): v for k, v in runs.items()}, indent=2))
    return 0


def _median(results: list, field: str):
    values = [r[field] for r in results if field in r]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
