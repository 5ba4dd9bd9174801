"""LBFGS on the ``neuron`` device (``device/lbfgs.py``): without a line search, torch's step mirrored with its
reads gathered, two an iteration (``fixed_step``); with one, torch's own ``LBFGS.step`` with its two-loop
recursion one device op and no host read of its ``alpha=`` arguments (``step``, ``direction``,
``_optim_hooks.LBFGS_DIRECTION``); ``_gather_flat_grad`` and ``_add_grad`` one op each. An iteration is a few
fused runs of a few ops, with CPU's losses, parameters and state; torch's step itself op by op."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import _optim_hooks, lbfgs, op_queue, whole_ops


def _fit(device, steps=6, history=4, line_search=None, seed=0, never_stop=False, settle=False, reads=None,
         hidden=16, **options):
    """An MLP fit with LBFGS as users write it (a closure), as pytorch/examples does: the losses each step
    returns, the parameters after, and the queue's runs and queued ops each step took on the device.
    ``never_stop``: tolerances that never end a step early (every step runs ``max_iter`` iterations);
    ``settle``: the background builds are waited for after each step; ``reads``: a list that gets the host
    reads each step made with the iterations so far, then the optimizer's state; ``hidden``: the MLP's width;
    ``options``: LBFGS's (``max_iter`` 4 unless given)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    x = torch.randn(64, 4)
    y = (x[:, :1] * 2 - x[:, 1:2]).sin()
    model, x, y = model.to(device), x.to(device), y.to(device)
    options = {"max_iter": 4, **options, **({"tolerance_grad": -1.0, "tolerance_change": -1.0} if never_stop else {})}
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, history_size=history, line_search_fn=line_search, **options)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    losses, runs, queued = [], [], []
    for _ in range(steps):
        before = op_queue.COUNTS["runs"], op_queue.COUNTS["queued_ops"], op_queue.COUNTS["host_reads"]
        loss = opt.step(closure)
        runs.append(op_queue.COUNTS["runs"] - before[0])
        queued.append(op_queue.COUNTS["queued_ops"] - before[1])
        if reads is not None:  # (the step's reads, the iterations so far)
            reads.append((op_queue.COUNTS["host_reads"] - before[2], opt.state[opt._params[0]].get("n_iter", 0)))
        losses.append(loss.item())
        if settle:
            op_queue.wait_for_builds()
    if reads is not None:
        reads.append(opt.state[next(iter(model.parameters()))])  # the optimizer's state, last
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


def _torchs_step(monkeypatch) -> None:
    """The device runs torch's own ``LBFGS.step`` (queued), not ``fixed_step`` or its two-loop call."""
    monkeypatch.setattr(lbfgs, "_STEP", _optim_hooks.LBFGS_STEP)
    monkeypatch.setattr(lbfgs, "fixed_step", lambda self, closure: _optim_hooks.LBFGS_STEP(self, closure))


def _step_ops(monkeypatch, ours: bool) -> list:
    """Ops queued a step of a short fit, with the device's LBFGS or with torch's own step and methods."""
    if not ours:
        _torchs_step(monkeypatch)
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


