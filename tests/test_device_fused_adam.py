"""Fused Adam and AdamW on the ``neuron`` device (``fused=True``; Trainer's default optimizer) against
CPU's fused kernel: parameters and optimizer state after a few steps, every option, and no new
compile when the learning rate changes every step."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

OPTIONS = {
    "adamw": (torch.optim.AdamW, {}),
    "adamw-decay": (torch.optim.AdamW, {"weight_decay": 0.1}),
    "adam-decay-amsgrad": (torch.optim.Adam, {"weight_decay": 0.05, "amsgrad": True}),
    "adam-maximize": (torch.optim.Adam, {"maximize": True, "betas": (0.3, 0.95)}),  # lerp's other formula
    "adamw-tensor-lr": (torch.optim.AdamW, {"lr": torch.tensor(0.01)}),
}


def _train(device, make, options, steps=3, lrs=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(device)
    options = {"lr": 0.01, **options}
    opt = make(model.parameters(), fused=True, **options)
    x = torch.randn(4, 6).to(device)
    compiles = []
    for step in range(steps):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[step]
        model(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        compiles.append(device_ops.COUNTS["op_compiles"])
    state = [{k: v.cpu() for k, v in opt.state[p].items()} for p in model.parameters()]
    return [p.detach().cpu() for p in model.parameters()], state, compiles


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_fused_adam_steps_match_cpu(name):
    make, options = OPTIONS[name]
    got, got_state, _ = _train("neuron", make, options)
    want, want_state, _ = _train("cpu", make, options)
    assert_close(got, want)
    assert_close(got_state, want_state)


def test_fused_adamw_with_a_changing_learning_rate_compiles_once():
    lrs = [0.01, 0.0071, 0.0042, 0.0013]  # a scheduler's decay
    got, _, compiles = _train("neuron", torch.optim.AdamW, {}, steps=4, lrs=lrs)
    want, _, _ = _train("cpu", torch.optim.AdamW, {}, steps=4, lrs=lrs)
    assert_close(got, want)
    assert compiles[1] == compiles[2] == compiles[3], compiles


def test_fused_adam_unscales_gradients_and_skips_on_inf():
    """GradScaler's arguments: ``grad_scale`` divides (and writes back) the gradients; ``found_inf == 1``
    leaves every tensor as it was."""
    torch.manual_seed(0)
    tensors = [[torch.randn(7) for _ in range(2)] for _ in range(4)]  # params, grads, exp_avgs, exp_avg_sqs
    tensors[3] = [t.abs() for t in tensors[3]]
    for found in (0.0, 1.0):
        results = []
        for device in ("cpu", "neuron"):
            lists = [[t.clone().to(device) for t in group] for group in tensors]
            steps = [torch.tensor(3.0).to(device) for _ in range(2)]
            torch._fused_adamw_(*lists, [], steps, lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.01,
                                eps=1e-8, amsgrad=False, maximize=False,
                                grad_scale=torch.tensor(4.0).to(device), found_inf=torch.tensor(found).to(device))
            results.append([[t.cpu() for t in group] for group in lists])
        assert_close(results[1], results[0])
        if found:
            assert_close(results[1], tensors)
