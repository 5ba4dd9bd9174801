"""``neuron-compile bench``: compile time per stage, cold and warm, beside peer backends.

Every measurement runs in a fresh process (``python -m neuron_compile.cli.bench``,
the worker below), so nothing is warm that a user's first run would not have:

    for each repeat, for each backend (neuron, then the --vs peers):
        a new temporary cache folder (NEURON_COMPILE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR)
        cold: a fresh process compiles into the empty folder
        warm: a second fresh process finds the first one's artifacts (not for eager)

A worker times the first call (compile included) and the steady per-call time
(median of up to ``--calls`` calls after it), and, for neuron, each compile
stage summed over the graphs (from the compile reports). ``compile`` is
first call minus steady call for every backend, so peers compare fairly;
neuron's ``dynamo+other`` is what its stages do not account for (Dynamo
tracing, guards, the run itself). The table shows medians over repeats and
ratios to neuron in the same cache state.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

WORKER_TIMEOUT_S = 1800


def machine() -> dict:
    """The machine a benchmark ran on (recorded next to every result)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def machine_line() -> str:
    """``machine()`` as the one line a results file opens with."""
    import jaxlib

    m = machine()
    return (f"{m['cpu']}, {m['cores']} cores (shared with other jobs: figures are noisy, ratios matter), "
            f"{m['platform']}, Python {m['python']}, torch {m['torch']} ({m['threads']} threads), "
            f"jaxlib {jaxlib.__version__}, XLA CPU (PJRT)")


# ---- the worker: one backend, one fresh process ----------------------------------------------------

def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neuron_compile.cli.bench")
    parser.add_argument("spec")
    parser.add_argument("--backend", default="neuron")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--passes")
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import torch

    import neuron_compile

    from .common import _run_spec
    from .specs import load_spec

    import_s = time.perf_counter() - started
    loaded = load_spec(args.spec)
    if args.backend == "eager":
        fn = loaded.model
    elif args.backend == "neuron":
        options = {"passes": args.passes} if args.passes else {}
        fn = torch.compile(loaded.model, backend="neuron", options=options)
    else:
        fn = torch.compile(loaded.model, backend=args.backend)
    params = list(loaded.model.parameters()) if hasattr(loaded.model, "parameters") else []

    def call():
        for p in params:
            p.grad = None
        _run_spec(fn, loaded, args.train)

    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    times = []
    budget = time.perf_counter() + 10.0
    while len(times) < args.calls and (len(times) < 3 or time.perf_counter() < budget):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    steady = sorted(times)[len(times) // 2]
    reports = neuron_compile.compile_reports()
    stages: dict[str, float] = {}
    for r in reports:
        for name, seconds in r.stages.items():
            stages[name] = stages.get(name, 0.0) + seconds
    result = {
        "backend": args.backend, "import_s": import_s, "first_call_s": first, "steady_s": steady,
        "steady_calls": len(times), "compile_s": max(first - steady, 0.0),
        "stages": stages, "graphs": len(reports), "nodes": sum(r.nodes for r in reports),
        "cache": [r.cache or "off" for r in reports],
    }
    if args.backend == "neuron":
        stages["dynamo+other"] = max(first - steady - sum(stages.values()), 0.0)
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


# ---- the command ----------------------------------------------------------------------------------

def add_bench_parsers(sub, command, spec_help: str, passes_help: str) -> None:
    p = command(sub, "bench", "compile time per stage, cold and warm cache, beside peer backends",
                "neuron-compile bench mlp --vs inductor,eager --repeat 3 --plot stages.png",
                """\
                Time a model's compile with the neuron backend, each stage on its own, with a cold
                and a warm cache, each in a fresh process; time its first call and its steady
                per-call time; do the same for the --vs peers (any torch.compile backend, or eager)
                in the same run; print medians over --repeat runs and ratios to neuron.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--vs", default="eager", help="comma-separated peers, e.g. inductor,eager (default eager; "
                                                 "'' for none)")
    p.add_argument("--repeat", type=int, default=1, help="fresh-process runs per backend and cache state (default 1)")
    p.add_argument("--calls", type=int, default=20, help="calls timed for the steady per-call time (default 20)")
    p.add_argument("--train", action="store_true", help="time a training step (forward + backward)")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--json", action="store_true", help="print every run and the medians as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw neuron's stage breakdown and the peers' compile times")
    p.set_defaults(run=cmd_bench)


def _peers(text: str) -> list[str]:
    from .common import UsageError

    peers = [p.strip() for p in text.split(",") if p.strip()]
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=())) | {"eager", "inductor"}
    unknown = [p for p in peers if p not in known]
    if unknown:
        raise UsageError(f"--vs names unknown backend(s) {unknown}; known: {', '.join(sorted(known))}.")
    return [p for p in dict.fromkeys(peers) if p != "neuron"]


def run_worker(spec: str, backend: str, env: dict, *, train: bool, calls: int, passes: str | None) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, "-m", "neuron_compile.cli.bench", spec, "--backend", backend, "--calls", str(calls),
           "--result", result_path]
    if train:
        cmd.append("--train")
    if passes:
        cmd += ["--passes", passes]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            return {"backend": backend, "error": lines[-1] if lines else f"exit {proc.returncode}"}
        with open(result_path) as f:
            return json.load(f)
    except subprocess.TimeoutExpired:
        return {"backend": backend, "error": f"timed out after {WORKER_TIMEOUT_S} s"}
    finally:
        os.unlink(result_path)


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summarize(runs: list[dict]) -> list[dict]:
    """Medians per (backend, cache state), in run order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["backend"], run["phase"]), []).append(run)
    rows = []
    for (backend, phase), group in groups.items():
        ok = [r for r in group if "error" not in r]
        row = {"backend": backend, "phase": phase, "runs": len(group), "failed": len(group) - len(ok)}
        if not ok:
            row["error"] = group[0]["error"]
            rows.append(row)
            continue
        for name in ("compile_s", "first_call_s", "steady_s", "import_s"):
            row[name] = _median([r[name] for r in ok])
        stage_names = list(dict.fromkeys(s for r in ok for s in r["stages"]))
        row["stages"] = {s: _median([r["stages"].get(s, 0.0) for r in ok]) for s in stage_names}
        row["graphs"], row["nodes"] = ok[0]["graphs"], ok[0]["nodes"]
        rows.append(row)
    return rows


