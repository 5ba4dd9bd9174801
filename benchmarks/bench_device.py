"""The eager ``neuron`` device against CPU eager and the raw PJRT floor, side by side in one run.

Ten measurements, each against its peer:

1. Per-op dispatch of a small cached op: ``a + b`` on 16-float neuron tensors,
   already compiled (warm), against CPU eager ``a + b`` on the same sizes and
   against the raw PJRT execute floor: the same add written as StableHLO text,
   compiled with ``runtime.executor.XlaExecutable.compile`` and run with
   ``exe.run_buffers([buf_a, buf_b])`` on PJRT buffers made once. Target:
   neuron at most 1.5x the floor. Each path runs ``--iters`` times per round,
   ``--repeats`` rounds, the rounds of all paths interleaved so that load from
   other jobs falls on each alike; the median round's per-call time is
   reported. ``jax.jit`` of the same add on jax arrays (blocked until ready,
   and not) is the second peer (target: neuron at most 1.5x it, blocked).
   The pieces of neuron's per-op path are timed alone in the same
   rounds (its own executable run raw, ``run_executable``, the signature, the
   output tensor, ``ops.dispatch`` called directly), and a cProfile of the warm
   loop lists the Python functions the time goes to.
2. A 256x256 float32 matmul on neuron against the raw PJRT execute of the same
   ``dot_general`` (target at most 1.1x), CPU eager for reference. CPU eager
   runs at torch's default thread count and at one thread, and the faster is
   the peer: on cores shared with other jobs the default loses most of its
   time waiting for a descheduled thread.
3. An eager GPT-2 style training step (2 layers, 128 wide, 4 heads, vocabulary
   1000, batch 2x64, dropout off, random weights from a ``GPT2Config``):
   forward, ``loss.backward()``, ``AdamW.step()``, ``zero_grad()``, then
   ``loss.item()``. ``--warmup`` steps compile the ops, then the median of
   ``--steps`` steps, on neuron and on CPU eager (target: neuron at most 2x
   CPU, issue 38's). The default AdamW hands its ops Python floats that change every step
   (bias corrections, step sizes); ``AdamW(capturable=True)``, which keeps them
   on the device as tensors, is a second neuron row. Ops compiled
   (``ops.COUNTS['op_compiles']``) are reported for warm-up and steady steps
   (steady steps should compile nothing), and one steady step is profiled.
4. Cold start: the same model and default AdamW for ``--cold-steps`` training
   steps in a NEW Python process with an empty cache folder
   (``NEURON_COMPILE_CACHE_DIR``), then a second NEW process on the cache the
   first left, and a CPU eager process for reference: wall time of each
   process, its first step, and the warm process's compile counters
   (``neuron_compile.report.COUNTERS``: it should lower and compile nothing),
   with where each process's steps spent their time (per-op tracing, the
   compile_graph stages, the rest). The processes import a snapshot of the
   sources the cache key fingerprints, so edits made while the benchmark runs
   cannot turn the warm run into misses.
5. Batches sliced at moving offsets: pytorch/examples word_language_model's
   training loop (Embedding, one LSTM layer, Linear; the corpus resident on
   the device, ``data[i:i + bptt]`` each batch) for ``--offset-batches``
   batches on neuron and on CPU eager: ops compiled per batch (target: 0 after
   the first), batch times, losses against CPU's.
6. A sampling loop over growing lengths: nanoGPT sample.py's loop (the
   model on the whole sequence, last logits, softmax, multinomial, cat) on
   section 3's GPT-2 for ``--sample-tokens`` tokens, on neuron and CPU eager:
   ops compiled per token, time, and whether the tokens are CPU's.
7. Cold compile of one op: a NEW process on an empty cache runs one section-3
   training step and times every op kernel it builds (trace, lowering,
   passes, XLA, cache), with each compile stage's median (target: median at
   most 50 ms per op; XLA's own compile of the same ops is the floor), with
   the direct lowering and through Torch-MLIR, processes alternating.
8. Compiled training steps (``torch.compile(model)``, eager AdamW) of
   section 3's GPT-2 and a llama of the same size: our backend with the model
   on neuron, our backend on CPU tensors, Inductor (target: the neuron row at
   most 1.0x each of the others), with the losses against the CPU-tensor row;
   the rows' timed steps interleave, their order turning each step.
9. Large in-place writes: a 4M-float ``add_`` and a static KV cache's
   ``index_copy_`` on neuron with its buffer donation and without (processes
   of their own), ``jax.jit`` with ``donate_argnums`` and without, CPU eager.
10. Adaptive eager execution (``bench_adaptive_eager.py``'s workloads: the
   GPT-2 AdamW step, a nanoGPT-style loop, an LSTM language-model batch, an
   LBFGS fit): CPU eager, neuron op by op (``NEURON_COMPILE_EAGER_FUSION=0``)
   and neuron fused, each in a process of its own, with executables run per
   step, compiles in the steady state, the cold first step and peak device
   bytes. Targets (issue 53): 1.5x, 2x, 3x, 3x CPU eager.

The benchmark makes its own cache folders (a fresh one for this process, one
per cold/warm pair) and removes them. A measurement that fails records the
first line of its error in its table cell and the run goes on. Writes
benchmarks/results/device.{md,json}.

    python benchmarks/bench_device.py            # the full run (about 7 minutes on 2 shared cores)
    python benchmarks/bench_device.py --quick    # a smoke run: fewer iterations and steps (about 3 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

GPT2 = dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
BATCH, TOKENS = 2, 64


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _rounds(fn, iters: int, repeats: int, warmup: int | None = None) -> dict:
    """Per-call seconds of each of ``repeats`` rounds of ``iters`` calls (after warm-up calls)."""
    for _ in range(warmup if warmup is not None else max(10, iters // 10)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return {"median_s": statistics.median(times), "min_s": min(times), "rounds_s": times}


def _measure(results: dict, name: str, make):
    """``results[name] = make()``, or the error's first line: one failure never stops the run."""
    try:
        results[name] = make()
    except Exception as exc:  # the device is under development: record it and go on
        results[name] = {"error": _error(exc)}
        print(f"{name}: {results[name]['error']}", file=sys.stderr, flush=True)
    return results[name]


@contextlib.contextmanager
def _threads(n: int):
    """torch's intra-op threads set to ``n`` for a block. On cores shared with other jobs torch's
    default (one thread a core) can lose most of its time waiting for a descheduled thread, so CPU
    eager runs both ways and its peer is the faster."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _cpu_rows(name: str) -> list[tuple[str, int]]:
    """(row name, threads) for the CPU eager rows: torch's default thread count, and one thread."""
    import torch

    default = torch.get_num_threads()
    rows = [(f"{name} ({default} thread{'s' if default > 1 else ''})", default)]
    return rows + ([(f"{name} (1 thread)", 1)] if default > 1 else [])


def _best_cpu(cells: dict, prefix: str):
    """The fastest CPU eager row of a section: the peer the ratios divide by."""
    timed = [c for n, c in cells.items() if n.startswith(prefix) and isinstance(c, dict) and "median_s" in c]
    return min(timed, key=lambda c: c["median_s"]) if timed else None


def _ty(shape) -> str:
    return "tensor<" + "x".join(map(str, shape)) + "xf32>"


def _raw_add(n: int):
    from neuron_compile.runtime.executor import XlaExecutable

    t = _ty((n,))
    return XlaExecutable.compile(f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
                                 f"  %0 = stablehlo.add %a, %b : {t}\n"
                                 f"  return %0 : {t}\n}}")


def _raw_dot(n: int):
    from neuron_compile.runtime.executor import XlaExecutable

    t = _ty((n, n))
    return XlaExecutable.compile(f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
                                 f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
                                 f"  return %0 : {t}\n}}")


def _op_compiles() -> int:
    from neuron_compile.device import ops

    return ops.COUNTS["op_compiles"]


# ---- 1. per-op dispatch ------------------------------------------------------------------------

def _threads_of(fn):
    threads = getattr(fn, "threads", None)
    return _threads(threads) if threads else contextlib.nullcontext()


