"""Two pass pipelines side by side on the executables of a training step (issue 8's "our passes' effect").

For each workload of ``bench_perf.py`` (GPT-2-style model and tiny llama, 4x128
tokens) the step is compiled once per pipeline, in one process, with the same
random weights; the XLA executables it ran (forward and backward, or the one
inference graph) are then timed on the inputs they were given, alternating
between the pipelines call by call so machine noise hits both alike. The table
gives the median and best wall time per graph and the ratio B / A.

    python benchmarks/bench_pass_ab.py [--a PIPELINE] [--b PIPELINE] [--rounds 25]
        [--workloads gpt2:train,llama:train] [--out benchmarks/results/pass_ab]

The default compares the default profile with and without ``dot-layout``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def without(name: str, profile: str = "default") -> str:
    """``profile``'s pipeline with the pass ``name`` taken out: the baseline for that pass's effect."""
    from neuron_compile.passes.pipeline import Pipeline, parse_pipeline

    return Pipeline(tuple(p for p in parse_pipeline(profile).passes if p.name != name)).spec


def executables(workload: str, mode: str, passes: str) -> list:
    """(XLA executable, input buffers) of every graph call one step makes, compiled with ``passes``."""
    import torch
    import torch._dynamo

    from bench_perf import build, recorded_calls, xla_buffers

    torch._dynamo.reset()
    model, inputs = build(workload)
    fn = torch.compile(model, backend="neuron", options={"passes": passes, "cache": False})
    with recorded_calls() as calls:
        if mode == "train":
            model.train()
            fn(**inputs, labels=inputs["input_ids"]).loss.backward()
        else:
            model.eval()
            with torch.no_grad():
                fn(**inputs)
    return [(exe.xla, xla_buffers(exe, args)) for exe, args in calls]


def _wall(exe, buffers) -> float:
    start = time.perf_counter()
    for result in exe.run_buffers(buffers):
        result.block_until_ready()
    return time.perf_counter() - start


def compare(workload: str, mode: str, a: str, b: str, rounds: int) -> list[dict]:
    runs = {"a": executables(workload, mode, a), "b": executables(workload, mode, b)}
    if len(runs["a"]) != len(runs["b"]):
        raise RuntimeError(f"{workload}:{mode}: {len(runs['a'])} graphs with A, {len(runs['b'])} with B")
    names = ["inference"] if mode == "infer" else ["forward", "backward"]
    times = {(side, i): [] for side in runs for i in range(len(names))}
    for side in runs:  # one warm-up call each
        for exe, buffers in runs[side]:
            _wall(exe, buffers)
    for _ in range(rounds):
        for side in runs:
            for i, (exe, buffers) in enumerate(runs[side]):
                times[(side, i)].append(_wall(exe, buffers))
    rows = []
    for i, name in enumerate(names):
        ta, tb = times[("a", i)], times[("b", i)]
        rows.append({"workload": f"{workload}:{mode}", "graph": name,
                     "a_median_ms": statistics.median(ta) * 1e3, "b_median_ms": statistics.median(tb) * 1e3,
                     "a_best_ms": min(ta) * 1e3, "b_best_ms": min(tb) * 1e3,
                     "b_over_a": statistics.median(tb) / statistics.median(ta)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default=without("dot-layout"), help="pipeline A (the baseline)")
    parser.add_argument("--b", default="default", help="pipeline B")
    parser.add_argument("--workloads", default="gpt2:train,llama:train")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--out", default=str(HERE / "results" / "pass_ab"))
    args = parser.parse_args(argv)

    from tabulate import tabulate

    from neuron_compile.cli.bench import machine_line
    from neuron_compile.passes import parse_pipeline

    rows = []
    for item in args.workloads.split(","):
        workload, mode = item.split(":")
        rows += compare(workload, mode, args.a, args.b, args.rounds)
        print(rows[-1], file=sys.stderr, flush=True)
    table = tabulate([[r["workload"], r["graph"], f"{r['a_median_ms']:.1f}", f"{r['b_median_ms']:.1f}",
                       f"{r['a_best_ms']:.1f}", f"{r['b_best_ms']:.1f}", f"{r['b_over_a']:.3f}"] for r in rows],
                     headers=["workload", "graph", "A median ms", "B median ms", "A best ms", "B best ms",
                              "B / A (medians)"], tablefmt="github")
    text = (f"# Two pass pipelines on the same step's XLA executables\n\n"
            f"Machine: {machine_line()}. One process; the graphs of both pipelines alternate call by call, "
            f"{args.rounds} rounds.\n"
            f"Rerun: `python benchmarks/bench_pass_ab.py --rounds {args.rounds}`\n\n"
            f"- A: `{parse_pipeline(args.a).spec}`\n- B: `{parse_pipeline(args.b).spec}`\n\n{table}\n")
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