def test_a_fits_first_step_builds_the_kernels_torchs_step_builds(monkeypatch):
    """Until its device ops are built (from their second turn, in the background), the fixed step runs
    torch's own ops and reads: a cold first step compiles no kernel that torch's step, op by op, does not;
    the one exception is the two-loop's ``q + x * -a``, which keeps its alphas on the device (torch reads
    each ``alpha=``). Before, the packed read's stack, casts and tolerance subtractions were 4 kernels more."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    from neuron_compile.device import ops

    def aten_kernels():
        return {key for key in [*ops._KERNELS, *ops._OLDER] if str(ops._OPS[key[0]]).startswith("aten.")}

    op_queue.set_enabled(False)  # torch's step, op by op
    try:
        _fit("neuron", steps=1, hidden=23)  # (a width no other test uses: these kernels are this test's)
    finally:
        op_queue.set_enabled(True)
    torchs = aten_kernels()
    _fit("neuron", steps=1, hidden=23, seed=1)
    op_queue.wait_for_builds()
    more = [(str(ops._OPS[key[0]]), key[1]) for key in aten_kernels() - torchs]
    assert [name for name, _ in more] in ([], ["aten.add_.Tensor"]), more


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_on_the_device_gives_cpus_fit_without_reading_its_alphas(line_search, monkeypatch):
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    want_losses, want_params, *_ = _fit("cpu", line_search=line_search)
    # (the builds waited for: until its kernel is built, the device reads as torch does)
    got_losses, got_params, runs, _ = _fit("neuron", line_search=line_search, settle=True)
    assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)
    for got, want in zip(got_params, want_params):
        assert_close(got, want, rtol=2e-3, atol=2e-4)
    if line_search is None:
        # torch's step reads 2 alphas per history entry an iteration (up to 8 here) besides its 5 reads (the
        # loss, the curvature and descent tests, the optimality and progress checks); the device's reads the
        # loss and the three tests after it together, then the descent test: an iteration's runs are its 2 reads
        assert max(runs[2:]) <= 4 * 2 + 2, runs
        _torchs_step(monkeypatch)  # torch's own step, queued
        torchs_losses, _, torchs, _ = _fit("neuron", line_search=line_search)
        assert min(torchs[2:]) > max(runs[2:]) + 3 * 4, (runs, torchs)  # its alpha reads and 3 more an iteration
        assert_close(torch.tensor(torchs_losses), torch.tensor(want_losses), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("options", [
    {},  # torch's default tolerances
    {"tolerance_change": 1e-3},  # the descent, progress and loss-change tests end steps early
    {"tolerance_grad": 2e-2},  # the optimality test: a step that returns at once, too
    {"max_iter": 5, "max_eval": 3},
    {"max_iter": 1},
], ids=["defaults", "tolerance_change", "tolerance_grad", "max_eval", "max_iter=1"])
def test_the_fixed_step_takes_torchs_iterations_and_reads_once_an_iteration(options):
    """``fixed_step`` against torch's ``LBFGS.step`` on CPU: where each step stops (iterations, evaluations,
    history length: the tests it reads ahead decide as torch's do), the losses, the state and the parameters;
    and its host reads once its ops are built, at most 1 an iteration and 1 more a step (torch's: 5 an
    iteration): the next iteration's direction and descent test are computed with the loss's tests."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    runs = {}
    for device in ("cpu", "neuron"):
        reads = []
        losses, params, *_ = _fit(device, steps=7, history=2, seed=3, reads=reads, settle=True, **options)
        runs[device] = losses, params, reads[:-1], reads[-1]
    (want_losses, want_params, _, want), (got_losses, got_params, reads, got) = runs["cpu"], runs["neuron"]
    assert (got["n_iter"], got["func_evals"], len(got["old_dirs"])) == (
        want["n_iter"], want["func_evals"], len(want["old_dirs"]))
    # a rounding difference grows about 10x a step as the fit converges: from 1e-7 at the first step to
    # 2.5e-4 and 3.8e-4 at the seventh (defaults, tolerance_grad) on an AVX-512 Xeon, where torch's own step
    # op by op on the device reaches 6e-5; the stops above are the exact check
    assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-3, atol=1e-6)
    for got_param, want_param in zip(got_params, want_params):
        assert_close(got_param, want_param, rtol=2e-3, atol=2e-4)
    # the curvature pair y is a difference of nearly equal gradients once the fit converges: torch's own step,
    # queued on the device, ends the default case's 7 steps with H_diag 3% from CPU's (this one, 1%)
    for key in ("d", "prev_flat_grad", "H_diag"):
        if isinstance(want[key], torch.Tensor):
            assert_close(got[key].cpu(), want[key], rtol=5e-2, atol=1e-3)
    assert got["t"] == pytest.approx(float(want["t"]), rel=1e-5) and got["prev_loss"] == pytest.approx(
        want["prev_loss"], rel=1e-3)
    # after the first step (whose first iteration reads its step size t = min(1, 1 / |g|.sum()) * lr, then
    # torch's _add_grad reads it again, as an alpha, once a parameter; and which builds the ops): 1 an
    # iteration, and 1 a step (its first evaluation, or the last iteration's, which runs no closure)
    iterations = reads[-1][1] - reads[0][1]
    assert sum(count for count, _ in reads[1:]) <= iterations + len(reads) - 1, reads


def test_a_fit_whose_curvature_pairs_are_refused_gives_cpus_fit(monkeypatch):
    """An L1 loss: its gradient changes only where a sign does, so many curvature pairs have ``ys`` 0 and
    torch refuses them (``ys > 1e-10``). The direction ``evaluate`` computed ahead assumed the pair accepted:
    for a refused one the iteration computes its own, and reads its descent test itself. CPU's losses,
    parameters and history, with refused and accepted pairs both taken."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    pairs = {True: 0, False: 0}
    evaluate = lbfgs.evaluate

    def counted(*args, **kwargs):
        found = evaluate(*args, **kwargs)
        if found[4] is not None:
            pairs[found[4][2]] += 1
        return found

    monkeypatch.setattr(lbfgs, "evaluate", counted)
    fits = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(1)
        w = torch.nn.Parameter(torch.randn(6).to(device))
        c = torch.randn(6).to(device)
        opt = torch.optim.LBFGS([w], lr=0.5, max_iter=4, history_size=3)

        def closure():
            opt.zero_grad()
            loss = (w - c).abs().sum()
            loss.backward()
            return loss

        losses = []
        for _ in range(6):
            losses.append(opt.step(closure).item())
            op_queue.wait_for_builds()
        state = opt.state[w]
        fits[device] = losses, w.detach().cpu(), (state["n_iter"], len(state["old_dirs"]))
    assert pairs[True] and pairs[False], pairs  # (the device's pairs)
    (want_losses, want, want_state), (got_losses, got, got_state) = fits["cpu"], fits["neuron"]
    assert got_state == want_state
    assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-5)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_fixed_step_with_a_parameter_the_loss_does_not_use_gives_cpus_fit():
    """A parameter without a gradient (torch's flat gradient holds zeros for it): ``evaluate`` takes torch's
    gather, with CPU's losses and parameters."""
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process: torch's own step runs")
    fits = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 1)
        unused = torch.nn.Parameter(torch.randn(3))
        x, y = torch.randn(32, 4), torch.randn(32, 1)
        model, x, y = model.to(device), x.to(device), y.to(device)
        unused = torch.nn.Parameter(unused.detach().to(device))
        opt = torch.optim.LBFGS([*model.parameters(), unused], lr=0.5, max_iter=4)

        def closure():
            opt.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            return loss

        losses = [opt.step(closure).item() for _ in range(4)]
        fits[device] = losses, [p.detach().cpu() for p in (*model.parameters(), unused)]
    assert_close(torch.tensor(fits["neuron"][0]), torch.tensor(fits["cpu"][0]), rtol=2e-4, atol=1e-6)
    for got, want in zip(fits["neuron"][1], fits["cpu"][1]):
        assert_close(got, want, rtol=2e-3, atol=2e-4)