def _group(makers: dict, iters: int, repeats: int) -> dict:
    """Time several paths with their rounds interleaved (path 1, path 2, ..., path 1, ...), so load
    that comes and goes on shared cores falls on every path alike. ``makers[name]()`` sets a path up
    and returns the call to time; a path whose setup or call fails records its error and drops out."""
    out: dict = {}
    fns: dict = {}
    for name, make in makers.items():
        try:
            fn = make()
            with _threads_of(fn):
                for _ in range(max(10, iters // 10)):  # warm-up calls
                    fn()
            fns[name] = fn
        except Exception as exc:
            out[name] = {"error": _error(exc)}
            print(f"{name}: {out[name]['error']}", file=sys.stderr, flush=True)
    rounds: dict = {name: [] for name in fns}
    compiles = _op_compiles()
    for _ in range(repeats):
        for name, fn in list(fns.items()):
            try:
                with _threads_of(fn):
                    start = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    rounds[name].append((time.perf_counter() - start) / iters)
            except Exception as exc:
                out[name] = {"error": _error(exc)}
                del fns[name]
    for name, times in rounds.items():
        if name in fns and times:
            out[name] = {"median_s": statistics.median(times), "min_s": min(times), "rounds_s": times}
    out_order = {name: out[name] for name in makers if name in out}
    out_order["_op_compiles_while_timed"] = _op_compiles() - compiles
    return out_order


def per_op(iters: int, repeats: int) -> dict:
    import torch

    from neuron_compile.device.storage import host_to_buffer

    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(16), torch.randn(16)

    def neuron():
        a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
        torch.testing.assert_close((a + b).cpu(), a_cpu + b_cpu)
        return lambda: a + b

    def floor():
        exe = _raw_add(16)
        buffers = [host_to_buffer(a_cpu), host_to_buffer(b_cpu)]
        return lambda: exe.run_buffers(buffers)

    def jitted(blocked: bool):
        def make():
            import jax
            import jax.numpy as jnp

            add = jax.jit(lambda x, y: x + y)
            a, b = jnp.asarray(a_cpu.numpy()), jnp.asarray(b_cpu.numpy())
            add(a, b).block_until_ready()
            return (lambda: add(a, b).block_until_ready()) if blocked else (lambda: add(a, b))
        return make

    paths = {"neuron a + b": neuron, "CPU eager a + b": lambda: (lambda: a_cpu + b_cpu),
             "raw PJRT execute (floor)": floor, "jax.jit a + b, blocked": jitted(True),
             "jax.jit a + b": jitted(False)}
    paths.update(per_op_pieces(a_cpu, b_cpu))
    timed = _group(paths, iters, repeats)
    pieces = {name: timed.pop(name) for name in list(timed) if name.startswith("piece: ")}
    out: dict = {"paths": timed, "pieces": {name.removeprefix("piece: "): cell for name, cell in pieces.items()}}
    _measure(out, "profile", lambda: profile_add(a_cpu, b_cpu, iters * 2))
    return out


def per_op_pieces(a_cpu, b_cpu) -> dict:
    """Neuron's per-op path taken apart: a setup per piece (internals of ops.py: they may move)."""
    import torch

    from neuron_compile.device import opkernel, ops
    from neuron_compile.device.storage import new_tensor

    op = torch.ops.aten.add.Tensor
    state: dict = {}

    def setup():
        if not state:
            a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
            a + b  # compiled (or already warm)
            leaves = ops.leaves_of((a, b), {})
            kernel = ops._KERNELS[(id(op), tuple(leaves.parts))]
            if any(kind != "slot" for kind, _ in kernel.inputs):
                raise RuntimeError(f"add's kernel takes host inputs: {kernel.inputs}")
            params = [leaves.datas[index].buffer for _, index in kernel.inputs]
            exe = kernel.executable
            xla_args = [params[i] for i in exe.plan.tensor_args]
            state.update(a=a, b=b, kernel=kernel, params=params, exe=exe, xla_args=xla_args,
                         result=exe.xla.run_buffers(xla_args)[0], fresh=kernel.fresh[0])
        return state

    def piece(make):
        return lambda: make(setup())

    kernels = ops._KERNELS
    pieces = {
        "neuron's own add executable, raw run_buffers": lambda s: (lambda: s["exe"].xla.run_buffers(s["xla_args"])),
        "opkernel.run_executable (plan + run_buffers)": lambda s: (lambda: opkernel.run_executable(s["exe"], s["params"])),
        "signature: ops.leaves_of + key + dict lookup":
            lambda s: (lambda: kernels.get((id(op), tuple(ops.leaves_of((s["a"], s["b"]), {}).parts)))),
        "storage.new_tensor for the output":
            lambda s: (lambda: new_tensor(s["fresh"][0], s["fresh"][1], s["result"], s["fresh"][2])),
        "OpKernel call (leaves made, run, output tensor)":
            lambda s: (lambda: s["kernel"](ops.leaves_of((s["a"], s["b"]), {}))),
        "ops.dispatch called directly": lambda s: (lambda: ops.dispatch(op, (s["a"], s["b"]), {})),
        "torch.ops.aten.add.Tensor(a, b)": lambda s: (lambda: op(s["a"], s["b"])),
        "a + b": lambda s: (lambda: s["a"] + s["b"]),
    }
    return {f"piece: {name}": piece(make) for name, make in pieces.items()}


def profile_add(a_cpu, b_cpu, calls: int, top: int = 20) -> dict:
    """cProfile of ``calls`` warm ``a + b``: the Python functions by own time, in us per op."""
    import cProfile

    a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
    for _ in range(100):
        a + b

    def loop():
        for _ in range(calls):
            a + b

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(loop)
    wall = time.perf_counter() - start
    return {"calls": calls, "profiled_us_per_op": wall / calls * 1e6, "top": _profile_rows(profiler, calls, top)}


def _profile_rows(profiler, calls: int, top: int, scale: float = 1e6) -> list[dict]:
    """The profile's functions by own time, per call of what was profiled (in us, or ms with scale=1e3)."""
    import pstats

    rows = []
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():
        rows.append({"function": f"{func} ({Path(path).name}:{line})" if line else func,
                     "calls_per_op": ncalls / calls, "own_per_op": tottime / calls * scale,
                     "cum_per_op": cumtime / calls * scale})
    rows.sort(key=lambda r: -r["own_per_op"])
    return rows[:top]


# ---- 2. matmul ---------------------------------------------------------------------------------

def matmul(n: int, iters: int, repeats: int) -> dict:
    import torch

    from neuron_compile.device.storage import host_to_buffer

    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(n, n), torch.randn(n, n)

    def neuron():
        a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
        torch.testing.assert_close((a @ b).cpu(), a_cpu @ b_cpu, rtol=1e-4, atol=1e-4)
        return lambda: a @ b

    def floor():
        exe = _raw_dot(n)
        buffers = [host_to_buffer(a_cpu), host_to_buffer(b_cpu)]
        return lambda: exe.run_buffers(buffers)

    def cpu(threads):
        def make():
            def run():
                return a_cpu @ b_cpu
            run.threads = threads  # _group runs its rounds under _threads(threads)
            return run
        return make

    paths = {"neuron a @ b": neuron, "raw PJRT execute (floor)": floor}
    for name, threads in _cpu_rows("CPU eager a @ b"):
        paths[name] = cpu(threads)
    with torch.no_grad():
        return _group(paths, iters, repeats)


# ---- 3. training step --------------------------------------------------------------------------

def build_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**GPT2))
    ids = torch.randint(0, GPT2["vocab_size"], (BATCH, TOKENS))
    return model, ids


def make_step(device: str, capturable: bool = False, build=None, backend: str | None = None):
    """A training step as a user writes it: forward (``torch.compile``'d with ``backend`` if given), backward,
    AdamW's step, zero_grad, ``loss.item()``; the model from ``build`` (section 3's GPT-2 by default)."""
    import torch

    model, ids = (build or build_gpt2)()
    model.to(device).train()
    ids = ids.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=capturable) if capturable else \
        torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = torch.compile(model, backend=backend) if backend else model

    def step() -> float:
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def train(device: str, warmup: int, steps: int, capturable: bool = False, profile: bool = True) -> dict:
    from neuron_compile.device import ops

    step = make_step(device, capturable)
    counts0 = dict(ops.COUNTS)
    warm_s, losses = [], []
    # on the device, warm-up goes on past ``warmup`` steps until the steady state (bench_adaptive_eager's
    # warm_up). Three fixed steps timed the loop while its runs were still being built: most "steady" steps
    # ran op by op (4.94x CPU eager, against 1.32x in section 10, at 155cb68)
    from bench_adaptive_eager import warm_up

    from neuron_compile.device import op_queue

    warm_up(step, warmup, op_queue if device == "neuron" else None, losses, warm_s)
    counts1 = dict(ops.COUNTS)
    step_s = []
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(step())
        step_s.append(time.perf_counter() - start)
    counts2 = dict(ops.COUNTS)
    if device == "neuron" and profile:
        import cProfile

        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.runcall(step)
        profiled = time.perf_counter() - start
        profile = {"profiled_step_ms": profiled * 1e3, "top": _profile_rows(profiler, 1, 15, scale=1e3)}
    counts3 = dict(ops.COUNTS)
    out = {"step_s": statistics.median(step_s), "median_s": statistics.median(step_s), "steps_s": step_s,
           "warmup_s": warm_s, "losses": losses}
    if device == "neuron":
        out["op_compiles_warmup"] = counts1["op_compiles"] - counts0["op_compiles"]
        out["op_compiles_steady"] = counts2["op_compiles"] - counts1["op_compiles"]
        out["op_compiles_total"] = counts2["op_compiles"]
        # every cached op the steady steps ran (views and factories have kernels of their own and are not counted)
        out["compiled_ops_per_step"] = (counts2["op_cache_hits"] - counts1["op_cache_hits"]
                                        + out["op_compiles_steady"]) / steps
        out["host_ops_per_step"] = (counts2["host_ops"] - counts1["host_ops"]) / steps
        out["host_copies_per_step"] = (counts2["host_copies"] - counts1["host_copies"]) / steps
        if profile:
            out["profile"] = dict(profile, op_compiles=counts3["op_compiles"] - counts2["op_compiles"])
    return out


