"""TorchTitan 0.2.2's llama3 debug model on the ``neuron`` device against the same runs on CPU (issue 54).

Each scenario is TorchTitan's own trainer from its command line, flags only, nothing of TorchTitan
edited: ``python -m torchtitan.train`` (one process) or ``torchrun -m torchtitan.train`` (2 or 4 ranks on
127.0.0.1, a free port each), with TorchTitan's debug config and test tokenizer (taken from its
repository at v0.2.2, ``torchtitan_assets``), a local data set in ``c4_test``'s format, and the
weights of one seed checkpoint made on CPU (``--checkpoint.create_seed_checkpoint``, loaded with
``--checkpoint.initial_load_path``). The device needs no flag: TorchTitan takes ``torch.accelerator``'s
device, ``neuron``, and its process-group backend. The CPU reference runs the same trainer through
``torchtitan_cpu.py``, which only names "cpu" as the device. Every process runs at one thread
(``OMP_NUM_THREADS=1``), CPU's included.

| scenario | ranks | flags beyond the common ones | compared with |
| --- | --- | --- | --- |
| eager | 1 | | cpu |
| compiled | 1 | ``--compile.enable --compile.backend neuron`` | cpu |
| fsdp2 | 2 | ``--parallelism.data_parallel_shard_degree 2`` | cpu_global |
| tp2 | 2 | ``--parallelism.tensor_parallel_degree 2`` | cpu |
| fsdp2_tp2 | 4 | ``--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2`` | cpu_global |
| fsdp2_compiled | 2 | fsdp2's and compiled's | cpu_global |

``cpu_global`` is one CPU process with the data-parallel runs' global batch (twice the local batch), on
the rows ordered so it reads at each step what the two data-parallel ranks read together
(``torchtitan_assets.interleaved``). Two CPU runs measure how far rounding alone moves the same 10 steps (the
envelope compiled runs are held to, besides 1e-4): ``cpu_inductor`` (``--compile.enable --compile.backend
inductor``: another compiler's rounding) and ``cpu_accumulate`` (the same batch as two microbatches,
``--training.global_batch_size``: the same sums in another order).

    python benchmarks/torchtitan_runs.py [--steps 10] [--seq 256] [--batch 4] [--scenarios eager,fsdp2]

writes benchmarks/results/torchtitan.md and .json: per scenario the losses, the largest relative
difference from its reference, and the median step time against CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torchtitan_assets as assets  # noqa: E402

PYTHON = sys.executable
TOLERANCE = 1e-4  # relative, per step


@dataclass(frozen=True)
class Scenario:
    name: str
    device: str  # "cpu" or "neuron"
    ranks: int = 1
    flags: tuple = ()
    reference: str | None = None
    global_batch: bool = False  # one process with the data-parallel runs' global batch
    data_parallel: int = 1
    accumulate: int = 1  # microbatches a step (gradient accumulation): the same batch, summed in parts


SCENARIOS = {s.name: s for s in (
    Scenario("cpu", "cpu"),
    Scenario("cpu_global", "cpu", global_batch=True),
    Scenario("cpu_inductor", "cpu", flags=("--compile.enable", "--compile.backend", "inductor"), reference="cpu"),
    Scenario("cpu_accumulate", "cpu", reference="cpu", accumulate=2),
    Scenario("eager", "neuron", reference="cpu"),
    Scenario("compiled", "neuron", flags=("--compile.enable", "--compile.backend", "neuron"), reference="cpu"),
    Scenario("fsdp2", "neuron", 2, ("--parallelism.data_parallel_shard_degree", "2"), "cpu_global",
             data_parallel=2),
    Scenario("tp2", "neuron", 2, ("--parallelism.data_parallel_shard_degree", "1",
                                  "--parallelism.tensor_parallel_degree", "2"), "cpu"),
    Scenario("fsdp2_tp2", "neuron", 4, ("--parallelism.data_parallel_shard_degree", "2",
                                        "--parallelism.tensor_parallel_degree", "2"), "cpu_global",
             data_parallel=2),
    Scenario("fsdp2_compiled", "neuron", 2, ("--parallelism.data_parallel_shard_degree", "2", "--compile.enable",
                                             "--compile.backend", "neuron"), "cpu_global", data_parallel=2),
)}
DEFAULT = ("cpu", "cpu_global", "cpu_inductor", "cpu_accumulate", "eager", "compiled", "fsdp2", "tp2", "fsdp2_tp2",
           "fsdp2_compiled")


@dataclass
class Result:
    scenario: str
    returncode: int
    losses: list = field(default_factory=list)
    step_times: list = field(default_factory=list)
    seconds: float = 0.0
    log: str = ""
    error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(device: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # no neuron device: the launcher names "cpu"
    return env


def common_flags(cache: Path, data: Path, seq: int, batch: int, steps: int, dump: Path,
                 precision: str = "float32") -> list[str]:
    """``precision``: TorchTitan's ``--training.mixed_precision_param``, float32 by default here: the
    config's bfloat16 is a policy that changes with the parallelism (one process autocasts matmuls,
    FSDP casts every parameter, TP alone runs float32), so only float32 compares FSDP and TP runs with
    one process; "config" leaves the config's choice."""
    return ["--job.config_file", str(cache / "debug_model.toml"),
            "--model.hf_assets_path", str(cache / "tokenizer"),
            "--training.dataset_path", str(data), "--training.seq_len", str(seq),
            "--training.local_batch_size", str(batch), "--training.steps", str(steps),
            *(("--training.mixed_precision_param", precision) if precision != "config" else ()),
            "--metrics.disable_color_printing", "--job.dump_folder", str(dump)]


