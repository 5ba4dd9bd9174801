"""Dynamo graph breaks in a training step of every architecture of the Hugging Face zoo.

A graph break splits a model into several graphs and, when Dynamo has to
restart a frame, traces it twice: more compile time and a slower step. This
counts, per architecture of ``hf_zoo.py`` (tiny config, random weights), the
graphs Dynamo captures for one training step with labels (forward, loss and
backward) and the reasons of its breaks.

Graph breaks are Dynamo's decision, made before a backend sees a graph; the
``neuron`` backend only adds Dynamo settings when torch.compile looks it up
(``backend.skip_log_once_calls``). So this imports the backend module (with
those settings) and traces with ``backend="eager"``, which compiles nothing:
the whole zoo takes a minute or two. ``--keep-dynamo-defaults`` leaves
Dynamo's defaults, for comparison.

    python benchmarks/graph_breaks.py [--arch gpt2,llama] [--keep-dynamo-defaults] [--out benchmarks/results/graph_breaks.md]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def scan(archs: list[str]) -> list[dict]:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from hf_zoo import build

    torch._dynamo.config.recompile_limit = 64
    rows = []
    for arch in archs:
        torch._dynamo.reset()
        counters.clear()
        row = {"arch": arch}
        try:
            model, kwargs = build(arch)
            model.train()
            torch.compile(model, backend="eager")(**kwargs).loss.backward()
            row["graphs"] = counters["stats"]["unique_graphs"]
            row["breaks"] = {" ".join(reason.split())[:160]: n for reason, n in counters["graph_break"].items()}
        except Exception as exc:  # one architecture failing to trace must not end the scan
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def report(rows: list[dict], defaults: bool) -> str:
    from neuron_compile.cli.bench import machine_line

    setting = "Dynamo's defaults" if defaults else "the Dynamo settings of the `neuron` backend"
    lines = [
        "# Dynamo graph breaks: one training step of each Hugging Face zoo architecture",
        "",
        f"Machine: {machine_line()}. Tiny configs, random weights (benchmarks/hf_zoo.py), one step with labels "
        f"(forward, loss, backward), traced with {setting}.",
        "",
        "| architecture | graphs | graph breaks | reasons |",
        "| --- | ---: | ---: | --- |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['arch']} | - | - | error: {row['error']} |")
            continue
        reasons = "; ".join(f"{n}x {reason}" for reason, n in row["breaks"].items())
        lines.append(f"| {row['arch']} | {row['graphs']} | {sum(row['breaks'].values())} | {reasons} |")
    whole = sum(1 for row in rows if row.get("graphs") == 1)
    lines += ["", f"{whole} of {len(rows)} architectures trace as one graph.", "",
              "Rerun: `python benchmarks/graph_breaks.py" + (" --keep-dynamo-defaults" if defaults else "") + "`", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from hf_zoo import QUICK as ARCHS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", help="comma-separated architectures (default: the quick zoo, hf_zoo.py --quick)")
    ap.add_argument("--keep-dynamo-defaults", action="store_true",
                    help="NEURON_COMPILE_SKIP_LOG_ONCE=0: Dynamo as it is without our backend")
    ap.add_argument("--out", help="also write the markdown report here")
    args = ap.parse_args(argv)
    if args.keep_dynamo_defaults:
        os.environ["NEURON_COMPILE_SKIP_LOG_ONCE"] = "0"
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # transformers' config warnings, one per model
    import transformers  # noqa: F401  (first, as in a user's script, so the backend finds its logger methods)

    import neuron_compile.capture.backend  # noqa: F401  (its Dynamo settings, as when torch.compile looks it up)

    text = report(scan(args.arch.split(",") if args.arch else ARCHS), args.keep_dynamo_defaults)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
