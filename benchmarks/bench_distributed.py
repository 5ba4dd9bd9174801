"""A tensor-parallel training step on 2 processes: collectives compiled into the executable vs run eagerly,
beside eager PyTorch and Inductor, in one run.

The GPT-2-style model of ``neuron-compile demo`` (``cli/models.TinyGPT``, 4
layers, 256 wide, batch 4x128), its MLPs split Megatron-style over 2 ranks with
``parallelize_module`` (``fc`` column-parallel, ``out`` row-parallel: one
all_reduce per block forward, one per block backward for the input gradient),
gloo on 127.0.0.1, CPU tensors. Each rank trains it (forward, backward, SGD)
under every mode, in these processes, the modes interleaved step by step (so
each meets the same machine load), same weights and batches:

    eager                  PyTorch, collectives on torch.distributed
    inductor               torch.compile(backend="inductor")
    neuron                 torch.compile(backend="neuron"): collectives compiled into the XLA executable
    neuron-eager-coll      the same with options={"collectives": "eager"}: compiled parts, collectives on
                           torch.distributed in between
    neuron-device          torch.compile(backend="neuron") with the model and batches on the neuron device
                           (a neuron mesh, each rank on neuron:<LOCAL_RANK>): collectives compiled, the
                           device buffers crossing to the distributed client through DLPack (target: at
                           most 1.0x the CPU-tensor "neuron" row)

and reports the first step and the median steady step (rank 0's), steady
step ratios to eager, the median forward, backward and optimizer phases, and
checks every mode's losses against eager's.

Then eager data parallel, the same model unsplit under DDP (each rank its own
batches), its gradients all-reduced per bucket:

    ddp-cpu                CPU tensors, DDP over gloo
    ddp-neuron-staged      the model on neuron, DDP over the ``neuron`` group with
                           NEURON_COMPILE_DEVICE_COLLECTIVES=0: each all-reduce staged through gloo on
                           host copies
    ddp-neuron-xla         the same with the all-reduces run by XLA on the device buffers (the default)

with the host copies per step counted. Results: ``benchmarks/results/distributed.{md,json}``.

    python benchmarks/bench_distributed.py [--steps 20] [--modes ddp-neuron-staged,ddp-neuron-xla]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ["eager", "inductor", "neuron", "neuron-eager-coll", "neuron-device"]
DDP_MODES = ["ddp-cpu", "ddp-neuron-staged", "ddp-neuron-xla"]


def worker(out: str, steps: int, modes: list[str]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from neuron_compile.cli.models import GPTConfig, TinyGPT

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    meshes = {device: init_device_mesh(device, (world,)) for device in ("cpu", "neuron")}
    cfg = GPTConfig(vocab_size=256, n_positions=128, n_embd=256, n_head=4, n_layer=4)
    torch.manual_seed(100 + rank)
    batches = [torch.randint(0, cfg.vocab_size, (4, 128)) for _ in range(steps)]
    results = {}
    runs = {}
    for mode in [m for m in MODES if m in modes]:
        device = "neuron" if mode == "neuron-device" else "cpu"
        torch.manual_seed(0)
        model = TinyGPT(cfg).to(device)
        plan = {}
        for i in range(cfg.n_layer):
            plan[f"blocks.{i}.fc"] = ColwiseParallel()
            plan[f"blocks.{i}.out"] = RowwiseParallel()
        parallelize_module(model, meshes[device], plan)
        step_model = model
        if mode == "inductor":
            step_model = torch.compile(model, backend="inductor")
        elif mode.startswith("neuron"):
            options = {"collectives": "eager"} if mode == "neuron-eager-coll" else None
            step_model = torch.compile(model, backend="neuron", options=options)
        # foreach=False: a device's default foreach kernel refuses the mix of DTensor and plain parameters
        opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
        runs[mode] = (step_model, opt, device, {"times": [], "losses": [], "phases": []})
    # the modes interleaved step by step (their order turning): each mode's steady steps meet the same load
    # on a shared machine, where mode after mode met whatever the machine did meanwhile (10-30% apart)
    order = list(runs)
    for step, ids in enumerate(batches):
        for mode in order[step % len(order):] + order[:step % len(order)]:
            step_model, opt, device, record = runs[mode]
            x = ids.to(device)
            dist.barrier()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = step_model(x, labels=x)
            forward = time.perf_counter()
            loss.backward()
            backward = time.perf_counter()
            opt.step()
            optimizer = time.perf_counter()
            record["losses"].append(loss.item())
            end = time.perf_counter()
            record["times"].append(end - start)
            record["phases"].append((forward - start, backward - forward, optimizer - backward, end - optimizer))
    for mode, (_, _, _, record) in runs.items():
        times, phases = record["times"], record["phases"][2:]
        results[mode] = {"first_s": times[0], "steady_ms": statistics.median(times[2:]) * 1e3,
                         "losses": record["losses"],
                         "phases_ms": {name: round(statistics.median(p[k] for p in phases) * 1e3, 2)
                                       for k, name in enumerate(("forward", "backward", "optimizer", "item"))}}
    del runs
    torch._dynamo.reset()
    neuron_group = dist.new_group(backend="neuron")
    for mode in [m for m in DDP_MODES if m in modes]:
        results[mode] = _ddp_steps(mode, cfg, batches, neuron_group)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _ddp_steps(mode: str, cfg, batches, neuron_group) -> dict:
    """Eager DDP steps of the unsplit model: CPU over gloo, or neuron over the ``neuron`` group (staged or
    XLA all-reduces); the host copies each step makes (``COUNTS``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from neuron_compile.cli.models import TinyGPT
    from neuron_compile.device.opkernel import COUNTS

    device = "cpu" if mode == "ddp-cpu" else "neuron"
    if mode == "ddp-neuron-staged":
        os.environ["NEURON_COMPILE_DEVICE_COLLECTIVES"] = "0"
    try:
        torch.manual_seed(0)
        model = TinyGPT(cfg).to(device)
        wrapped = DDP(model, process_group=None if device == "cpu" else neuron_group)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times, losses, copies = [], [], []
        for ids in batches:
            ids = ids.to(device)
            dist.barrier()
            before = COUNTS["host_copies"]
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = wrapped(ids, labels=ids)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - start)
            copies.append(COUNTS["host_copies"] - before)
    finally:
        os.environ.pop("NEURON_COMPILE_DEVICE_COLLECTIVES", None)
    return {"first_s": times[0], "steady_ms": statistics.median(times[2:]) * 1e3, "losses": losses,
            "host_copies_per_step": statistics.median(copies[2:])}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--modes", default=",".join(MODES + DDP_MODES), help="comma-separated modes to run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.modes.split(","))

    import torch

    sys.path.insert(0, str(HERE.parent))
    from neuron_compile.cli.bench import machine

    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "rank0.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", NEURON_COMPILE_CACHE_DIR=str(Path(tmp) / "cache"),
                   TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"))
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(_free_port()), __file__, "--worker", str(result_file),
                   "--steps", str(args.steps), "--modes", args.modes]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode or not result_file.exists():
            sys.exit(f"the 2-rank run failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
        modes = json.loads(result_file.read_text())
    previous = json.loads((Path(args.out) / "distributed.json").read_text()) if (Path(args.out) / "distributed.json").exists() else {}
    if "eager" not in modes or "ddp-cpu" not in modes:  # a partial rerun: the other rows stay as recorded
        modes = {**previous.get("modes", {}), **modes}
    for group, reference in ((MODES, "eager"), (DDP_MODES, "ddp-cpu")):
        base = modes.get(reference)
        for mode in group:
            r = modes.get(mode)
            if r is None or base is None:
                continue
            r["ratio_to_eager"] = r["steady_ms"] / base["steady_ms"]
            r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
    result = {"machine": machine(), "torch": torch.__version__, "steps": args.steps,
              "workload": "TinyGPT 4 layers, 256 wide, batch 4x128, MLPs tensor-parallel over 2 ranks (gloo), "
                          "forward + backward + SGD", "modes": modes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "distributed.json").write_text(json.dumps(result, indent=1))
    m = result["machine"]
    lines = [
        "# Tensor-parallel training step on 2 processes", "",
        f"{result['workload']}. Both ranks on one machine: {m['cpu']}, {m['cores']} cores, {m['platform']}, "
        f"torch {result['torch']}; one thread per rank. rank 0's times; steady = median of steps 3..{args.steps}. "
        "Shared machine: ratios matter, not times.", "",
        "Rerun: `python benchmarks/bench_distributed.py`", "",
        "| mode | first step (s) | steady step (ms) | steady / eager | forward / backward / optimizer (ms) | "
        "max loss diff vs eager |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        r = modes.get(mode)
        if r is not None:
            ph = r.get("phases_ms", {})
            split = " / ".join(f"{ph[k]:.1f}" for k in ("forward", "backward", "optimizer")) if ph else "-"
            ratio, diff = r.get("ratio_to_eager"), r.get("max_loss_diff")
            lines.append(f"| {mode} | {r['first_s']:.2f} | {r['steady_ms']:.1f} | "
                         f"{'-' if ratio is None else f'{ratio:.2f}'} | {split} | "
                         f"{'-' if diff is None else f'{diff:.1e}'} |")
    neuron, split = modes.get("neuron"), modes.get("neuron-eager-coll")
    if neuron and split:
        lines += ["", f"Collectives compiled into the executable against run eagerly between compiled parts: "
                  f"{split['steady_ms'] / neuron['steady_ms']:.2f}x faster steady step."]
    device = modes.get("neuron-device")
    if device and neuron:
        ratio = device["steady_ms"] / neuron["steady_ms"]
        lines += ["", f"The model on the neuron device against CPU tensors, both compiled with their collectives: "
                  f"{ratio:.2f}x the CPU-tensor step (target <= 1.0x: "
                  f"{'met' if ratio <= 1.0 else 'missed'})."]
    if any(m in modes for m in DDP_MODES):
        lines += ["", "## Eager data parallel: DDP of the unsplit model, its gradients all-reduced per bucket", "",
                  "| mode | first step (s) | steady step (ms) | steady / ddp-cpu | host copies per step | "
                  "max loss diff vs ddp-cpu |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for mode in DDP_MODES:
            r = modes.get(mode)
            if r is not None:
                lines.append(f"| {mode} | {r['first_s']:.2f} | {r['steady_ms']:.1f} | {r.get('ratio_to_eager', 0):.2f} | "
                             f"{r['host_copies_per_step']:.0f} | {r.get('max_loss_diff', 0):.1e} |")
        xla, staged = modes.get("ddp-neuron-xla"), modes.get("ddp-neuron-staged")
        if xla and staged:
            lines += ["", f"All-reduces by XLA on the device buffers against staged through gloo: "
                      f"{staged['steady_ms'] / xla['steady_ms']:.2f}x faster steady step, "
                      f"{staged['host_copies_per_step'] - xla['host_copies_per_step']:.0f} fewer host copies "
                      f"per step (what is left: the batch's transfer and `loss.item()`)."]
    (out / "distributed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
