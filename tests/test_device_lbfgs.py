"""LBFGS on the ``neuron`` device: torch's own ``LBFGS.step`` with its two-loop recursion one device op and no
host read of its ``alpha=`` arguments (``device/lbfgs.py``: ``step``, ``direction``,
``_optim_hooks.LBFGS_DIRECTION``), and its ``_gather_flat_grad`` and ``_add_grad`` one op each, so an
iteration is a few fused runs of a few ops, with CPU's losses and parameters; torch's step itself op by op."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import _optim_hooks, lbfgs, op_queue, whole_ops


def _fit(device, steps=6, history=4, line_search=None, seed=0, never_stop=False, settle=False):
    """An MLP fit with LBFGS as users write it (a closure), as pytorch/examples does: the losses each step
    returns, the parameters after, and the queue's runs and queued ops each step took on the device.
    ``never_stop``: tolerances that never end a step early (every step runs ``max_iter`` iterations);
    ``settle``: the background builds are waited for after each step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(64, 4)
    y = (x[:, :1] * 2 - x[:, 1:2]).sin()
    model, x, y = model.to(device), x.to(device), y.to(device)
    tolerances = {"tolerance_grad": -1.0, "tolerance_change": -1.0} if never_stop else {}
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=history,
                            line_search_fn=line_search, **tolerances)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    losses, runs, queued = [], [], []
    for _ in range(steps):
        before = op_queue.COUNTS["runs"], op_queue.COUNTS["queued_ops"]
        losses.append(opt.step(closure).item())
        runs.append(op_queue.COUNTS["runs"] - before[0])
        queued.append(op_queue.COUNTS["queued_ops"] - before[1])
        if settle:
            op_queue.wait_for_builds()
    return losses, [p.detach().cpu() for p in model.parameters()], runs, queued


def test_lbfgs_step_is_routed_and_its_direction_block_is_found_in_torchs_source():
    assert getattr(torch.optim.LBFGS.step, "_neuron", False), "torch.optim.LBFGS.step is not routed"
    for name in ("_gather_flat_grad", "_add_grad"):
        assert getattr(getattr(torch.optim.LBFGS, name), "_neuron", False), f"LBFGS.{name} is not routed"
    torchs = _optim_hooks.LBFGS_STEP
    assert inspect.unwrap(torchs).__code__.co_filename == sys.modules["torch.optim.lbfgs"].__file__
    rewritten = _optim_hooks.lbfgs_step_with_direction(torchs, lbfgs.direction)
    code = inspect.unwrap(rewritten).__code__  # (under torch.no_grad(), as torch's)
    assert code.co_filename == sys.modules["torch.optim.lbfgs"].__file__  # tracebacks show torch's own lines
    assert code.co_firstlineno == inspect.unwrap(torchs).__code__.co_firstlineno
    assert "_neuron_direction" in code.co_names or any(
        "_neuron_direction" in getattr(c, "co_names", ()) for c in code.co_consts)
    # the lines after the block keep torch's numbers: "gtd = flat_grad.dot(d)" is on the same line in both
    torch_lines = inspect.getsourcelines(inspect.unwrap(torchs))
    line = torch_lines[1] + next(i for i, text in enumerate(torch_lines[0]) if "gtd = flat_grad.dot(d)" in text)
    assert line in {number for _, _, number in code.co_lines() if number is not None}


def test_a_torch_without_the_two_loop_block_is_named(monkeypatch):
    monkeypatch.setattr(_optim_hooks, "LBFGS_DIRECTION", "q = flat_grad.neg()\nnot in torch's source\n")
    with pytest.raises(RuntimeError, match="two-loop recursion"):
        _optim_hooks.lbfgs_step_with_direction(_optim_hooks.LBFGS_STEP, lbfgs.direction)


