"""SGD's step on the ``neuron`` device: one executable a step (``device/optim.py``: torch's
``_single_tensor_sgd`` and ``_multi_tensor_sgd`` as one op), the same numbers as CPU's step, no new
compile as the learning rate changes, and torch's own path where the device cannot take the step whole."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).parent / "shared"))
from optim_steps import LRS, model as _model, op_calls as _calls, train  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

OPTIONS = {  # foreach named on both sides: CPU's default is the for-loop, a device's the foreach step
    "plain-loop": {"foreach": False},
    "plain-foreach": {"foreach": True},
    "momentum-loop": {"momentum": 0.9, "foreach": False},
    "nesterov-decay-foreach": {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1, "foreach": True},
    "nesterov-loop": {"momentum": 0.9, "nesterov": True, "foreach": False},
    "maximize-dampening-foreach": {"maximize": True, "weight_decay": 0.01, "momentum": 0.5, "dampening": 0.1,
                                   "foreach": True},
}


def _train(device, options, steps=5, seed=0):
    """``steps`` SGD steps on the same gradients on either device (``optim_steps.train``)."""
    return train(device, functools.partial(torch.optim.SGD, **options), steps, seed)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_sgd_steps_match_cpu_in_one_op_a_step(name):
    options = OPTIONS[name]
    got, got_state, got_grads, calls, compiles = _train("neuron", options, seed=len(name))
    want, want_state, want_grads, _, _ = _train("cpu", options, seed=len(name))
    assert_close(got, want)
    assert_close(got_state, want_state)
    assert_close(got_grads, want_grads)  # read, never written
    first = 1 if options.get("momentum", 0) == 0 else 0  # a first momentum step makes its buffers: torch's path
    assert calls[1:] == [1] * (len(calls) - 1), calls  # torch's path: one to four ops per parameter
    assert compiles[2:] == [0] * (len(compiles) - 2), compiles  # a new lr: a runtime input
    if first:
        assert calls[0] == 1, calls


def test_sgd_bumps_the_version_of_what_it_writes():
    model = _model("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the momentum buffers exist from here
    before = [p._version for p in model.parameters()]
    before_state = [opt.state[p]["momentum_buffer"]._version for p in model.parameters()]
    opt.step()
    assert all(p._version > v for p, v in zip(model.parameters(), before))
    assert all(opt.state[p]["momentum_buffer"]._version > v for p, v in zip(model.parameters(), before_state))


def test_foreach_nesterov_on_the_gradients_themselves_keeps_torchs_path():
    """torch's foreach Nesterov step without decay or maximize writes its sum into ``.grad`` (the CPU
    for-loop does not): the device leaves that step to torch, which does the same on neuron tensors."""
    options = {"momentum": 0.9, "nesterov": True, "foreach": True}
    got, _, got_grads, calls, _ = _train("neuron", options, steps=3)
    model = _model("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=LRS[0], **options)
    generator = torch.Generator().manual_seed(1)
    for step in range(3):  # CPU's foreach step, the same function torch runs for the device
        for group in opt.param_groups:
            group["lr"] = LRS[step]
        for p in model.parameters():
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=generator)
        opt.step()
    assert_close(got, [p.detach() for p in model.parameters()])
    assert_close(got_grads, [p.grad for p in model.parameters()])
    assert min(calls) > 1, calls


def test_a_tensor_learning_rate_keeps_torchs_path_and_is_right():
    got, _, _, calls, _ = _train("neuron", {"foreach": False}, steps=2)
    model = _model("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(LRS[0]), foreach=False)
    generator = torch.Generator().manual_seed(1)
    for step in range(2):
        opt.param_groups[0]["lr"] = torch.tensor(LRS[step])
        for p in model.parameters():
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=generator).to("neuron")
        before = _calls()
        opt.step()
        assert _calls() - before == len(list(model.parameters()))  # torch's for-loop: an add_ a parameter
    assert_close([p.detach().cpu() for p in model.parameters()], got)
