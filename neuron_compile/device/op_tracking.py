"""Which ATen ops ran on the device, and which of them ran on host copies (TorchNeuron's op tracking).

``aten_kernels.handle`` (every op that reaches the ``neuron`` dispatch key) adds one
to ``EXECUTED[id(op)]`` (keyed by identity: ``OpOverload.__hash__`` is Python
code, 170 ns a call here; ``kernels.KERNELS`` holds every op handled, so its
keys name them back); ``transfers.run_on_host`` (an op whose output shapes depend on
its data, one that does not lower under ``fallback="eager"``, one with a
``view(dtype)`` beside its base...) adds one to ``ON_HOST[op]``. Counting is
always on: one dict increment per op (``benchmarks/bench_profiler_off.py``). ``torch.neuron.get_executed_ops()``,
``get_fallback_ops()`` and ``clear_op_tracking()`` read and reset them under
``torch_neuronx``'s names; ``neuron-compile ops SCRIPT`` prints them for a
script.
"""

from __future__ import annotations

import collections

EXECUTED: collections.defaultdict = collections.defaultdict(int)  # id(OpOverload) -> calls that reached the device
ON_HOST: collections.Counter = collections.Counter()  # OpOverload -> calls run on host copies
KERNELS: dict = {}  # kernels.KERNELS, set there (every op that reached the device is a key): names EXECUTED's ids


def on_host(op) -> None:
    ON_HOST[op] += 1


def _named(counter: collections.Counter) -> dict[str, int]:
    named: dict[str, int] = {}
    for op, count in counter.items():
        name = str(op)
        named[name] = named.get(name, 0) + count
    return dict(sorted(named.items(), key=lambda item: (-item[1], item[0])))


def get_executed_ops() -> dict[str, int]:
    """Every ATen op (``aten.add.Tensor``) that reached the neuron device since the last clear, with its call
    count, most called first: the ops it ran itself and those it ran on host copies."""
    ops = {id(op): op for op in KERNELS}
    return _named(collections.Counter({ops.get(key, key): count for key, count in EXECUTED.items() if count}))


def get_fallback_ops() -> dict[str, int]:
    """The ops that ran on host copies of their neuron tensors (the CPU computed them), with call counts."""
    return _named(ON_HOST)


def clear_op_tracking() -> None:
    EXECUTED.clear()
    ON_HOST.clear()


def format_ops(executed: dict[str, int], fallback: dict[str, int], limit: int | None = None) -> str:
    """Both tables as text: op, calls, and how many ran on the host."""
    from tabulate import tabulate

    rows = [[name, count, fallback.get(name, "")] for name, count in list(executed.items())[:limit]]
    lines = [tabulate(rows, headers=["op", "calls", "on host"], tablefmt="simple")]
    if fallback:
        lines.append("ops run on host copies: " + ", ".join(f"{n} ({c})" for n, c in fallback.items()))
    else:
        lines.append("no op ran on host copies")
    return "\n".join(lines)
