"""Draw docs/profiling_trace.png: a torch.profiler trace of one eager training step on the neuron device.

Profiles a small model's first and second training steps (the first compiles
its ops, the second runs them), exports the Chrome trace, and draws the
second step as a flame chart (one row per nesting depth, time to the right):
the ATen ops in grey, our events (neuron::execute, transfers, index checks...)
in colour beneath them, with the first step's neuron::compile events in an
inset beside. The figure is a summary drawn from the trace file itself: the
same JSON Perfetto or chrome://tracing opens.

    python docs/trace_figure.py [--out docs/profiling_trace.png] [--trace /tmp/neuron_step.json]
"""

from __future__ import annotations

import argparse
import json

import torch

COLOURS = {"neuron::execute": "#2b7bba", "neuron::compile": "#d7301f", "neuron::host_to_device": "#1a9850",
           "neuron::device_to_host": "#66bd63", "neuron::index_check": "#fdae61", "neuron::host_fallback": "#984ea3",
           "neuron::graph": "#7570b3", "neuron::collective": "#e7298a", "neuron::queue_run": "#08306b",
           "neuron::fused_run": "#4eb3d3", "neuron::queued_op": "#9ecae1"}


def _colour(name: str) -> str:
    for prefix, colour in COLOURS.items():
        if name.startswith(prefix):
            return colour
    return "#bdbdbd"


def _step(model, ids, labels, optimizer):
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def profile(trace_path: str) -> list[dict]:
    import os
    import tempfile

    # an empty artifact cache: the first step compiles every op (its neuron::compile events and their stages)
    os.environ["NEURON_COMPILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="neuron-trace-figure-")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 64)).to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids, labels = torch.randint(0, 64, (4, 8)).to("neuron"), torch.randint(0, 64, (4, 8)).to("neuron")
    with torch.profiler.profile(record_shapes=True) as prof:
        with torch.profiler.record_function("step 1 (compiles)"):
            _step(model, ids, labels, optimizer)
        with torch.profiler.record_function("step 2"):
            _step(model, ids, labels, optimizer)
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "kernel"]


def _depths(events: list[dict]) -> list[tuple[dict, int]]:
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    stack, placed = [], []
    for e in events:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        placed.append((e, len(stack)))
        stack.append(e)
    return placed


def draw(events: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    steps = {e["name"]: e for e in events if e["name"].startswith("step ")}
    main_thread = steps["step 2"]["tid"]
    others = sorted({e["tid"] for e in events} - {main_thread}, key=lambda t: -sum(e["tid"] == t for e in events))
    threads = [main_thread] + others[:1]
    fig, axes = plt.subplots(2, 1, figsize=(15, 9.5), gridspec_kw={"height_ratios": [1, 1.1]})
    for ax, label in zip(axes, ("step 1 (compiles)", "step 2")):
        step = steps[label]
        start, end = step["ts"], step["ts"] + step["dur"]
        top, counts, ticks = 0, {"neuron::execute": 0, "neuron::compile": 0}, []
        for thread, title in zip(threads, ("main thread (forward, optimizer)", "autograd engine thread (backward)")):
            inside = [e for e in events if e["tid"] == thread and start <= e["ts"] and e["ts"] + e["dur"] <= end
                      and e is not step]
            placed = [(e, d) for e, d in _depths(inside) if d < 9]  # deeper rows: the op tracer's internals
            for e, depth in placed:
                x, width = (e["ts"] - start) / 1e3, e["dur"] / 1e3
                ax.barh(top - depth, width, left=x, height=0.85, color=_colour(e["name"]), edgecolor="white",
                        linewidth=0.3)
                if width > (end - start) / 1e3 / 40:
                    name = e["name"].replace("aten::", "").replace("neuron::", "n::")
                    ax.text(x + width / 2, top - depth, name, ha="center", va="center", fontsize=6.5, clip_on=True)
                for key in counts:
                    counts[key] += e["name"].startswith(key)
            ticks.append((top, title))
            top -= max((d for _, d in placed), default=0) + 2
        ax.set_xlim(0, (end - start) / 1e3)
        ax.set_ylim(top + 1, 0.6)
        ax.set_yticks([t for t, _ in ticks], [title for _, title in ticks], fontsize=8)
        ax.set_xlabel("ms")
        ax.set_title(f"{label}: {(end - start) / 1e3:.1f} ms, {counts['neuron::execute']} neuron::execute events, "
                     f"{counts['neuron::compile']} neuron::compile events (stages included)", fontsize=10, loc="left")
    legend = [Patch(color=c, label=n) for n, c in COLOURS.items() if n not in ("neuron::graph", "neuron::collective")]
    legend.append(Patch(color="#bdbdbd", label="aten:: ops (the dispatcher's events)"))
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("torch.profiler on the neuron device: an eager training step (embedding, linear, GELU, "
                 "cross-entropy, SGD), drawn from the exported Chrome trace", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/profiling_trace.png")
    parser.add_argument("--trace", default="/tmp/neuron_step.json")
    args = parser.parse_args()
    draw(profile(args.trace), args.out)
    print(f"wrote {args.out} from {args.trace}")


if __name__ == "__main__":
    main()
