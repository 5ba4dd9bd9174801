"""Performance against eager, Inductor and iree-turbine (`turbine_cpu`), side by side in one run.

Every measurement runs in a fresh process with empty compile caches (ours,
Inductor's), so first calls are cold; "warm" reruns neuron in another fresh
process on the cache the cold run left. ``neuron-precompile`` is neuron with
``NEURON_COMPILE_PRECOMPILE=1``: its warm process loads Dynamo's and
AOTAutograd's saved output too, and traces nothing. ``neuron-device`` is the
model and inputs moved to the ``neuron`` device and ``torch.compile(model)``
with no backend named: executables run on the device's buffers (no copy in or
out), and AdamW's step runs eagerly on the device. Workloads (shared/NOTES.md):

* overhead: 2-layer 64-wide MLP, batch 8, inference: per-call time, and the
  raw XLA execute time of our very executable (buffers made once, results
  materialized): the physical floor.
* gpt2: GPT-2 style, 4 layers, 256 wide, batch 4x128: inference, and a
  training step (forward, backward, AdamW through eager).
* llama: tiny llama, 4 layers, 256 wide, batch 4x128: the same two.

Reports medians over --repeat fresh processes, ratios to Inductor, and peak
memory of the training step against eager's: the process's peak RSS during the
steady steps (VmHWM reset after the first, compiling step) above its RSS once
the model is built. Writes
benchmarks/results/perf.{md,json} and perf.png.

    pip install -e ".[test,bench]"      # iree-turbine comes with the bench extra
    python benchmarks/bench_perf.py [--repeat 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = ["neuron", "neuron-precompile", "neuron-device", "inductor", "turbine_cpu", "eager"]


def build(workload: str):
    import torch

    torch.manual_seed(0)
    if workload == "overhead":
        # the built-in MLP (fc1, ReLU, fc2), 64 wide: a module-level class, which caching
        # precompile can save (it refuses classes defined inside a function)
        from neuron_compile.cli.models import MLP

        return MLP(64, 64, 64), {"x": torch.randn(8, 64)}
    from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    if workload == "gpt2":
        cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=8192,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = AutoConfig.for_model("llama", vocab_size=8192, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=128)
        model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 128))
    return model, {"input_ids": ids}


def _median_call(fn, calls: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return min(times)  # per-call time of the quietest round: noise on a shared machine only adds


def worker(backend: str, workload: str, mode: str, steps: int) -> dict:
    import torch
    import torch._dynamo  # a process import, like torch's (transformers imports it anyway), not a compile cost

    model, inputs = build(workload)
    if backend == "neuron-device":
        # the model and its inputs on the neuron device, compiled by torch.compile's default (no
        # backend named: a graph on neuron tensors goes to ours); AdamW runs eagerly on the device
        model.to("neuron")
        inputs = {name: value.to("neuron") for name, value in inputs.items()}
    rss0 = _rss_mb("VmRSS")
    # the first call counts torch.compile() too: looking the backend up imports AOTAutograd
    # (about 0.2 s, every backend), and a precompiled package loads there
    started = time.perf_counter()
    if backend == "eager":
        fn = model
    elif backend == "neuron-device":
        fn = torch.compile(model)
    else:
        fn = torch.compile(model, backend=backend.split("-")[0])
    compile_s = time.perf_counter() - started
    out: dict = {"backend": backend, "workload": workload, "mode": mode}
    if mode == "infer":
        model.eval()
        with torch.no_grad():
            start = time.perf_counter()
            fn(**inputs)
            out["first_call_s"] = compile_s + time.perf_counter() - start
            calls = 2000 if workload == "overhead" else steps
            out["per_call_s"] = _median_call(lambda: fn(**inputs), calls, rounds=5 if workload == "overhead" else 1)
            if backend == "neuron" and workload == "overhead":
                out["raw_xla_s"] = _raw_xla(fn, model, inputs)
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = fn(**inputs, labels=inputs["input_ids"]).loss
            loss.backward()
            opt.step()
            return loss

        start = time.perf_counter()
        step()
        out["first_call_s"] = compile_s + time.perf_counter() - start
        _reset_peak_rss()  # the steady steps' peak, not the compiler's
        before_steps = _rss_mb("VmRSS")
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        out["per_call_s"] = statistics.median(times)
        out["peak_rss_mb"] = _rss_mb("VmHWM") - rss0
        out["step_peak_mb"] = _rss_mb("VmHWM") - before_steps  # what a steady step itself adds
    return out


def _rss_mb(field: str) -> float:
    """Resident set size from /proc (VmRSS now, VmHWM the peak since the last reset), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS
    except OSError:
        pass


