"""Adam and AdamW's default (foreach) step on the ``neuron`` device: one executable a step
(``device/optim.py``: torch's ``_multi_tensor_adam`` as one op), the same numbers as CPU's foreach
step, no new compile as the learning rate and step count change, and everything else torch's own path."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).parent / "shared"))
from optim_steps import model as _model, train  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

OPTIONS = {
    "adamw": (torch.optim.AdamW, {}),
    "adamw-decay": (torch.optim.AdamW, {"weight_decay": 0.1}),
    "adam-l2-decay": (torch.optim.Adam, {"weight_decay": 0.05}),
    "adam-amsgrad-maximize-decay": (torch.optim.Adam, {"weight_decay": 0.05, "amsgrad": True, "maximize": True}),
    "adamw-betas": (torch.optim.AdamW, {"betas": (0.3, 0.95), "eps": 1e-6}),  # lerp's other formula
}


def _train(device, make, options, steps=5):
    """``steps`` foreach steps on the same gradients on either device (``optim_steps.train``): (parameters,
    state, op calls per step, compiles per step)."""
    params, state, _, calls, compiles = train(device, functools.partial(make, foreach=True, **options), steps,
                                              zero_grad=True)
    return params, state, calls, compiles


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_foreach_adam_steps_match_cpu_in_one_op_a_step(name):
    make, options = OPTIONS[name]
    got, got_state, calls, compiles = _train("neuron", make, options)
    want, want_state, _, _ = _train("cpu", make, options)
    assert_close(got, want)
    assert_close(got_state, want_state)
    assert calls == [1] * len(calls), calls  # torch's path: 8-11 foreach ops a step, each its own executable
    assert compiles[1:] == [0] * (len(compiles) - 1), compiles  # new lr, new step count: runtime inputs


def test_foreach_adam_bumps_the_version_of_what_it_writes():
    model = _model("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model[2](model[1](model[0](torch.randn(2, 6).to("neuron"))).double()).sum().backward()
    opt.step()  # the state exists from here
    before = [p._version for p in model.parameters()]
    before_state = [v._version for p in model.parameters() for k, v in opt.state[p].items() if k != "step"]
    opt.step()
    assert all(p._version > v for p, v in zip(model.parameters(), before))
    after_state = [v._version for p in model.parameters() for k, v in opt.state[p].items() if k != "step"]
    assert all(a > b for a, b in zip(after_state, before_state))


def test_capturable_and_cpu_steps_keep_torchs_own_path():
    """Step counts on the device (capturable) are torch's foreach ops, one executable each, and right (its
    bias corrections are float32 tensor math from float32 step counts: the float64 layer agrees to float32's
    precision)."""
    got, _, calls, _ = _train("neuron", torch.optim.AdamW, {"capturable": True}, steps=3)
    want, _, _, _ = _train("cpu", torch.optim.AdamW, {}, steps=3)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert min(calls) > 1, calls
