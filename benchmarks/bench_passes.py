"""Benchmark of the StableHLO passes on a GPT-2-style model (issue 4).

Builds GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4)) with random
weights (no download), inference on a 4x128 batch, lowers it with make_fx +
torch-mlir's stateless FX importer (parameters as function arguments, as the
backend hands them over), then for each pipeline variant reports what the
passes did (padded matmuls, regions by kind, estimated bytes saved) and the
steady per-call time on the XLA CPU executor. Variants are compiled first and
then timed round-robin, so machine noise hits all of them alike.

    /work/venv/bin/python benchmarks/bench_passes.py [--calls 3] [--rounds 15] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "passes"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from passes import PROFILES, parse_pipeline  # noqa: E402
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


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import jax

    return (
        f"{cpu}, {os.cpu_count()} cores visible, Linux {platform.release()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, jax/jaxlib {jax.__version__}, XLA CPU (PJRT)"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3, help="calls per variant per round (best taken)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", help="also write the markdown table here")
    args = ap.parse_args(argv)

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
        + f"\n{args.rounds} rounds; per round and variant the best of {args.calls} calls; machine: {machine()}\n"
    )
    print(report + detail)
    if args.out:
        Path(args.out).write_text(report + "\n" + detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
