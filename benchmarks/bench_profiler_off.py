"""What issue 51's tool hooks cost a warm eager op with no profiler and no memory history on.

Each warm op on the neuron device passes three hooks that are off:

* ``kernels.handle``: ``op_tracking.EXECUTED[id(op)] += 1`` (op tracking is always on);
* ``ops.dispatch``: ``if _profiling.STATE._is_profiler_enabled`` before the kernel runs;
* ``storage.Data.set``: ``if memory.recorder is not None`` per result buffer.

A/B in one process: "today" runs the same functions with those lines taken out
(their code objects swapped for copies compiled without them), "hooked" runs
them as shipped; rounds alternate in ABBA order so that drift on a shared
machine hits both, after the warm-up has let the device's queue build its fused
runs (``op_queue.wait_for_builds``: a build on the background thread competes
for the cores), and a first pair of rounds left out (the round measured first
ran up to 1.7x faster than the rest, whichever variant it was: the best round
is no measure here). Per op: the median over rounds of each round's mean. The hooks' own statements are also timed alone (``timeit`` of the exact
statements against the same globals): the figure the noise of whole ops cannot
hide on a loaded machine. Target: the hooks under 2% of a warm op.

    python benchmarks/bench_profiler_off.py [--calls 2000] [--rounds 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import textwrap
import time
import timeit

import torch

HOOKS = {  # function -> the lines (stripped) that are the hooks, and what follows an `if` hook
    "kernels.handle": ("op_tracking.EXECUTED[id(op)] += 1  # torch.neuron.get_executed_ops()",),
    "ops.dispatch": ("if _profiling.STATE._is_profiler_enabled:  # torch.profiler records: a neuron::execute event",
                     "if _profiling.STATE._is_profiler_enabled:",
                     "return _profiling.execute(kernel, op, args, kwargs, leaves)"),
    "storage.Data.set": ("if memory.recorder is not None:  # torch.neuron.memory records stacks (memory.py)",
                         "memory.recorder.on_set(self, nbytes)"),
}


def _without_hooks(function, lines):
    """A copy of ``function``'s code with the hook lines removed (same globals, same name)."""
    source = textwrap.dedent(inspect.getsource(function))
    kept = [line for line in source.splitlines() if line.strip() not in lines]
    if len(kept) == len(source.splitlines()):
        raise SystemExit(f"{function.__qualname__}: no hook line found: the hooks changed, update HOOKS")
    namespace: dict = {}
    exec(compile("\n".join(kept), inspect.getsourcefile(function), "exec"), function.__globals__, namespace)
    return namespace[function.__name__].__code__


def _functions():
    from neuron_compile.device import aten_kernels as kernels, ops, storage

    return {"kernels.handle": kernels.handle, "ops.dispatch": ops.dispatch, "storage.Data.set": storage.Data.set}


def _per_op(x, y, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        x + y
    return (time.perf_counter() - start) / calls


def _check_alone() -> float:
    """The hooks' statements as a warm op meets them (one op, one result), in seconds."""
    from neuron_compile.device import aten_kernels as kernels, ops, storage

    op = torch.ops.aten.add.Tensor
    statements = {
        "op_tracking.EXECUTED[id(op)] += 1": kernels.__dict__,
        "_profiling.STATE._is_profiler_enabled": ops.__dict__,
        "_memory.recorder is not None": storage.__dict__,
    }
    total = 0.0
    for statement, namespace in statements.items():
        glob = dict(namespace, op=op)
        number = 200_000
        best = min(timeit.repeat(statement, globals=glob, number=number, repeat=7)) / number
        empty = min(timeit.repeat("pass", number=number, repeat=7)) / number
        total += max(0.0, best - empty)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--size", type=int, default=16, help="elements of the added tensors")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    x = torch.randn(args.size, device="neuron")
    y = torch.randn(args.size, device="neuron")
    for _ in range(500):  # compile and warm the kernel (and the queue's fused runs of it)
        x + y
    try:
        from neuron_compile.device import op_queue

        op_queue.flush()
        op_queue.wait_for_builds()
    except ImportError:  # a device without the queue
        pass
    functions = _functions()
    hooked = {name: f.__code__ for name, f in functions.items()}
    today = {name: _without_hooks(f, HOOKS[name]) for name, f in functions.items()}

    def use(codes):
        for name, f in functions.items():
            f.__code__ = codes[name]

    rounds = {"today": [], "hooked": []}
    try:
        for round_ in range(args.rounds + 2):
            order = (("today", today), ("hooked", hooked))
            for label, codes in (order if round_ % 2 == 0 else order[::-1]):
                use(codes)
                _per_op(x, y, 100)
                if round_ >= 2:  # the first pair warms up
                    rounds[label].append(_per_op(x, y, args.calls))
    finally:
        use(hooked)
    today_s, hooked_s = statistics.median(rounds["today"]), statistics.median(rounds["hooked"])
    alone = _check_alone()
    result = {
        "op": f"x + y, {args.size} float32 on neuron (warm)", "calls": args.calls, "rounds": args.rounds,
        "today_us": round(today_s * 1e6, 3), "hooked_us": round(hooked_s * 1e6, 3),
        "ab_overhead_pct": round((hooked_s / today_s - 1) * 100, 2),
        "hooks_alone_ns": round(alone * 1e9, 1), "hooks_alone_pct_of_op": round(alone / today_s * 100, 3),
        "target_pct": 2.0,
    }
    print(f"warm op ({result['op']}): today {result['today_us']} us, with the hooks {result['hooked_us']} us "
          f"(A/B {result['ab_overhead_pct']:+.2f}%, median of {args.rounds} alternating rounds)")
    print(f"the hooks' statements alone: {result['hooks_alone_ns']} ns per op = "
          f"{result['hooks_alone_pct_of_op']}% of a warm op (target < 2%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
