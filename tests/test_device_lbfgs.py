"""LBFGS on the ``neuron`` device: torch's own ``LBFGS.step`` with its ``alpha=`` host reads issued as tensor
products (``device/optim.lbfgs_step``, ``_optim_hooks.LBFGS_REWRITES``), so an iteration's ops run in a few
fused runs, with CPU's losses and parameters; torch's step itself op by op."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import _optim_hooks, op_queue, optim


def _fit(device, steps=6, history=4, line_search=None, seed=0):
    """An MLP fit with LBFGS as users write it (a closure), as pytorch/examples does: the losses each step
    returns, the parameters after, and the queue's runs each step took on the device."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(64, 4)
    y = (x[:, :1] * 2 - x[:, 1:2]).sin()
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=history,
                            line_search_fn=line_search)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    losses, runs = [], []
    for _ in range(steps):
        before = op_queue.COUNTS["runs"]
        losses.append(opt.step(closure).item())
        runs.append(op_queue.COUNTS["runs"] - before)
    return losses, [p.detach().cpu() for p in model.parameters()], runs


def test_lbfgs_step_is_routed_and_its_rewrites_find_torchs_lines():
    assert getattr(torch.optim.LBFGS.step, "_neuron", False), "torch.optim.LBFGS.step is not routed"
    torchs = _optim_hooks.LBFGS_STEP
    assert inspect.unwrap(torchs).__code__.co_filename == sys.modules["torch.optim.lbfgs"].__file__
    rewritten = _optim_hooks.lbfgs_step_without_reads(torchs)
    code = inspect.unwrap(rewritten).__code__  # (under torch.no_grad(), as torch's)
    assert code.co_filename == sys.modules["torch.optim.lbfgs"].__file__  # tracebacks show torch's own lines
    assert code.co_firstlineno == inspect.unwrap(torchs).__code__.co_firstlineno
    for old, new in _optim_hooks.LBFGS_REWRITES:
        assert "alpha=" in old and "alpha=" not in new


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_on_the_device_gives_cpus_fit_without_reading_its_alphas(line_search, monkeypatch):
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    want_losses, want_params, _ = _fit("cpu", line_search=line_search)
    got_losses, got_params, runs = _fit("neuron", line_search=line_search)
    assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)
    for got, want in zip(got_params, want_params):
        assert_close(got, want, rtol=2e-3, atol=2e-4)
    if line_search is None:
        # torch's step reads 2 alphas per history entry an iteration (up to 8 here) besides its 5 reads (the
        # loss, the curvature and descent tests, the optimality and progress checks); without them an
        # iteration's runs are its own reads
        assert max(runs[2:]) <= 4 * 5 + 2, runs
        monkeypatch.setattr(optim, "_LBFGS_STEP", _optim_hooks.LBFGS_STEP)  # torch's own step, queued
        torchs_losses, _, torchs = _fit("neuron", line_search=line_search)
        assert min(torchs[2:]) > max(runs[2:]) + 4, (runs, torchs)  # its alpha reads: one queue run each
        assert_close(torch.tensor(torchs_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)