def seed_checkpoint(cache: Path, seq: int, data: Path, timeout: float) -> Path:
    """TorchTitan's seed checkpoint of the debug model, made once on CPU (one process)."""
    folder = cache / f"seed_seq{seq}"
    step0 = folder / "checkpoint" / "step-0"
    if step0.exists():
        return step0
    cmd = [PYTHON, str(HERE / "torchtitan_cpu.py"), *common_flags(cache, data, seq, 1, 1, folder),
           "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
           "--parallelism.data_parallel_shard_degree", "1"]
    env = dict(environment("cpu"), WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cache)
    if done.returncode or not step0.exists():
        raise RuntimeError(f"seed checkpoint failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return step0


_STEP = re.compile(r"^\[titan\] (\S+ \S+) - root - INFO - step:\s+(\d+)\s+loss:\s+([-\d.eE+naninf]+)")


def parse_log(text: str) -> tuple[list, list]:
    """(losses by step, seconds between consecutive step lines) from rank 0's log lines."""
    losses, stamps = {}, {}
    for line in text.splitlines():
        found = _STEP.search(line.strip())
        if found:
            step = int(found.group(2))
            losses.setdefault(step, float(found.group(3)))
            stamps.setdefault(step, datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    steps = sorted(losses)
    times = [stamps[b] - stamps[a] for a, b in zip(steps, steps[1:])]
    return [losses[s] for s in steps], times


def run(scenario: Scenario, *, cache: Path, seq: int, batch: int, steps: int, docs: int,
        work: Path, timeout: float = 1800, precision: str = "float32") -> Result:
    natural = assets.dataset(cache, seq, docs)
    data = assets.dataset(cache, seq, docs, world=2, local_batch=batch) if scenario.global_batch else natural
    local_batch = 2 * batch if scenario.global_batch else batch
    seed = seed_checkpoint(cache, seq, natural, timeout)
    dump = work / scenario.name
    accumulate = ("--training.global_batch_size", str(local_batch)) if scenario.accumulate > 1 else ()
    flags = [*common_flags(cache, data, seq, local_batch // scenario.accumulate, steps, dump, precision),
             *accumulate,
             "--checkpoint.enable",
             "--checkpoint.initial_load_path", str(seed), "--checkpoint.load_only", *scenario.flags]
    port = free_port()
    env = environment(scenario.device)
    if scenario.device == "cpu":
        cmd = [PYTHON, str(HERE / "torchtitan_cpu.py"), *flags]
    elif scenario.ranks == 1:
        cmd = [PYTHON, "-m", "torchtitan.train", *flags]
    else:
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(scenario.ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "torchtitan.train", *flags]
    if scenario.ranks == 1:
        env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=work)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, text = -9, (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(
            errors="replace")
    result = Result(scenario.name, code, seconds=time.perf_counter() - start, log=text)
    result.losses, result.step_times = parse_log(text)
    if code or len(result.losses) < steps:
        errors = [line for line in text.splitlines() if "Error" in line or "error:" in line]
        result.error = (errors[-1] if errors else text[-500:]).strip()[:500]
    (work / f"{scenario.name}.log").write_text(text)
    return result


def max_rel_diff(losses: list, reference: list) -> float | None:
    if not losses or len(losses) != len(reference):
        return None
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def steady_time(result: Result) -> float | None:
    """Median seconds a step, the first two steps (compiles, warm-up) left out."""
    times = result.step_times[2:] or result.step_times[1:]
    return statistics.median(times) if times else None


PERTURBATIONS = ("cpu_inductor", "cpu_accumulate")  # CPU runs of the same math, other rounding


def envelope(results: dict) -> float | None:
    """How far rounding alone moves the one-process run: the largest relative loss difference of the
    perturbed CPU runs from CPU's."""
    found = [max_rel_diff(results[n].losses, results["cpu"].losses) for n in PERTURBATIONS
             if n in results and "cpu" in results]
    found = [d for d in found if d is not None]
    return max(found) if found else None


def bound(scenario: Scenario, rounding: float | None) -> float:
    """Eager runs: 1e-4. Compiled ones: 1e-4 or the measured rounding envelope, the larger."""
    compiled = "--compile.enable" in scenario.flags and scenario.device != "cpu"
    return max(TOLERANCE, rounding or 0.0) if compiled else TOLERANCE


def summarize(results: dict, scenarios: list) -> list[dict]:
    rows = []
    rounding = envelope(results)
    for name in scenarios:
        result, sc = results[name], SCENARIOS[name]
        ref = results.get(sc.reference) if sc.reference else None
        diff = max_rel_diff(result.losses, ref.losses) if ref else None
        # against its reference's step (the same global batch on CPU), else one CPU process's
        base_run = ref or results.get("cpu")
        own, base = steady_time(result), steady_time(base_run) if base_run else None
        rows.append({
            "scenario": name, "device": sc.device, "ranks": sc.ranks, "flags": " ".join(sc.flags),
            "reference": sc.reference, "returncode": result.returncode, "losses": result.losses,
            "max_rel_diff": diff, "bound": bound(sc, rounding),
            "within": None if diff is None or sc.reference is None else diff <= bound(sc, rounding),
            "step_s": own, "step_vs_cpu": own / base if own and base else None,
            "wall_s": round(result.seconds, 1), "error": result.error,
        })
    return rows


def write_report(rows: list, args, path_md: Path) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    lines = [
        "# TorchTitan 0.2.2 on the `neuron` device against CPU",
        "",
        f"llama3 debug model (TorchTitan's `debug_model.toml`, v0.2.2), {args.steps} steps, seq_len {args.seq}, "
        f"local batch {args.batch}, `--training.mixed_precision_param {args.precision}`, "
        "selective activation checkpointing as configured, AdamW lr 8e-4 "
        f"(warmup 2, linear decay), one seed checkpoint made on CPU. torch {torch.__version__}, "
        f"`{os.cpu_count()}`-core {cpu}, every process at one thread, a shared machine: step-time ratios "
        "are rough (median of steps 3 on; each against the CPU run it is compared with). Losses are "
        "TorchTitan's logged ones (5 decimals: a difference of 0 means below ~1e-6 relative). "
        "`python benchmarks/torchtitan_runs.py` reruns it.",
        "",
        "| scenario | ranks | compared with | max rel loss diff | bound | within | step (s) | step / its CPU run's | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        diff = "-" if r["max_rel_diff"] is None else f"{r['max_rel_diff']:.2e}"
        ok = "-" if r["within"] is None else ("yes" if r["within"] else "**no**")
        if r["scenario"] in PERTURBATIONS:
            ok = "(envelope)"
        step = "-" if r["step_s"] is None else f"{r['step_s']:.2f}"
        ratio = "-" if r["step_vs_cpu"] is None else f"{r['step_vs_cpu']:.2f}x"
        status = "ran" if not r["error"] else f"fails: `{r['error'][:160]}`"
        lines.append(f"| {r['scenario']} | {r['ranks']} | {r['reference'] or '-'} | {diff} | {r['bound']:.2e} | {ok} | {step} | "
                     f"{ratio} | {status} |")
    if args.precision != "float32":
        lines += ["", "With bfloat16, TorchTitan's policy depends on the parallelism (`maybe_enable_amp`): one "
                  "process autocasts matmuls to bfloat16, FSDP2 casts every parameter to bfloat16, TP alone "
                  "runs float32. So only the one-process rows compare like with like; the FSDP2 and TP rows "
                  "compare two precisions (the float32 table compares them)."]
    lines += ["", "Losses by step:", "", "| scenario | " + " | ".join(str(i + 1) for i in range(args.steps)) + " |",
              "| --- |" + " --- |" * args.steps]
    for r in rows:
        lines.append(f"| {r['scenario']} | " + " | ".join(f"{x:.5f}" for x in r["losses"]) + " |")
    path_md.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--scenarios", default=",".join(DEFAULT))
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16", "config"),
                        help="--training.mixed_precision_param for every run (config: the config's, bfloat16)")
    parser.add_argument("--work", default="/tmp/neuron_torchtitan_runs")
    parser.add_argument("--reuse", action="store_true",
                        help="take a scenario's losses from its log of an earlier run with the same sizes")
    parser.add_argument("--out", default=str(HERE / "results" / "torchtitan"))
    args = parser.parse_args(argv)
    cache = assets.third_party_files()
    docs = 2 * args.batch * args.steps
    names = args.scenarios.split(",")
    needed = [n for n in ("cpu", "cpu_global") if n not in names and any(
        SCENARIOS[m].reference == n for m in names)]
    work = Path(args.work) / f"seq{args.seq}_b{args.batch}_s{args.steps}_{args.precision}"
    results = {}
    for name in needed + names:
        log = work / f"{name}.log"
        if args.reuse and log.exists():
            losses, times = parse_log(log.read_text())
            if len(losses) == args.steps:
                results[name] = Result(name, 0, losses, times)
                print(f"[torchtitan_runs] {name}: from {log}", flush=True)
                continue
        print(f"[torchtitan_runs] {name} ...", flush=True)
        results[name] = run(SCENARIOS[name], cache=cache, seq=args.seq, batch=args.batch, steps=args.steps,
                            docs=docs, work=work, precision=args.precision)
        print(f"[torchtitan_runs] {name}: rc {results[name].returncode}, losses {results[name].losses} "
              f"{results[name].error}", flush=True)
    rows = summarize(results, needed + names)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    write_report(rows, args, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())
    return 0 if all(r["error"] == "" and (r["within"] in (None, True) or r["scenario"] in PERTURBATIONS)
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