def _direction_inputs(history=3, n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(n, generator=g)
    dirs = [torch.randn(n, generator=g) for _ in range(history)]
    stps = [torch.randn(n, generator=g) for _ in range(history)]
    ro = [1.0 / d.dot(s).abs().add(1.0) for d, s in zip(dirs, stps)]
    return flat, dirs, stps, ro, torch.tensor(0.7)


@pytest.mark.parametrize("history", [1, 4])
def test_the_direction_op_gives_torchs_two_loop_recursion(history):
    """The op, once built, against torch's own loops on CPU (``LBFGS_DIRECTION`` run as torch wrote it), over
    calls with new values each time: the direction and the history's alphas."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    before = dict(whole_ops.COUNTS)
    for call in range(4):
        flat, dirs, stps, ro, h = _direction_inputs(history, seed=call)
        scope = {"torch": torch, "flat_grad": flat, "old_dirs": dirs, "old_stps": stps, "ro": ro, "H_diag": h,
                 "num_old": history, "al": [None] * 10}
        exec(_optim_hooks.LBFGS_DIRECTION, scope)  # noqa: S102 - torch's own lines, on CPU
        al = [None] * 10
        moved = [[t.to("neuron") for t in group] for group in (dirs, stps, ro)]
        d = lbfgs.direction(flat.to("neuron"), *moved, h.to("neuron"), al)
        # (a fused run's numbers: XLA contracts q + x * -a into an FMA where CPU rounds the product)
        assert_close(d.cpu(), scope["d"], rtol=1e-4, atol=1e-5)
        for got, want in zip(al[:history], scope["al"][:history]):
            assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
        op_queue.wait_for_builds()
    assert whole_ops.COUNTS["builds"] > before["builds"], "the direction was never built as one op"


def _step_ops(monkeypatch, ours: bool) -> list:
    """Ops queued a step of a short fit, with the device's LBFGS or with torch's own step and methods."""
    if not ours:
        monkeypatch.setattr(lbfgs, "_STEP", _optim_hooks.LBFGS_STEP)
        monkeypatch.setattr(lbfgs, "_queued", lambda params: False)
    queued = _fit("neuron", steps=8, never_stop=True, settle=True)[3]
    monkeypatch.undo()
    return queued


def test_an_lbfgs_step_queues_its_direction_and_flat_gradients_as_single_ops(monkeypatch):
    """With a full history of 4, torch's two-loop recursion queues 34 ops an iteration (its alphas read on the
    host), its parameter update 4 ``add_`` (besides their views); the device's step queues one op for each,
    once built, and one for the gradient gather's ``cat``."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    ours, torchs = _step_ops(monkeypatch, True), _step_ops(monkeypatch, False)
    assert ours[-1] == ours[-2] and torchs[-1] == torchs[-2], (ours, torchs)  # the steady state
    # per iteration (4 a step): 33 ops fewer in the recursion, 3 in the update
    assert torchs[-1] - ours[-1] >= 4 * (33 + 3), (ours, torchs)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_on_the_device_gives_cpus_fit_without_reading_its_alphas(line_search, monkeypatch):
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    want_losses, want_params, *_ = _fit("cpu", line_search=line_search)
    got_losses, got_params, runs, _ = _fit("neuron", line_search=line_search)
    assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)
    for got, want in zip(got_params, want_params):
        assert_close(got, want, rtol=2e-3, atol=2e-4)
    if line_search is None:
        # torch's step reads 2 alphas per history entry an iteration (up to 8 here) besides its 5 reads (the
        # loss, the curvature and descent tests, the optimality and progress checks); without them an
        # iteration's runs are its own reads
        assert max(runs[2:]) <= 4 * 5 + 2, runs
        monkeypatch.setattr(lbfgs, "_STEP", _optim_hooks.LBFGS_STEP)  # torch's own step, queued
        torchs_losses, _, torchs, _ = _fit("neuron", line_search=line_search)
        assert min(torchs[2:]) > max(runs[2:]) + 4, (runs, torchs)  # its alpha reads: one queue run each
        assert_close(torch.tensor(torchs_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)
