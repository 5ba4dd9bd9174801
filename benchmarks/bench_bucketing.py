"""Shape bucketing vs exact-shape compiles vs Inductor (dynamic=True), side by side in one run.

A Hugging Face Llama (transformers' LlamaForCausalLM from a tiny config: 2 layers,
64 wide, random weights; its mask functions index position ids, issue 21) runs inference over N batches
(default 200) of random lengths in [1, 1024], batch 2, the same lengths for
every mode. Each mode runs in its own fresh process with empty caches:

* neuron, bucketed: the length dim is marked dynamic; sizes pad to multiples of 128;
* neuron, exact: same, with options={"buckets": 0} (one compile per distinct length);
* inductor, dynamic=True.

Reports compiles, total time, and time per real token; results in
benchmarks/results/bucketing.{md,json}.

    python benchmarks/bench_bucketing.py [--batches 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {
    "neuron-bucketed": ("neuron", {}),
    "neuron-exact": ("neuron", {"buckets": 0}),
    "inductor-dynamic": ("inductor", None),
}


def lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 1024) for _ in range(n)]


def worker(mode: str, batches: int, seed: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               max_position_embeddings=1024)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    backend, options = MODES[mode]
    if backend == "neuron":
        compiled = torch.compile(model, backend="neuron", options=options)
    else:
        compiled = torch.compile(model, backend="inductor", dynamic=True)
    seq = lengths(batches, seed)
    tokens = 0
    max_diff = 0.0
    start = time.perf_counter()
    with torch.no_grad():
        for i, t in enumerate(seq):
            ids = torch.randint(0, cfg.vocab_size, (2, t))
            if backend == "neuron":
                torch._dynamo.mark_dynamic(ids, 1)
            out = compiled(input_ids=ids).logits
            tokens += ids.numel()
            if i % 25 == 0:  # spot-check against eager
                max_diff = max(max_diff, (out - model(input_ids=ids).logits).abs().max().item())
    total = time.perf_counter() - start
    compiles = None
    if backend == "neuron":
        import neuron_compile

        compiles = neuron_compile.COUNTERS["xla_compiles"]
    else:
        from torch._dynamo.utils import counters

        compiles = counters["stats"]["unique_graphs"]
    return {"mode": mode, "batches": batches, "distinct_lengths": len(set(seq)), "compiles": compiles,
            "total_s": total, "us_per_token": total / tokens * 1e6, "tokens": tokens, "max_abs_diff": max_diff}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(HERE / "results" / "bucketing"))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.batches, args.seed)))
        return 0
    from tabulate import tabulate

    results = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=os.path.join(tmp, "n"), TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "i"))
            out = subprocess.run([sys.executable, __file__, "--worker", mode, "--batches", str(args.batches),
                                  "--seed", str(args.seed)], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ref = next((r for r in results if r["mode"] == "inductor-dynamic"), None)
    rows = [[r["mode"], r["compiles"], f"{r['total_s']:.1f}", f"{r['us_per_token']:.1f}",
             f"{r['total_s'] / ref['total_s']:.2f}" if ref else "-", f"{r['max_abs_diff']:.1e}"] for r in results]
    table = tabulate(rows, headers=["mode", "compiles", "total s", "us / token", "total / inductor", "max |diff| vs eager"],
                     tablefmt="github")
    from neuron_compile.cli.bench import machine_line

    machine = machine_line()
    text = (f"# Shape bucketing: Hugging Face Llama (tiny config), {args.batches} batches of random lengths in [1, 1024], batch 2, inference\n\n"
            f"Machine: {machine}. {results[0]['distinct_lengths']} distinct lengths. Each mode in a fresh process, "
            f"empty caches; total includes every compile.\nRerun: `python benchmarks/bench_bucketing.py --batches {args.batches}`\n\n"
            f"{table}\n")
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