def train_all(warmup: int, steps: int) -> dict:
    out: dict = {}

    def cpu(threads):
        with _threads(threads):
            return train("cpu", warmup, steps)

    for name, threads in _cpu_rows("CPU eager, AdamW"):
        _measure(out, name, lambda threads=threads: cpu(threads))
    _measure(out, "neuron, AdamW", lambda: train("neuron", warmup, steps))
    _measure(out, "neuron, AdamW(capturable=True)", lambda: train("neuron", warmup, steps, capturable=True))
    return out


# ---- 4. cold start -----------------------------------------------------------------------------

def _timed(fn, record):
    """``fn``, calling ``record(args, seconds)`` after each call (a worker's view of what it spends)."""
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(args, time.perf_counter() - start)

    return timed


def worker(device: str, steps: int, result: str) -> int:
    """One fresh process: import torch, build the model, ``steps`` training steps; timings and counters."""
    started = time.perf_counter()
    out: dict = {"device": device}
    try:
        import torch  # noqa: F401  (registers the neuron device)

        import neuron_compile.report as report
        from neuron_compile.device import ops

        out["import_s"] = time.perf_counter() - started
        traced = {"ops": 0, "s": 0.0}
        if device == "neuron":  # time the per-op traces (make_fx): a cache hit still traces to find its key
            from neuron_compile.device import trace

            def count(args, seconds):
                traced["ops"] += 1
                traced["s"] += seconds

            trace.trace_op = _timed(trace.trace_op, count)
        step = make_step(device)
        out["build_s"] = time.perf_counter() - started - out["import_s"]
        out["steps_s"] = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            out["steps_s"].append(time.perf_counter() - start)
        out["counters"] = dict(report.COUNTERS)
        out["op_counts"] = dict(ops.COUNTS)
        out["trace"] = traced
        stages: dict = {}
        for rep in report.compile_reports():
            for stage, seconds in rep.stages.items():
                stages[stage] = stages.get(stage, 0.0) + seconds
        out["compile_stages_s"] = stages
        from neuron_compile.graph_keys import source_fingerprint

        out["source_fingerprint"] = source_fingerprint()[:16]
        out["neuron_compile_from"] = str(Path(report.__file__).parent)
    except Exception as exc:
        out["error"] = _error(exc)
    out["in_process_s"] = time.perf_counter() - started
    Path(result).write_text(json.dumps(out))
    return 0


