"""The device optimizer tests' loop (``test_device_sgd``, ``test_device_foreach_adam``): a small model of two
dtypes, steps on the same gradients on either device at a scheduler's learning rates, and per step the
cached ops the step ran and the ops it compiled."""

from __future__ import annotations

import torch

from neuron_compile.device import ops as device_ops

LRS = [0.01, 0.0071, 0.0042, 0.0013, 0.001]  # a scheduler's decay


def model(device, seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    net[2].double()  # two dtypes: torch's foreach groups them, the device's one op takes both
    return net.to(device)


def op_calls() -> int:
    """Every op that ran through the device's op cache so far (compiled, from the index or cached)."""
    return sum(device_ops.COUNTS[k] for k in ("op_compiles", "index_hits", "op_cache_hits"))


def train(device, make, steps=5, seed=0, zero_grad=False):
    """``steps`` steps of ``make(parameters, lr=...)`` on the same gradients on either device (made on the CPU,
    moved), the learning rate set from ``LRS`` before each: (parameters, state, gradients, op calls per step,
    compiles per step), all on the CPU."""
    net = model(device, seed)
    opt = make(net.parameters(), lr=LRS[0])
    generator = torch.Generator().manual_seed(1)
    calls, compiles = [], []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = LRS[step]
        for p in net.parameters():
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=generator).to(device)
        before, compiled = op_calls(), device_ops.COUNTS["op_compiles"]
        opt.step()
        calls.append(op_calls() - before)
        compiles.append(device_ops.COUNTS["op_compiles"] - compiled)
        if zero_grad:
            opt.zero_grad()
    state = [{k: v.cpu() for k, v in opt.state[p].items() if v is not None} for p in net.parameters()]
    grads = [None if p.grad is None else p.grad.cpu() for p in net.parameters()]
    return [p.detach().cpu() for p in net.parameters()], state, grads, calls, compiles
