"""First-call and steady per-call time of `neuron` beside `inductor` and eager, in one run.

The model is the GPT-2-style one of shared/NOTES.md: 4 layers, 256 wide, batch
4x128, inference, random weights. Each backend runs in its own fresh process
with empty compile caches (ours and Inductor's), so "first call" is a cold
compile. Prints a table of medians with ratios to Inductor and writes
benchmarks/results/backend.{md,json}.

    python benchmarks/bench_backend.py [--repeat 3] [--calls 20] [--layers 4]
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


def build(layers: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=256, n_head=4, n_positions=128, vocab_size=50257,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (4, 128))
    return model, ids


def worker(backend: str, layers: int, calls: int) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model, ids = build(layers)
    fn = model if backend == "eager" else torch.compile(model, backend=backend)
    with torch.no_grad():
        start = time.perf_counter()
        out = fn(input_ids=ids).logits
        first = time.perf_counter() - start
        ref = model(input_ids=ids).logits
        max_diff = (out - ref).abs().max().item()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn(input_ids=ids)
            times.append(time.perf_counter() - start)
    return {"backend": backend, "first_call_s": first, "per_call_s": statistics.median(times), "max_abs_diff": max_diff}


def run_fresh(backend: str, layers: int, calls: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=os.path.join(tmp, "neuron"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        out = subprocess.run([sys.executable, __file__, "--worker", backend, "--layers", str(layers), "--calls", str(calls)],
                             capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"{backend} worker failed:\n{out.stderr[-4000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per backend (medians are reported)")
    parser.add_argument("--calls", type=int, default=20, help="steady-state calls per process")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--backends", default="neuron,inductor,eager")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(HERE / "results" / "backend"))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.layers, args.calls)))
        return 0

    from tabulate import tabulate

    backends = args.backends.split(",")
    runs = {b: [] for b in backends}
    for _ in range(args.repeat):  # interleave backends so machine noise hits all alike
        for b in backends:
            runs[b].append(run_fresh(b, args.layers, args.calls))
    med = {b: {k: statistics.median(r[k] for r in runs[b]) for k in ("first_call_s", "per_call_s", "max_abs_diff")}
           for b in backends}
    ref = med.get("inductor")
    rows = []
    for b in backends:
        m = med[b]
        rows.append([b, f"{m['first_call_s']:.2f}", f"{m['per_call_s'] * 1e3:.1f}",
                     f"{m['first_call_s'] / ref['first_call_s']:.2f}" if ref and b != "eager" else "-",
                     f"{m['per_call_s'] / ref['per_call_s']:.2f}" if ref else "-",
                     f"{m['max_abs_diff']:.1e}"])
    headers = ["backend", "first call s", "per call ms", "first / inductor", "per call / inductor", "max |diff| vs eager"]
    table = tabulate(rows, headers=headers, tablefmt="github")
    from neuron_compile.cli.bench import machine_line

    machine = machine_line()
    import torch

    text = (f"# neuron vs inductor: GPT-2 style, {args.layers} layers, 256 wide, batch 4x128, inference\n\n"
            f"Machine: {machine}; torch {torch.__version__}. Medians of {args.repeat} fresh processes "
            f"(empty caches), {args.calls} steady calls each.\n"
            f"Rerun: `python benchmarks/bench_backend.py --repeat {args.repeat}`\n\n{table}\n")
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({"machine": machine, "medians": med, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