def _snapshot(into: str) -> str:
    """A copy of the sources the cache key hashes (neuron_compile, passes, runtime), taken once.

    The cache key includes a fingerprint of these sources, and they are edited
    while benchmarks run: the cold and the warm process import this copy, so
    both run, and key, the same code.
    """
    for package in ("neuron_compile", "passes", "runtime"):
        shutil.copytree(ROOT / package, Path(into) / package, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def _run_worker(device: str, steps: int, cache_dir: str, sources: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = f.name
    path = os.pathsep.join(filter(None, [sources, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=cache_dir, PYTHONPATH=path)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", device, "--cold-steps", str(steps),
                           "--result", result], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    try:
        out = json.loads(Path(result).read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        out = {}
    finally:
        Path(result).unlink(missing_ok=True)
    out["wall_s"] = wall
    if proc.returncode != 0 and "error" not in out:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        out["error"] = f"exit {proc.returncode}: {lines[-1] if lines else ''}"[:200]
    return out


def cold_start(steps: int, pairs: int) -> dict:
    runs: dict = {"neuron, empty cache": [], "neuron, warm cache": [], "CPU eager": []}
    sources = tempfile.mkdtemp(prefix="bench_device_src_")
    try:
        _snapshot(sources)
        for _ in range(pairs):
            for names in (("neuron, empty cache", "neuron, warm cache"), ("CPU eager",)):
                cache = tempfile.mkdtemp(prefix="bench_device_cold_")  # a fresh one per pair
                try:
                    for name in names:
                        runs[name].append(_run_worker("cpu" if name == "CPU eager" else "neuron", steps, cache,
                                                      sources))
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
            print("cold start:", json.dumps({k: v[-1].get("wall_s") for k, v in runs.items()}), file=sys.stderr,
                  flush=True)
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    return runs


# ---- 5. batches sliced at moving offsets -------------------------------------------------------

class _WordModel:
    """pytorch/examples word_language_model's LSTM model, small: embed, one LSTM layer, decode."""

    @staticmethod
    def build(vocab: int, width: int):
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Embedding(vocab, width)
                self.rnn = torch.nn.LSTM(width, width, 1)
                self.decoder = torch.nn.Linear(width, vocab)

            def forward(self, x, hidden):
                out, hidden = self.rnn(self.encoder(x), hidden)
                return self.decoder(out), hidden

        return Model()


def word_model(device: str, batches: int) -> dict:
    """word_language_model's training loop on ``device``: the corpus resident there, batch ``i`` sliced
    as ``data[i:i + bptt]`` (each at a new storage offset), hidden state detached, cross-entropy,
    ``clip_grad_norm_``, the manual SGD update ``p.data.add_(p.grad, alpha=-lr)``. Per batch: seconds
    and ops compiled."""
    import torch
    import torch.nn.functional as F

    vocab, width, bptt, batch = OFFSETS_MODEL
    torch.manual_seed(0)
    corpus = torch.randint(0, vocab, (batches * bptt + 1, batch))
    model = _WordModel.build(vocab, width)
    data, _ = corpus.to(device), model.to(device)
    hidden = (torch.zeros(1, batch, width, device=device),) * 2
    seconds, compiles, losses = [], [], []
    for i in range(0, batches * bptt, bptt):
        before, t0 = _op_compiles(), time.perf_counter()
        x, y = data[i:i + bptt], data[i + 1:i + 1 + bptt].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(x, hidden)
        loss = F.cross_entropy(out.view(-1, vocab), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-20)
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
        compiles.append(_op_compiles() - before)
    return {"batch_s": seconds, "op_compiles": compiles, "losses": losses}


OFFSETS_MODEL = (100, 32, 10, 4)  # vocabulary, width, bptt, batch


def offsets(batches: int) -> dict:
    with _threads(1):  # one thread each side: torch's default loses most of its time on shared cores
        return {"CPU eager": word_model("cpu", batches), "neuron": word_model("neuron", batches)}


# ---- 6. a sampling loop over growing lengths ---------------------------------------------------

def sample(device: str, tokens: int) -> dict:
    """nanoGPT sample.py's loop on the section-3 GPT-2 (eval, no cache): the model on ``idx`` of growing
    length, the last position's logits over a temperature, softmax, ``multinomial`` (CPU's generator:
    the same draws on both devices), ``cat``. Per token: seconds and ops compiled."""
    import torch

    model, _ = build_gpt2()
    model.to(device).eval()
    torch.manual_seed(1)
    idx = torch.randint(0, GPT2["vocab_size"], (1, 4)).to(device)
    seconds, compiles, settled = [], [], {}
    # growing lengths run per bucket under no_grad by default (``device/lengths.py``)
    with torch.no_grad():
        for token in range(tokens):
            if token == SETTLED and device == "neuron":  # each bucketed op's kernels once the first lengths ran
                settled = _bucket_kernels()
            before, t0 = _op_compiles(), time.perf_counter()
            logits = model(input_ids=idx).logits[:, -1, :] / 0.8
            probs = torch.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
            idx.cpu()  # the token reaches the host, as sample.py's decode does at the end
            seconds.append(time.perf_counter() - t0)
            compiles.append(_op_compiles() - before)
    out = {"token_s": seconds, "op_compiles": compiles, "tokens": idx.cpu().tolist()[0]}
    if device == "neuron":  # every length here is in one 128-bucket: each bucketed op's executables
        kernels = _bucket_kernels()
        out["bucketed_ops"] = len(kernels)
        out["max_kernels_per_bucketed_op"] = max(kernels.values(), default=0)
        # kernels a bucketed op compiled after the first lengths (a new layout of its inputs, a length the
        # sightings took for a width): the count the target is about
        out["kernels_added_late"] = sum(n - settled.get(k, 0) for k, n in kernels.items())
    return out


SETTLED = 12  # tokens at exact shapes while the sightings learn which dims grow (lengths.MIN_SIZES), with margin


def _bucket_kernels() -> dict:
    from neuron_compile.device import lengths

    return {id(f): len(f.kernels) for f in lengths._FAMILIES.values() if not isinstance(f, str)}


def sampling(tokens: int) -> dict:
    with _threads(1):
        return {"CPU eager": sample("cpu", tokens), "neuron": sample("neuron", tokens)}


# ---- 7. cold compile of one op -----------------------------------------------------------------

def cold_ops_worker(result: str) -> int:
    """A fresh process on an empty cache: one eager GPT-2 training step (section 3's), every op kernel built
    timed (``ops._build``: trace, lowering, XLA, cache), with its compile stages."""
    out: dict = {}
    try:
        import torch  # noqa: F401

        import neuron_compile.report as report
        from neuron_compile.device import ops, trace

        builds, traces = [], []
        ops._build = _timed(ops._build, lambda args, seconds: builds.append([str(args[0]), seconds]))
        trace.trace_op = _timed(trace.trace_op, lambda args, seconds: traces.append(seconds))
        step = make_step("neuron")
        start = time.perf_counter()
        step()
        out["step_s"] = time.perf_counter() - start
        out["builds"] = builds
        out["traces_s"] = traces
        out["stages"] = [dict(r.stages) for r in report.compile_reports() if r.kind == "eager"]
    except Exception as exc:
        out["error"] = _error(exc)
    Path(result).write_text(json.dumps(out))
    return 0


LOWERINGS = ("direct", "torch-mlir")


def cold_ops(pairs: int) -> dict:
    """The cold step's op builds with each lowering (``NEURON_COMPILE_LOWERING``), the two alternating, a fresh
    process and an empty cache each: {lowering: [run, ...]}."""
    out: dict = {name: [] for name in LOWERINGS}
    saved = os.environ.get("NEURON_COMPILE_LOWERING")
    try:
        for _ in range(pairs):
            for name in LOWERINGS:
                os.environ["NEURON_COMPILE_LOWERING"] = name
                cache = tempfile.mkdtemp(prefix="bench_device_ops_")
                try:
                    out[name].append(_run_worker("ops", 1, cache, ""))
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        if saved is None:
            os.environ.pop("NEURON_COMPILE_LOWERING", None)
        else:
            os.environ["NEURON_COMPILE_LOWERING"] = saved
    return out


# ---- 8. compiled training steps: the model on neuron, CPU tensors, Inductor ----------------------

LLAMA = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=128)


def build_llama():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **LLAMA))
    return model, torch.randint(0, LLAMA["vocab_size"], (BATCH, TOKENS))


COMPILED_ROWS = ("neuron, model on neuron", "neuron, CPU tensors", "Inductor")


def compiled_model(model_name: str, warmup: int, steps: int) -> dict:
    """``torch.compile(model)`` and eager AdamW, as a user writes it: forward, backward, step, zero_grad,
    ``loss.item()``. Rows: our backend with the model on neuron, our backend on CPU tensors, Inductor, each
    its own model. Each row warms up in turn (the first step timed apart), then the timed steps
    interleave, the rows' order turning each step, so load from other jobs falls on each alike."""
    import torch

    torch._dynamo.reset()
    build = build_gpt2 if model_name == "gpt2" else build_llama
    cells: dict = {}
    steps_of: dict = {}
    for row in COMPILED_ROWS:
        def warm(row=row):
            step = make_step("neuron" if "on neuron" in row else "cpu", build=build,
                             backend="inductor" if row == "Inductor" else "neuron")
            start = time.perf_counter()
            losses = [step()]
            first = time.perf_counter() - start
            for _ in range(warmup - 1):
                losses.append(step())
            steps_of[row] = step
            return {"first_s": first, "losses": losses, "steps_s": []}

        _measure(cells, row, warm)
    rows = [row for row in COMPILED_ROWS if row in steps_of]
    for i in range(steps):
        for row in rows[i % len(rows):] + rows[:i % len(rows)]:
            start = time.perf_counter()
            loss = steps_of[row]()
            cells[row]["steps_s"].append(time.perf_counter() - start)
            cells[row]["losses"].append(loss)
    for row in rows:
        cells[row]["median_s"] = statistics.median(cells[row]["steps_s"])
    return cells


def compiled_all(warmup: int, steps: int) -> dict:
    out: dict = {}
    for model_name in ("gpt2", "llama"):
        _measure(out, model_name, lambda model_name=model_name: compiled_model(model_name, warmup, steps))
    return out


# ---- 9. large in-place writes: donated buffers ---------------------------------------------------

INPLACE_FLOATS = 1 << 22  # 16 MiB of float32
INPLACE_ROWS = ("neuron, buffer donated", "neuron, fresh buffers", "jax.jit, donated", "jax.jit, fresh buffers",
                "CPU eager")


def _inplace_times(step_add, step_kv, sync, calls: int = 50, rounds: int = 5) -> dict:
    out = {}
    for name, step in (("add", step_add), ("kv", step_kv)):
        for i in range(5):
            step(i)
        sync()
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for i in range(calls):
                step(i)
            sync()
            best = min(best, (time.perf_counter() - start) / calls)
        out[name] = best
    return out


def _torch_inplace(device: str) -> dict:
    import torch

    a, b = torch.randn(INPLACE_FLOATS, device=device), torch.randn(INPLACE_FLOATS, device=device)
    cache, k = torch.zeros(1, 8, 2048, 64, device=device), torch.randn(1, 8, 1, 64, device=device)
    positions = [torch.tensor([i], device=device) for i in range(64)]
    return _inplace_times(lambda i: a.add_(b, alpha=0.5), lambda i: cache.index_copy_(2, positions[i % 64], k),
                          lambda: (a[0].item(), cache[0, 0, 0, 0].item()))


def inplace_worker(donate: bool, result: str) -> int:
    """The in-place ops on neuron in a process of its own (its own cache): donation on, or off."""
    out: dict = {}
    try:
        from neuron_compile.device import ops

        if not donate:
            ops.DONATE_BYTES = 1 << 62
        out = _torch_inplace("neuron")
    except Exception as exc:
        out["error"] = _error(exc)
    Path(result).write_text(json.dumps(out))
    return 0


def _jax_inplace(donate: bool) -> dict:
    import jax
    import jax.numpy as jnp

    argnums = (0,) if donate else ()
    add = jax.jit(lambda a, b: a + 0.5 * b, donate_argnums=argnums)
    put = jax.jit(lambda c, k, i: jax.lax.dynamic_update_slice(c, k, (0, 0, i, 0)), donate_argnums=argnums)
    state = {"a": jnp.ones(INPLACE_FLOATS, jnp.float32), "c": jnp.zeros((1, 8, 2048, 64), jnp.float32)}
    b, k = jnp.ones(INPLACE_FLOATS, jnp.float32), jnp.ones((1, 8, 1, 64), jnp.float32)
    positions = [jnp.int32(i) for i in range(64)]

    def step_add(i):
        state["a"] = add(state["a"], b)

    def step_kv(i):
        state["c"] = put(state["c"], k, positions[i % 64])

    return _inplace_times(step_add, step_kv, lambda: (state["a"].block_until_ready(), state["c"].block_until_ready()))


def inplace_all() -> dict:
    out: dict = {}
    for row, donate in (("neuron, buffer donated", True), ("neuron, fresh buffers", False)):
        cache = tempfile.mkdtemp(prefix="bench_device_inplace_")
        try:
            out[row] = _run_worker("inplace" if donate else "inplace-fresh", 1, cache, "")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    _measure(out, "jax.jit, donated", lambda: _jax_inplace(True))
    _measure(out, "jax.jit, fresh buffers", lambda: _jax_inplace(False))
    _measure(out, "CPU eager", lambda: _torch_inplace("cpu"))
    return out


# ---- the report --------------------------------------------------------------------------------

def _machine() -> tuple[str, dict]:
    import jax

    from neuron_compile.cli.bench import machine, machine_line

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "neuron_compile", "passes", "runtime"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        dirty = ""
    tree = " with uncommitted changes under neuron_compile/ (the working tree as it was)" if dirty else ""
    info = dict(machine(), jax=jax.__version__, date=today, commit=commit, uncommitted=bool(dirty))
    return f"{machine_line()}, jax {jax.__version__}. Run {today} on commit {commit}{tree}", info


def _us(cell) -> str:
    if not isinstance(cell, dict) or ("median_s" not in cell and "error" not in cell):
        return "-"  # a skipped section
    if "error" in cell:
        return cell["error"]
    return f"{cell['median_s'] * 1e6:.1f}"


def _ratio(cell, peer) -> str:
    try:
        return f"{cell['median_s'] / peer['median_s']:.2f}"
    except (KeyError, TypeError, ZeroDivisionError):
        return "-"


def _verdict(ratio: str, target: float) -> str:
    try:
        return "met" if float(ratio) <= target else "missed"
    except ValueError:
        return "-"


def _median_of(runs: list, pick):
    values = []
    for run in runs:
        try:
            value = pick(run)
        except (KeyError, IndexError, TypeError):
            continue
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def adaptive_all(warmup: int, steps: int) -> dict:
    """Section 10: bench_adaptive_eager's workloads on CPU, op by op and fused. Their CPU eager side runs in this
    process at one thread (``bench_adaptive_eager.run``); the process's thread count is put back after (the
    page's machine line read "1 threads" once this section had run)."""
    import torch

    import bench_adaptive_eager as adaptive

    threads = torch.get_num_threads()
    try:
        return {workload: adaptive.measure(workload, warmup, steps) for workload in adaptive.WORKLOADS}
    finally:
        torch.set_num_threads(threads)


def report(res: dict, args) -> str:
    from tabulate import tabulate

    header, _ = _machine()
    quick = (" --quick" if args.quick else "") + (f" --skip {args.skip}" if args.skip else "") + "".join(
        f" --{name.replace('_', '-')} {getattr(args, name)}" for name, full in (("offset_batches", 8), ("sample_tokens", 40))
        if not args.quick and getattr(args, name) != full) + (
        f" --out {os.path.relpath(args.out, ROOT)}" if Path(args.out).resolve() != HERE / "results" / "device" else "")
    lines = ["# The eager neuron device against CPU eager and the raw PJRT floor", "",
             f"Machine: {header}.", "",
             f"Rerun: `python benchmarks/bench_device.py{quick}` (iterations {args.iters} x {args.repeats} rounds per "
             f"op path, {args.mm_iters} x {args.repeats} per matmul path; training: {args.warmup} warm-up + "
             f"{args.steps} steady steps; cold start: {args.cold_steps} steps per process, {args.pairs} "
             f"cold/warm pair(s); moving offsets: {args.offset_batches} batches; sampling: {args.sample_tokens} "
             "tokens). Times are the median round (steps: the median step); ratios divide medians.", ""]
    summary = []

    # 1. per op
    p = res.get("per_op", {})
    paths = p.get("paths", {}) if isinstance(p, dict) else {}
    floor, cpu = paths.get("raw PJRT execute (floor)"), paths.get("CPU eager a + b")
    lines += ["## 1. Per-op dispatch: `a + b` on 16 floats, warm", "",
              "Target: neuron at most 1.5x the raw PJRT execute of the same add (StableHLO compiled with "
              "`XlaExecutable.compile`, `run_buffers` on buffers made once), and at most 1.5x `jax.jit` of the "
              "same add on jax arrays, blocked until ready (jax's C++ dispatch; unblocked, for reference). "
              "Neuron's add is not blocked: its result stays on the device.", ""]
    jitted = paths.get("jax.jit a + b, blocked")
    rows = [[name, _us(cell), f"{cell['min_s'] * 1e6:.1f}" if isinstance(cell, dict) and "min_s" in cell else "-",
             _ratio(cell, floor), _ratio(cell, jitted), _ratio(cell, cpu)]
            for name, cell in paths.items() if not name.startswith("_")]
    lines.append(tabulate(rows, headers=["path", "us per op (median)", "us (best round)", "/ raw floor",
                                         "/ jax.jit blocked", "/ CPU eager"], tablefmt="github"))
    neuron = paths.get("neuron a + b", {})
    if "_op_compiles_while_timed" in paths:
        lines += ["", f"Ops compiled while the rounds ran: {paths['_op_compiles_while_timed']} (0 means the add was "
                  "warm throughout). The rounds of these paths and of the pieces below are interleaved."]
    r = _ratio(neuron, floor)
    summary.append(["per-op `a + b`, 16 floats (us)", _us(neuron), "raw PJRT execute", _us(floor), r, "<= 1.5",
                    _verdict(r, 1.5)])
    r = _ratio(neuron, jitted)
    summary.append(["per-op `a + b`, 16 floats (us)", _us(neuron), "jax.jit, blocked", _us(jitted), r, "<= 1.5",
                    _verdict(r, 1.5)])

    pieces = p.get("pieces", {}) if isinstance(p, dict) else {}
    if pieces:
        lines += ["", "Neuron's per-op path taken apart, each piece timed alone (internals of neuron_compile/device/ops.py, "
                  "as they are at this commit):", ""]
        if "error" in pieces:
            lines.append(f"- {pieces['error']}")
        else:
            rows = [[name, _us(cell), _ratio(cell, floor)] for name, cell in pieces.items()]
            lines.append(tabulate(rows, headers=["piece", "us per call", "/ raw floor"], tablefmt="github"))
    prof = p.get("profile", {}) if isinstance(p, dict) else {}
    if prof:
        lines += [""]
        if "error" in prof:
            lines.append(f"cProfile: {prof['error']}")
        else:
            lines += [f"cProfile of {prof['calls']} warm `a + b` ({prof['profiled_us_per_op']:.1f} us per op under "
                      "the profiler, which inflates Python calls): functions by own time. cProfile sees no "
                      "C++ the interpreter reaches without a Python-level builtin call: the dispatcher's path to "
                      "the Python fallback counts in `loop`, and jaxlib's nanobind methods (`execute_sharded`, "
                      "`disassemble_into_single_device_arrays`) count in their caller's own time.", ""]
            rows = [[r["function"], f"{r['calls_per_op']:g}", f"{r['own_per_op']:.2f}", f"{r['cum_per_op']:.2f}"]
                    for r in prof["top"]]
            lines.append(tabulate(rows, headers=["function", "calls per op", "own us per op", "cumulative us per op"],
                                  tablefmt="github"))

    # 2. matmul
    m = res.get("matmul", {})
    floor = m.get("raw PJRT execute (floor)") if isinstance(m, dict) else None
    lines += ["", f"## 2. Matmul: {args.n}x{args.n} float32, warm", "",
              "Target: neuron at most 1.1x the raw PJRT execute of the same `dot_general`. CPU eager (MKL) for "
              "reference, at torch's default thread count and at one thread; '/ CPU eager' divides by the faster.",
              ""]
    if isinstance(m, dict) and "error" in m:
        lines.append(f"- {m['error']}")
    else:
        best = _best_cpu(m, "CPU eager")
        rows = [[name, _us(cell), f"{cell['min_s'] * 1e6:.1f}" if isinstance(cell, dict) and "min_s" in cell else "-",
                 _ratio(cell, floor), _ratio(cell, best)] for name, cell in m.items() if not name.startswith("_")]
        lines.append(tabulate(rows, headers=["path", "us per matmul (median)", "us (best round)", "/ raw floor",
                                             "/ CPU eager"], tablefmt="github"))
    neuron = m.get("neuron a @ b", {}) if isinstance(m, dict) else {}
    r = _ratio(neuron, floor)
    summary.append([f"matmul {args.n}x{args.n} (us)", _us(neuron), "raw PJRT execute", _us(floor), r, "<= 1.1",
                    _verdict(r, 1.1)])

    # 3. training
    t = res.get("train", {})
    lines += ["", "## 3. Eager GPT-2 training step", "",
              f"GPT2Config({', '.join(f'{k}={v}' for k, v in GPT2.items())}), random weights (seed 0), batch "
              f"{BATCH}x{TOKENS}, AdamW(lr=1e-3): forward, `loss.backward()`, `step()`, `zero_grad()`, `loss.item()`. "
              "Target: neuron at most 2x CPU eager. Warm-up on neuron: at least the steps asked for, and on until "
              "two steps in a row start no background build (fused runs, whole ops), each step's builds waited "
              "for (its seconds include the wait). Ops compiled: `ops.COUNTS['op_compiles']` during warm-up and "
              "during the steady steps (the process's memory cache is shared: the capturable row reuses the "
              "forward and backward kernels the row above compiled). Compiled ops per step: the dispatches that "
              "went through the op cache. CPU eager runs at torch's default thread count and at one thread; "
              "'/ CPU eager' divides by the faster.", ""]
    cpu = _best_cpu(t, "CPU eager") if isinstance(t, dict) else None
    cpu_step = cpu
    rows = []
    for name, cell in (t.items() if isinstance(t, dict) else []):
        if not isinstance(cell, dict) or "error" in cell:
            rows.append([name, (cell or {}).get("error", "-")] + ["-"] * 7)
            continue
        step = {"median_s": cell["step_s"]}
        first_loss = cell["losses"][0] if cell.get("losses") else None
        cpu_loss = cpu["losses"][0] if isinstance(cpu, dict) and cpu.get("losses") else None
        rows.append([name, f"{cell['step_s'] * 1e3:.1f}", _ratio(step, cpu_step),
                     " / ".join(f"{s:.2f}" for s in cell["warmup_s"]),
                     cell.get("op_compiles_warmup", "-"), cell.get("op_compiles_steady", "-"),
                     f"{cell['compiled_ops_per_step']:.0f}" if "compiled_ops_per_step" in cell else "-",
                     f"{abs(first_loss - cpu_loss):.1e}" if first_loss is not None and cpu_loss is not None else "-",
                     f"{cell['losses'][-1]:.4f}" if cell.get("losses") else "-"])
    lines.append(tabulate(rows, headers=["run", "step ms (median)", "/ CPU eager", "warm-up steps s",
                                         "ops compiled in warm-up", "ops compiled in steady steps",
                                         "compiled ops per step", "first loss - CPU's", "last loss"],
                          tablefmt="github"))
    for name in ("neuron, AdamW", "neuron, AdamW(capturable=True)"):
        cell = t.get(name) if isinstance(t, dict) else None
        step = {"median_s": cell["step_s"]} if isinstance(cell, dict) and "step_s" in cell else cell
        r = _ratio(step, cpu_step)
        summary.append([f"GPT-2 train step, {name.split(', ', 1)[1]} (ms)",
                        f"{cell['step_s'] * 1e3:.1f}" if isinstance(cell, dict) and "step_s" in cell else
                        (cell or {}).get("error", "-"), "CPU eager",
                        f"{cpu['step_s'] * 1e3:.1f}" if cpu_step else "-", r, "<= 2", _verdict(r, 2.0)])
    total = next((c.get("op_compiles_total") for c in (t.values() if isinstance(t, dict) else [])
                  if isinstance(c, dict) and "op_compiles_total" in c), None)
    if total is not None:
        last = t.get("neuron, AdamW(capturable=True)", {})
        lines += ["", f"Ops compiled in this process by the end: "
                  f"{last.get('op_compiles_total', total) if isinstance(last, dict) else total} (per-op and matmul "
                  "sections included)."]
    for name, cell in (t.items() if isinstance(t, dict) else []):
        prof = cell.get("profile") if isinstance(cell, dict) else None
        if not prof:
            continue
        lines += ["", f"cProfile of one steady step, {name} ({prof['profiled_step_ms']:.0f} ms under the profiler, "
                  f"{prof['op_compiles']} ops compiled in it): functions by own time, ms.", ""]
        rows = [[r["function"], f"{r['calls_per_op']:g}", f"{r['own_per_op']:.1f}", f"{r['cum_per_op']:.1f}"]
                for r in prof["top"]]
        lines.append(tabulate(rows, headers=["function", "calls", "own ms", "cumulative ms"], tablefmt="github"))

    # 4. cold start
    c = res.get("cold", {})
    lines += ["", "## 4. Cold start: a new process, empty cache against warm cache", "",
              f"Each process: `import torch`, build the model, {args.cold_steps} training steps (default AdamW). "
              "Wall: the whole process as the parent saw it (Python start and imports included). Medians over "
              f"{args.pairs} pair(s); counters from the last pair.", ""]
    rows = []
    cold_wall = None
    if isinstance(c, dict) and "error" in c:
        lines.append(f"- {c['error']}")
        c = {}
    for name, runs in c.items():
        errors = [run["error"] for run in runs if "error" in run]
        wall = _median_of(runs, lambda r: r["wall_s"] if "error" not in r else None)
        if name == "neuron, empty cache":
            cold_wall = wall
        last = runs[-1] if runs else {}
        counters = last.get("counters", {})
        rows.append([name, f"{wall:.1f}" if wall else (errors[0] if errors else "-"),
                     f"{wall / cold_wall:.2f}" if wall and cold_wall else "-",
                     _fmt(_median_of(runs, lambda r: r["import_s"])),
                     _fmt(_median_of(runs, lambda r: r["steps_s"][0])),
                     _fmt(_median_of(runs, lambda r: r["steps_s"][-1])),
                     counters.get("lowerings", "-") if name != "CPU eager" else "-",
                     counters.get("xla_compiles", "-") if name != "CPU eager" else "-",
                     ", ".join(f"{k}={v}" for k, v in sorted(counters.items())
                               if k not in ("lowerings", "xla_compiles")) if name != "CPU eager" else "-",
                     errors[0] if errors and wall else ""])
    lines.append(tabulate(rows, headers=["process", "wall s", "/ empty cache", "import torch s", "first step s",
                                         "last step s", "lowerings", "xla_compiles", "other counters", "error"],
                          tablefmt="github"))
    prints = {run.get("source_fingerprint") for runs in c.values() for run in runs if run.get("source_fingerprint")}
    where = {run.get("neuron_compile_from") for runs in c.values() for run in runs if run.get("neuron_compile_from")}
    if prints:
        lines += ["", f"The processes import a copy of neuron_compile, passes and runtime taken when this section "
                  f"started (the cache key hashes those sources, which are edited while benchmarks run): source "
                  f"fingerprint{'s' if len(prints) > 1 else ''} {', '.join(sorted(prints))}"
                  f"{' (the same in every process)' if len(prints) == 1 else ' (they differ: the warm row is void)'}"
                  f"{'; imported from a snapshot' if all('bench_device_src_' in w for w in where) else ''}."]
    for name, runs in c.items():
        last = runs[-1] if runs else {}
        if "trace" not in last or name == "CPU eager":
            continue
        stages = sorted(last.get("compile_stages_s", {}).items(), key=lambda kv: -kv[1])
        steps = sum(last.get("steps_s", []))
        inside = last["trace"]["s"] + sum(v for _, v in stages)
        lines += ["", f"- {name} (last pair), where the {steps:.1f} s of its steps go: tracing {last['trace']['ops']} op signatures "
                  f"{last['trace']['s']:.1f} s; compile_graph stages " + ", ".join(f"{k} {v:.1f} s" for k, v in stages[:6])
                  + f"; the rest (running the ops, Python) {steps - inside:.1f} s."]
    warm = c.get("neuron, warm cache", []) if isinstance(c, dict) else []
    warm_wall = _median_of(warm, lambda r: r["wall_s"] if "error" not in r else None)
    r = f"{warm_wall / cold_wall:.2f}" if warm_wall and cold_wall else "-"
    summary.append(["cold start, new process (s)", _fmt(warm_wall), "empty cache", _fmt(cold_wall), r,
                    "warm compiles 0", _warm_verdict(warm)])

    # 5. moving offsets
    o = res.get("offsets", {})
    vocab, width, bptt, batch = OFFSETS_MODEL
    lines += ["", "## 5. Batches sliced at moving offsets: word_language_model's loop", "",
              f"pytorch/examples word_language_model's training loop, small: Embedding({vocab}, {width}), one LSTM "
              f"layer, Linear, batch {batch} x bptt {bptt}; the corpus resident on the device, batch `i` sliced as "
              "`data[i:i + bptt]` (a new storage offset each batch), `clip_grad_norm_`, the manual SGD update "
              "`p.data.add_(p.grad, alpha=-lr)`. A view's storage offset is an input of its op's executable, not "
              "part of the signature. Target: 0 ops compiled after the first batch. Batch times: first batch, "
              "then the median of the rest.", ""]
    rows = []
    cpu = o.get("CPU eager") if isinstance(o, dict) else None
    for name, cell in (o.items() if isinstance(o, dict) else []):
        if not isinstance(cell, dict) or "error" in cell:
            rows.append([name, (cell or {}).get("error", "-")] + ["-"] * 5)
            continue
        rest = statistics.median(cell["batch_s"][1:]) if len(cell["batch_s"]) > 1 else None
        cpu_rest = statistics.median(cpu["batch_s"][1:]) if isinstance(cpu, dict) and "batch_s" in cpu else None
        diff = (max(abs(a - b) for a, b in zip(cell["losses"], cpu["losses"]))
                if isinstance(cpu, dict) and "losses" in cpu else None)
        rows.append([name, f"{cell['batch_s'][0]:.2f}", f"{rest * 1e3:.1f}" if rest else "-",
                     f"{rest / cpu_rest:.2f}" if rest and cpu_rest else "-",
                     " / ".join(map(str, cell["op_compiles"])) if name != "CPU eager" else "-",
                     f"{diff:.1e}" if diff is not None else "-"])
    lines.append(tabulate(rows, headers=["run", "first batch s", "later batches ms (median)", "/ CPU eager",
                                         "ops compiled per batch", "max loss - CPU's"], tablefmt="github"))
    neuron = o.get("neuron") if isinstance(o, dict) else None
    later = sum(neuron["op_compiles"][1:]) if isinstance(neuron, dict) and "op_compiles" in neuron else None
    summary.append(["moving-offset batches: ops compiled after the first", "-" if later is None else str(later),
                    "-", "-", "-", "0", "-" if later is None else ("met" if later == 0 else "missed")])

    # 6. sampling
    g = res.get("sampling", {})
    lines += ["", "## 6. A sampling loop over growing lengths: nanoGPT sample.py's loop", "",
              f"The section-3 GPT-2 in eval mode, no KV cache, batch 1, a 4-token prompt, {args.sample_tokens} "
              "tokens one at a time: the model on the whole sequence, the last position's logits / 0.8, softmax, "
              "`multinomial` (CPU's generator on both devices: the same draws), `cat`; one thread each side. "
              "An op whose dim grows (it had the two lengths below) runs padded to the 128-bucket "
              "(`neuron_compile/device/lengths.py`): the first tokens compile at exact shapes, then each "
              "bucketed op once; what still compiles per token is an op the padding analysis refuses or a "
              "length equal to one of the model's widths (exact there).", ""]
    rows = []
    cpu = g.get("CPU eager") if isinstance(g, dict) else None
    for name, cell in (g.items() if isinstance(g, dict) else []):
        if not isinstance(cell, dict) or "error" in cell:
            rows.append([name, (cell or {}).get("error", "-")] + ["-"] * 5)
            continue
        total = sum(cell["token_s"])
        cpu_total = sum(cpu["token_s"]) if isinstance(cpu, dict) and "token_s" in cpu else None
        same = (cell["tokens"] == cpu["tokens"]) if isinstance(cpu, dict) and "tokens" in cpu else None
        rows.append([name, f"{total:.2f}", f"{total / cpu_total:.1f}" if cpu_total else "-",
                     f"{statistics.median(cell['token_s']) * 1e3:.1f}",
                     " / ".join(map(str, cell["op_compiles"])) if name != "CPU eager" else "-",
                     "-" if same is None else ("yes" if same else "no")])
    lines.append(tabulate(rows, headers=["run", "all tokens s", "/ CPU eager", "token ms (median)",
                                         "ops compiled per token", "CPU's tokens"], tablefmt="github"))
    neuron = g.get("neuron") if isinstance(g, dict) else None
    if isinstance(neuron, dict) and "token_s" in neuron and isinstance(cpu, dict) and "token_s" in cpu:
        total, cpu_total = sum(neuron["token_s"]), sum(cpu["token_s"])
        most = neuron.get("max_kernels_per_bucketed_op")
        late = max(neuron["op_compiles"][SETTLED:], default=0)
        added = neuron.get("kernels_added_late")
        summary.append([f"sampling {args.sample_tokens} tokens, cold (s)", f"{total:.1f}", "CPU eager",
                        f"{cpu_total:.2f}", f"{total / cpu_total:.1f}", "1 executable/op/bucket",
                        "-" if added is None else "met" if added == 0 and late == 0 else "missed"])
        lines += ["", f"Bucketed ops: {neuron.get('bucketed_ops', '-')}, at most {most} executable(s) each in "
                  f"the bucket (call sites one signature serves: `q * scale` and `k.T * scale`, `q @ k.T` and "
                  f"`attn @ v`; inputs from exact storages while the first lengths ran); from token {SETTLED + 1} "
                  f"on: ops compiled per token at most {late}, kernels a bucketed op added {added}. Target: both 0 "
                  "(each op one executable per bucket once the first lengths ran at exact shapes)."]

    # 7. cold compile per op
    k = res.get("cold_ops", {})
    lines += ["", "## 7. Cold compile of one op: the ops of a GPT-2 training step, empty cache", "",
              "A fresh process on an empty cache runs one section-3 training step; every op kernel it builds is "
              "timed (`ops._build`: the op's trace with make_fx, its lowering, our passes, the XLA compile, the "
              "cache's reads and writes). Target: median at most 50 ms per op. XLA's own compile of the same "
              "ops (the `xla-compile` stage) is the floor this path cannot go under. Each lowering "
              "(`NEURON_COMPILE_LOWERING`: `direct`, an op's graph written as StableHLO where every op has a rule; "
              "`torch-mlir`, every graph through Torch-MLIR) runs in processes of its own, the two alternating "
              f"({args.pairs} each); the table is the `direct` run with the median per-op median.", ""]
    runs = {name: [r for r in k.get(name, []) if isinstance(r, dict) and r.get("builds")] for name in LOWERINGS} \
        if isinstance(k, dict) else {}

    def op_median(run):
        return statistics.median(b for _, b in run["builds"]) * 1e3

    if runs.get("direct"):
        chosen = sorted(runs["direct"], key=op_median)[len(runs["direct"]) // 2]
        per_op = sorted(b for _, b in chosen["builds"])
        stages: dict = {}
        for entry in chosen["stages"]:
            for name, seconds in entry.items():
                stages.setdefault(name, []).append(seconds)
        xla = statistics.median(stages["xla-compile"]) if stages.get("xla-compile") else None

        def spread(what, values):
            values = sorted(values)
            return [what, len(values), f"{statistics.median(values) * 1e3:.1f}",
                    f"{values[int(0.9 * (len(values) - 1))] * 1e3:.1f}", f"{sum(values):.2f}"]

        rows = [spread("op kernel built (all of it)", per_op)]
        if chosen.get("traces_s"):
            rows.append(spread("trace (make_fx)", chosen["traces_s"]))
        rows += [spread(f"stage {name}", values) for name, values in sorted(stages.items(), key=lambda kv: -sum(kv[1]))]
        lines.append(tabulate(rows, headers=["what", "count", "median ms", "p90 ms", "total s"], tablefmt="github"))
        slow = sorted(chosen["builds"], key=lambda b: -b[1])[:5]
        lines += ["", f"The whole step took {chosen['step_s']:.1f} s. Slowest builds: "
                  + ", ".join(f"`{name}` {b * 1e3:.0f} ms" for name, b in slow) + ".", ""]
        side = []
        for name in LOWERINGS:
            medians = sorted(op_median(r) for r in runs.get(name, []))
            if medians:
                side.append([name, len(medians), f"{statistics.median(medians):.1f}",
                             ", ".join(f"{m:.1f}" for m in medians),
                             f"{statistics.median(r['step_s'] for r in runs[name]):.1f}"])
        lines.append(tabulate(side, headers=["lowering", "processes", "per-op median ms (median run)",
                                             "each run's per-op median", "cold step s (median)"], tablefmt="github"))
        median = statistics.median(op_median(r) for r in runs["direct"])
        summary.append(["cold compile per op, GPT-2 step's ops (ms, median)", f"{median:.1f}",
                        "XLA compile alone", f"{xla * 1e3:.1f}" if xla else "-",
                        f"{median / (xla * 1e3):.2f}" if xla else "-", "<= 50 ms",
                        "met" if median <= 50 else "missed"])
        if runs.get("torch-mlir"):
            through = statistics.median(op_median(r) for r in runs["torch-mlir"])
            summary.append(["cold compile per op, GPT-2 step's ops (ms, median)", f"{median:.1f}",
                            "through Torch-MLIR", f"{through:.1f}", f"{median / through:.2f}", "<= 50 ms",
                            "met" if median <= 50 else "missed"])
    errors = [r["error"] for name in LOWERINGS for r in (k.get(name, []) if isinstance(k, dict) else [])
              if isinstance(r, dict) and "error" in r]
    lines += [f"- {e}" for e in errors]

    # 8. compiled training steps
    c8 = res.get("compiled", {})
    lines += ["", "## 8. Compiled training steps: the model on neuron, CPU tensors, Inductor", "",
              f"`torch.compile(model)` with eager AdamW(lr=1e-3), batch {BATCH}x{TOKENS}: GPT-2 as in section 3, and "
              f"LlamaConfig({', '.join(f'{k}={v}' for k, v in LLAMA.items())}). Rows: our backend with the model and "
              "batch on neuron (graphs on device buffers, the optimizer's ops eager on the device), our backend "
              "on CPU tensors (the optimizer CPU eager), Inductor, all at torch's default thread count (XLA's "
              "own pool for the executables; Inductor's kernels use every thread: at one thread the GPT-2 row "
              "of Inductor and ours on CPU tensors were within 5% here). Targets: the neuron row at most 1.0x each "
              "of the "
              f"other two. Steps: {args.warmup} warm-up (the first one timed apart), then the median of "
              f"{args.steps}, the rows' steps interleaved (their order turning each step). First step: the rows warm "
              "up in this order in one process, and our backend's CPU-tensor row finds the graphs the device row "
              "compiled (the same FX graphs) in the cache.", ""]
    rows = []
    for model_name, cells in (c8.items() if isinstance(c8, dict) else []):
        if not isinstance(cells, dict):
            continue
        if "error" in cells:  # the model's rows did not run
            rows.append([model_name, "-", cells["error"]] + ["-"] * 4)
            continue
        cpu_t, ind = cells.get("neuron, CPU tensors"), cells.get("Inductor")
        for row, cell in cells.items():
            if not isinstance(cell, dict) or "error" in cell:
                rows.append([model_name, row, (cell or {}).get("error", "-")] + ["-"] * 4)
                continue
            diff = (max(abs(a - b) for a, b in zip(cell["losses"], cpu_t["losses"]))
                    if isinstance(cpu_t, dict) and "losses" in cpu_t else None)
            rows.append([model_name, row, f"{cell['median_s'] * 1e3:.1f}", f"{cell['first_s']:.1f}",
                         _ratio(cell, cpu_t), _ratio(cell, ind), f"{diff:.1e}" if diff is not None else "-"])
        device = cells.get("neuron, model on neuron")
        for peer_name, peer in (("CPU tensors", cpu_t), ("Inductor", ind)):
            r = _ratio(device, peer)
            summary.append([f"compiled {model_name} step, model on neuron (ms)",
                            f"{device['median_s'] * 1e3:.1f}" if isinstance(device, dict) and "median_s" in device
                            else "-", peer_name,
                            f"{peer['median_s'] * 1e3:.1f}" if isinstance(peer, dict) and "median_s" in peer else "-",
                            r, "<= 1.0", _verdict(r, 1.0)])
    if rows:
        lines.append(tabulate(rows, headers=["model", "row", "step ms (median)", "first step s", "/ CPU tensors",
                                             "/ Inductor", "max loss - CPU tensors'"], tablefmt="github"))
    elif isinstance(c8, dict) and "error" in c8:
        lines.append(f"- {c8['error']}")

    # 9. large in-place writes
    c9 = res.get("inplace", {})
    lines += ["", "## 9. Large in-place writes: donated buffers", "",
              f"`a.add_(b, alpha=0.5)` on {INPLACE_FLOATS:,} floats (16 MiB), and `cache.index_copy_(2, position, k)` "
              "of one position into a (1, 8, 2048, 64) float32 cache (4 MiB, a static KV cache's update), each "
              "called in a loop (best of 5 rounds of 50 calls). Neuron runs in processes of its own, with its "
              "donation (an op overwriting one storage of `ops.DONATE_BYTES` or more hands XLA the buffer) and "
              "without (`DONATE_BYTES` raised: a new buffer every call); `jax.jit` with `donate_argnums` and "
              "without, and CPU eager, in this process.", ""]
    if isinstance(c9, dict) and c9:
        rows = []
        for row in INPLACE_ROWS:
            cell = c9.get(row)
            if isinstance(cell, dict) and "add" in cell:
                rows.append([row, f"{cell['add'] * 1e6:.1f}", f"{cell['kv'] * 1e6:.1f}"])
            elif isinstance(cell, dict) and "error" in cell:
                rows.append([row, cell["error"][:80], "-"])
        lines.append(tabulate(rows, headers=["row", "add_ 4M floats (us)", "index_copy_ into 4 MiB (us)"],
                              tablefmt="github"))
        donated, fresh, jaxd = (c9.get(r) for r in INPLACE_ROWS[:3])
        for key, what in (("add", "in-place add_ of 4M floats (us)"), ("kv", "KV-cache index_copy_ into 4 MiB (us)")):
            if all(isinstance(c, dict) and key in c for c in (donated, fresh, jaxd)):
                for peer_name, peer, target in (("fresh buffers", fresh, 1.0), ("jax.jit, donated", jaxd, 1.5)):
                    r = donated[key] / peer[key]
                    summary.append([what, f"{donated[key] * 1e6:.1f}", peer_name, f"{peer[key] * 1e6:.1f}",
                                    f"{r:.2f}", f"<= {target}", "met" if r <= target else "missed"])

    c10 = res.get("adaptive", {})
    if isinstance(c10, dict) and c10:
        import bench_adaptive_eager as adaptive

        lines += ["", "## 10. Adaptive eager execution: CPU eager, neuron op by op, neuron fused", "",
                  "`bench_adaptive_eager.py`'s workloads (its results page explains the columns), each side in a "
                  "process of its own.", "",
                  *adaptive.HEADER]
        for workload, cells in c10.items():
            if isinstance(cells, dict) and {"cpu", "op_by_op", "fused"} <= cells.keys():
                lines.append(adaptive._row(workload, cells["cpu"], cells["op_by_op"], cells["fused"],
                                           adaptive.cold(cells)))
                cpu, on = cells["cpu"], cells["fused"]
                base = adaptive.cpu_base(cpu, on)
                if base and "median_s" in on:
                    r, target = on["median_s"] / base, adaptive.TARGETS[workload]
                    summary.append([f"adaptive eager {workload} step (ms)", f"{on['median_s'] * 1e3:.2f}",
                                    "CPU eager", f"{base * 1e3:.2f}", f"{r:.2f}", f"<= {target}",
                                    "met" if r <= target else "missed"])

    # sections skipped (--skip) leave no table and no summary row
    skipped = set(filter(None, args.skip.split(",")))
    for name in skipped & set(_SECTIONS):
        heading, row = _SECTIONS[name]
        start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
        if start is not None:
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            del lines[start:end]
        summary = [r for r in summary if not r[0].startswith(row)]
    head = ["## Summary", "", tabulate(summary, headers=["measurement", "neuron", "peer", "peer's", "ratio",
                                                          "target", "verdict"], tablefmt="github"), ""]
    at = next(i for i, line in enumerate(lines) if line.startswith("## "))
    lines[at:at] = head
    return "\n".join(lines) + "\n"


# section -> (its heading's start, its summary rows' start)
_SECTIONS = {"per_op": ("## 1.", "per-op"), "matmul": ("## 2.", "matmul"), "train": ("## 3.", "GPT-2"),
             "cold": ("## 4.", "cold start"), "offsets": ("## 5.", "moving-offset"),
             "sampling": ("## 6.", "sampling"), "cold_ops": ("## 7.", "cold compile per op"),
             "compiled": ("## 8.", "compiled "), "inplace": ("## 9.", "in-place add_"),
             "adaptive": ("## 10.", "adaptive eager")}


def _fmt(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def _warm_verdict(warm: list) -> str:
    if not warm or "counters" not in warm[-1]:
        return "-"
    counters = warm[-1]["counters"]
    return "met" if not counters.get("xla_compiles") and not counters.get("lowerings") else "missed"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer iterations and steps")
    parser.add_argument("--iters", type=int, help="calls per round, per-op paths (default 5000; quick 300)")
    parser.add_argument("--mm-iters", type=int, help="calls per round, matmul paths (default 300; quick 30)")
    parser.add_argument("--repeats", type=int, help="rounds per path (default 9; quick 3)")
    parser.add_argument("--n", type=int, default=256, help="matmul size")
    parser.add_argument("--warmup", type=int, help="training warm-up steps (default 3; quick 2)")
    parser.add_argument("--steps", type=int, help="steady training steps timed (default 10; quick 3)")
    parser.add_argument("--cold-steps", type=int, help="training steps per cold-start process (default 3; quick 2)")
    parser.add_argument("--pairs", type=int, help="cold/warm process pairs, and processes per lowering in section 7 "
                        "(default 3; quick 1)")
    parser.add_argument("--offset-batches", type=int, help="word_language_model batches (default 8; quick 4)")
    parser.add_argument("--sample-tokens", type=int, help="tokens sampled one at a time (default 40; quick 10)")
    parser.add_argument("--skip", default="",
                        help="comma-separated sections to skip: per_op,matmul,train,cold,offsets,sampling,cold_ops,"
                             "compiled,inplace,adaptive")
    parser.add_argument("--out", default=str(HERE / "results" / "device"))
    parser.add_argument("--worker", choices=["neuron", "cpu", "ops", "inplace", "inplace-fresh"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = dict(iters=(300, 5000), mm_iters=(30, 300), repeats=(3, 9), warmup=(2, 3), steps=(3, 10),
                    cold_steps=(2, 3), pairs=(1, 3), offset_batches=(4, 8), sample_tokens=(10, 40))
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.worker == "ops":
        return cold_ops_worker(args.result)
    if args.worker in ("inplace", "inplace-fresh"):
        return inplace_worker(args.worker == "inplace", args.result)
    if args.worker:
        return worker(args.worker, args.cold_steps, args.result)

    # this process's compiles go to a cache folder of its own, removed at the end
    own_cache = tempfile.mkdtemp(prefix="bench_device_")
    os.environ["NEURON_COMPILE_CACHE_DIR"] = own_cache
    sys.path.insert(0, str(ROOT))
    skip = set(filter(None, args.skip.split(",")))
    res: dict = {}
    started = time.perf_counter()
    try:
        import torch  # noqa: F401

        sections = [("per_op", lambda: per_op(args.iters, args.repeats)),
                    ("matmul", lambda: matmul(args.n, args.mm_iters, args.repeats)),
                    ("train", lambda: train_all(args.warmup, args.steps)),
                    ("cold", lambda: cold_start(args.cold_steps, args.pairs)),
                    ("offsets", lambda: offsets(args.offset_batches)),
                    ("sampling", lambda: sampling(args.sample_tokens)),
                    ("cold_ops", lambda: cold_ops(args.pairs)),
                    ("compiled", lambda: compiled_all(args.warmup, args.steps)),
                    ("inplace", inplace_all),
                    ("adaptive", lambda: adaptive_all(args.warmup, args.steps))]
        for name, run in sections:
            if name in skip:
                continue
            t0 = time.perf_counter()
            _measure(res, name, run)
            print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(own_cache, ignore_errors=True)
    _, info = _machine()
    text = report(res, args)
    print(text)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps(
        {"machine": info, "args": vars(args), "total_s": time.perf_counter() - started, "results": res},
        indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