@contextlib.contextmanager
def recorded_calls():
    """Every compiled-graph call made inside the block, as ``(compiler.Executable, its args)``."""
    import neuron_compile.compiler as compiler

    calls, original = [], compiler.Executable.__call__

    def spy(self, args):
        calls.append((self, list(args)))
        return original(self, args)

    compiler.Executable.__call__ = spy
    try:
        yield calls
    finally:
        compiler.Executable.__call__ = original


def xla_buffers(exe, args) -> list:
    """The PJRT buffers a recorded call hands its XLA executable."""
    from neuron_compile.runtime.executor import to_buffer

    return [to_buffer(args[i]) for i in exe.plan.tensor_args]


def _raw_xla(fn, model, inputs) -> float:
    """Execute time of the compiled XLA executable alone: parameters and input already buffers."""
    import torch

    from neuron_compile.runtime.executor import to_tensor

    with recorded_calls() as calls, torch.no_grad():
        fn(**inputs)
    exe, args = calls[-1]
    buffers = xla_buffers(exe, args)
    return _median_call(lambda: [to_tensor(a) for a in exe.xla.run_buffers(buffers)], 2000)


def run_fresh(backend, workload, mode, steps, cache_dir=None) -> dict:
    """One fresh process; ``cache_dir`` (kept by the caller) holds our cache and PyTorch's, so a
    second run on it is warm."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=os.path.join(cache_dir or tmp, "neuron"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir or tmp, "inductor"))
        env.pop("NEURON_COMPILE_PRECOMPILE", None)
        if backend == "neuron-precompile":
            env["NEURON_COMPILE_PRECOMPILE"] = "1"
        cmd = [sys.executable, __file__, "--worker", f"{backend}:{workload}:{mode}", "--steps", str(steps)]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if result.returncode != 0:
            return {"backend": backend, "workload": workload, "mode": mode,
                    "error": _failure(result.stderr)}
        return json.loads(result.stdout.strip().splitlines()[-1])


_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w+(?:Error|Exception|Failed)\b")
_DIAGNOSTIC = re.compile(r":\d+:\d+: error: (.*)$")


def _failure(stderr: str) -> str:
    """Why a worker failed, in one line: its last exception (Dynamo's own hint lines come after it)
    and, when a compiler printed MLIR diagnostics, the first one, with an unlowered op named."""
    lines = stderr.strip().splitlines()
    exceptions = [line for line in lines if _EXCEPTION.match(line)]
    reason = exceptions[-1] if exceptions else (lines[-1] if lines else "failed")
    diagnostic = next((m.group(1) for line in lines if (m := _DIAGNOSTIC.search(line))), None)
    if diagnostic:
        diagnostic = re.sub(r'%\S+ = "torch\.operator".*?name = "([^"]+)".*', r"\1", diagnostic)
        reason = f"{diagnostic} ({reason})"
    return reason[:300]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steady calls/steps per process (transformers)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--workloads", default="overhead:infer,gpt2:infer,gpt2:train,llama:infer,llama:train")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(HERE / "results" / "perf"))
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.worker:
        backend, workload, mode = args.worker.split(":")
        print(json.dumps(worker(backend, workload, mode, args.steps)))
        return 0

    backends = args.backends.split(",")
    runs: dict = {}
    for _ in range(args.repeat):
        for item in args.workloads.split(","):
            workload, mode = item.split(":")
            for backend in backends:
                if backend.startswith("neuron"):
                    with tempfile.TemporaryDirectory() as cache:
                        cold = run_fresh(backend, workload, mode, args.steps, cache)
                        warm = run_fresh(backend, workload, mode, args.steps, cache)
                    runs.setdefault((workload, mode, backend), []).append(cold)
                    runs.setdefault((workload, mode, backend + "-warm"), []).append(warm)
                else:
                    runs.setdefault((workload, mode, backend), []).append(run_fresh(backend, workload, mode, args.steps))
                print(f"  {workload}:{mode}:{backend}: {runs[(workload, mode, backend)][-1]}", file=sys.stderr)
    summary = _summarize(runs)
    text = _report(summary, args)
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps(
        {"summary": summary, "runs": {":".join(k): v for k, v in runs.items()}}, indent=2))
    _plot(summary, args.out + ".png")
    return 0


def _summarize(runs) -> dict:
    summary = {}
    for (workload, mode, backend), results in runs.items():
        ok = [r for r in results if "error" not in r]
        entry = {"errors": [r["error"] for r in results if "error" in r]}
        for field in ("first_call_s", "per_call_s", "raw_xla_s", "peak_rss_mb", "step_peak_mb"):
            values = [r[field] for r in ok if field in r]
            if values:
                entry[field] = statistics.median(values)
        summary.setdefault(f"{workload}:{mode}", {})[backend] = entry
    return summary


def _ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def _report(summary, args) -> str:
    from tabulate import tabulate

    from neuron_compile.cli.bench import machine_line

    machine = machine_line()
    lines = [f"# neuron vs eager, Inductor and iree-turbine\n",
             f"Machine: {machine}. Medians of {args.repeat} fresh processes per cell, empty caches "
             f"(-warm: a fresh process on the caches its cold run left; neuron-precompile: "
             f"NEURON_COMPILE_PRECOMPILE=1). First call: torch.compile() and the first call or step. "
             f"Per-call: the quietest "
             f"round (overhead) or median of {args.steps} steps.\n",
             f"Rerun: `python benchmarks/bench_perf.py --repeat {args.repeat} --steps {args.steps}{_selection(args)}`\n"]
    rows = []
    for workload, cells in summary.items():
        ind = cells.get("inductor", {})
        eager = cells.get("eager", {})
        for backend, c in cells.items():
            rows.append([workload, backend,
                         f"{c['first_call_s']:.2f}" if "first_call_s" in c else "-",
                         f"{c['per_call_s'] * 1e3:.3f}" if "per_call_s" in c else "-",
                         _ratio(c.get("first_call_s"), ind.get("first_call_s")),
                         _ratio(c.get("per_call_s"), ind.get("per_call_s")),
                         f"{c['peak_rss_mb']:.0f}" if "peak_rss_mb" in c else "-",
                         _ratio(c.get("peak_rss_mb"), eager.get("peak_rss_mb")),
                         f"{c['step_peak_mb']:.0f}" if "step_peak_mb" in c else "-",
                         "; ".join(dict.fromkeys(c["errors"]))[:160] or ""])
    lines.append(tabulate(rows, headers=["workload", "backend", "first call s", "per call ms", "first / inductor",
                                          "per call / inductor", "peak RSS MB", "RSS / eager", "step peak MB", "error"],
                          tablefmt="github"))
    over = summary.get("overhead:infer", {})
    n = over.get("neuron", {})
    if "raw_xla_s" in n:
        lines.append(f"\nOverhead MLP: neuron per call {n['per_call_s'] * 1e6:.1f} us, raw XLA execute of the same "
                     f"executable {n['raw_xla_s'] * 1e6:.1f} us: ratio {n['per_call_s'] / n['raw_xla_s']:.2f}; "
                     f"Inductor {over.get('inductor', {}).get('per_call_s', float('nan')) * 1e6:.1f} us.")
    for workload, cells in summary.items():
        first = {name: cells.get(name, {}).get("first_call_s")
                 for name in ("neuron", "neuron-warm", "neuron-precompile", "neuron-precompile-warm")}
        if first["neuron"] and first["neuron-warm"]:
            line = f"{workload}: warm first call / cold first call = {first['neuron-warm'] / first['neuron']:.2f}"
            if first["neuron-precompile"] and first["neuron-precompile-warm"]:
                line += (f"; precompile: {first['neuron-precompile-warm'] / first['neuron-precompile']:.2f} "
                         f"of its own cold, {first['neuron-precompile-warm'] / first['neuron']:.2f} of neuron's cold")
            lines.append(line)
    for workload, cells in summary.items():
        device, host, ind = (cells.get(name, {}) for name in ("neuron-device", "neuron", "inductor"))
        if "per_call_s" in device and "per_call_s" in host:
            lines.append(f"{workload}: model on the neuron device / CPU tensors, both compiled by neuron: per call "
                         f"{_ratio(device['per_call_s'], host['per_call_s'])}, first call "
                         f"{_ratio(device.get('first_call_s'), host.get('first_call_s'))}; device / Inductor: per "
                         f"call {_ratio(device['per_call_s'], ind.get('per_call_s'))}, first call "
                         f"{_ratio(device.get('first_call_s'), ind.get('first_call_s'))}")
    return "\n".join(lines) + "\n"


def _selection(args) -> str:
    default = {action.dest: action.default for action in _parser()._actions}
    return "".join(f" --{name} {getattr(args, name)}" for name in ("backends", "workloads", "out")
                   if getattr(args, name) != default[name])


def _plot(summary, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    workloads = list(summary)
    backends = sorted({b for cells in summary.values() for b in cells})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, field, title in ((axes[0], "first_call_s", "first call (s)"), (axes[1], "per_call_s", "per call (s)")):
        width = 0.8 / max(1, len(backends))
        for k, backend in enumerate(backends):
            values = [summary[w].get(backend, {}).get(field, 0) for w in workloads]
            ax.bar([i + k * width for i in range(len(workloads))], values, width, label=backend)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, rotation=20)
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