def bench(spec: str, peers: list[str], *, repeat: int, train: bool, calls: int, passes: str | None,
          progress: bool = True) -> dict:
    """Run every worker; returns {"runs": [...], "summary": [...], "machine": {...}}."""
    from tqdm import tqdm

    backends = ["neuron"] + peers
    total = repeat * sum(1 if b == "eager" else 2 for b in backends)
    runs = []
    with tqdm(total=total, desc=f"bench {spec}", unit="process", disable=not progress, file=sys.stderr) as bar:
        for rep in range(repeat):
            for backend in backends:
                with tempfile.TemporaryDirectory(prefix="neuron-compile-bench-") as tmp:
                    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=os.path.join(tmp, "neuron"),
                               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                               TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
                    env.pop("NEURON_COMPILE_DUMP_DIR", None)
                    env.pop("TORCH_NEURONX_DEBUG_DIR", None)  # its alias (options.py)
                    phases = ["-"] if backend == "eager" else ["cold", "warm"]
                    for phase in phases:
                        bar.set_postfix_str(f"{backend} {phase}")
                        run = run_worker(spec, backend, env, train=train, calls=calls, passes=passes)
                        run.update(phase=phase, repeat=rep)
                        runs.append(run)
                        bar.update(1)
    return {"spec": spec, "mode": "train" if train else "inference", "repeat": repeat, "machine": machine(),
            "runs": runs, "summary": summarize(runs)}


def _ratio(value, base):
    if value is None or not base:
        return ""
    return f"{value / base:.2f}x"


