"""Which device files an eager op's path crosses between, warm: a sys.setprofile trace of one step.

The step: a matmul, relu and add, a sum, a copy to the host, a zeros and a copy_ from the host, on
``neuron`` tensors, run three times first (compiled, fused runs built), then traced. Every call and
return inside ``neuron_compile/device/`` is an event; a transition is two consecutive events in two
files. Issue 52 counted ``ops.py <-> storage.py`` (14 before the host transfers left ops.py for
``transfers.py``; 0 after).

    python benchmarks/args_walk.py
    PYTHONPATH=/path/to/an/older/checkout python benchmarks/args_walk.py   # the same step on older code
"""

from __future__ import annotations

import collections
import os
import sys


def main() -> int:
    import torch

    import neuron_compile.device as device

    root = os.path.dirname(device.__file__)
    x, w = torch.randn(8, 16).to("neuron"), torch.randn(16, 4).to("neuron")

    def step():
        y = (x @ w).relu() + 1
        y.sum(0).cpu()
        t = torch.zeros(3, device="neuron")
        t.copy_(torch.ones(3))
        return t.cpu()

    for _ in range(3):
        step()
    events = []

    def profile(frame, event, arg):
        if event in ("call", "return") and frame.f_code.co_filename.startswith(root):
            events.append(os.path.relpath(frame.f_code.co_filename, root))

    sys.setprofile(profile)
    step()
    sys.setprofile(None)
    pairs, previous = collections.Counter(), None
    for name in events:
        if previous is not None and name != previous:
            pairs[tuple(sorted((previous, name)))] += 1
        previous = name
    print(f"{len(events)} events in {len(set(events))} files; ops.py <-> storage.py: "
          f"{pairs.get(('ops.py', 'storage.py'), 0)}")
    for (a, b), n in pairs.most_common(12):
        print(f"  {a} <-> {b}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