def format_bench(result: dict) -> str:
    from tabulate import tabulate

    rows = result["summary"]
    neuron = {r["phase"]: r for r in rows if r["backend"] == "neuron" and "error" not in r}
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["backend"], r["phase"], "failed: " + r["error"][:60], "", "", "", ""])
            continue
        base = neuron.get(r["phase"]) or neuron.get("cold") or {}
        table.append([r["backend"], r["phase"], f"{r['compile_s']:.2f}", f"{r['first_call_s']:.2f}",
                      f"{r['steady_s'] * 1e3:.3f}", _ratio(r["first_call_s"], base.get("first_call_s")),
                      _ratio(r["steady_s"], base.get("steady_s"))])
    lines = [f"bench {result['spec']} ({result['mode']}), median of {result['repeat']} run(s), each in a fresh process;"
             f" machine: {result['machine']['cpu']}, {result['machine']['cores']} cores",
             "",
             tabulate(table, headers=["backend", "cache", "compile s", "first call s", "steady ms",
                                      "first call / neuron", "steady / neuron"])]
    if neuron:
        names = list(dict.fromkeys(s for r in neuron.values() for s in r["stages"]))
        cold, warm = neuron.get("cold", {}).get("stages", {}), neuron.get("warm", {}).get("stages", {})
        total = sum(cold.values()) or 1.0
        stage_rows = [[s, f"{cold.get(s, 0) * 1e3:.1f}", f"{warm.get(s, 0) * 1e3:.1f}",
                       f"{100 * cold.get(s, 0) / total:.0f}%"] for s in names]
        graphs = neuron.get("cold", {}).get("graphs")
        nodes = neuron.get("cold", {}).get("nodes")
        lines += ["", f"neuron compile stages ({graphs} graph(s), {nodes} FX nodes), summed over graphs:", "",
                  tabulate(stage_rows, headers=["stage", "cold ms", "warm ms", "share of cold"])]
    return "\n".join(lines)


def plot_bench(result: dict, path: str) -> None:
    from .common import UsageError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'neuron-compile[bench]'.") from None
    rows = [r for r in result["summary"] if "error" not in r]
    labels, fig = [], plt.figure(figsize=(8, 0.6 * len(rows) + 2))
    ax = fig.add_subplot(1, 1, 1)
    stage_names = list(dict.fromkeys(s for r in rows if r["backend"] == "neuron" for s in r["stages"]))
    colors = plt.get_cmap("tab10")
    for y, r in enumerate(rows):
        labels.append(f"{r['backend']} {r['phase']}".strip(" -"))
        if r["backend"] == "neuron":
            left = 0.0
            for i, s in enumerate(stage_names):
                width = r["stages"].get(s, 0.0)
                ax.barh(y, width, left=left, color=colors(i % 10), label=s if y == 0 else None)
                left += width
        else:
            ax.barh(y, r["compile_s"], color="0.6", label="peer compile (not split)" if r["backend"] != "eager"
                    and "peer compile (not split)" not in [t.get_text() for t in ax.get_legend_handles_labels()[1]]
                    else None)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median)")
    ax.set_title(f"compile time by stage: {result['spec']} ({result['mode']})")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_bench(args) -> int:
    from .common import CompileFailure, UsageError, _check_pipeline, _load, emit_json

    if args.repeat < 1 or args.calls < 1:
        raise UsageError("--repeat and --calls must be at least 1.")
    peers = _peers(args.vs)
    if args.passes is not None:
        _check_pipeline(args.passes)
    _load(args.spec)  # a bad spec is a usage error here, before any worker starts
    result = bench(args.spec, peers, repeat=args.repeat, train=args.train, calls=args.calls, passes=args.passes,
                   progress=not args.json)
    if args.plot:
        plot_bench(result, args.plot)
    if args.json:
        emit_json(args, result)
    else:
        print(format_bench(result))
        if args.plot:
            print(f"\nplot: {args.plot}")
    failed = [r for r in result["runs"] if "error" in r and r["backend"] == "neuron"]
    if failed:
        raise CompileFailure(f"the neuron backend failed to compile {args.spec}: {failed[0]['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
