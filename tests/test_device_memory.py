"""``torch.neuron`` memory counters while compiled graphs run on device buffers.

The counters count the bytes of every live neuron storage's PJRT buffer, so
after a compiled training step they must account exactly for the parameters,
their gradients and nothing else, and the peak must cover what the step kept
alive at once (the activations the forward saved for the backward).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_max_memory_allocated_during_a_compiled_training_step():
    # the counters are the process's: other tests' neuron tensors may still be alive, so every figure
    # is taken against the count before this test's own tensors exist, with the cycle collector held
    gc.collect()
    gc.disable()
    try:
        _compiled_training_step_memory(torch.neuron.memory_allocated())
    finally:
        gc.enable()


def _compiled_training_step_memory(start: int):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    x = torch.randn(32, 64)
    xn = x.to("neuron")
    compiled = torch.compile(model)  # no backend named: neuron tensors go to the neuron backend
    params = _nbytes(model.parameters())
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert base - start == params + _nbytes([xn])
    loss = compiled(xn).pow(2).mean()
    loss.backward()
    loss_cpu = ref(x).pow(2).mean()
    loss_cpu.backward()
    assert_close(loss.cpu(), loss_cpu.detach())
    del loss
    grads = _nbytes(p.grad for p in model.parameters())
    assert grads == params
    assert torch.neuron.memory_allocated() == base + grads
    # at the peak the forward's saved activations (GELU's input and output: 32 x 256 floats each,
    # at least one of them) lived beside the parameters, the input and the first gradients
    peak = torch.neuron.max_memory_allocated()
    assert peak >= base + 32 * 256 * 4 and peak >= base + grads
    for p in model.parameters():
        p.grad = None
    assert torch.neuron.memory_allocated() == base
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), p_ref.detach())


def test_a_foreach_optimizer_step_runs_one_op(monkeypatch):
    """torch's foreach kernels for a backend without its own loop one op per tensor; ours run the
    whole list as one op, and AdamW's whole foreach step is one: a step over 20 parameters is one
    executable, not 20 x 6. ``clip_grad_norm_``'s foreach ops before it stay one op each."""
    from neuron_compile.device import ops

    torch.manual_seed(0)
    ref = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(10)])
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(10)])
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1, foreach=True) for m in (ref, model)]
    dispatched = []
    original = ops.dispatch
    monkeypatch.setattr(ops, "dispatch", lambda op, *a: dispatched.append(op) or original(op, *a))
    per_step = []
    for step in range(3):
        x = torch.randn(4, 8)
        for m, opt, inp in ((ref, opts[0], x), (model, opts[1], x.to("neuron"))):
            opt.zero_grad()
            m(inp).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)  # _foreach_norm, _foreach_mul_
            before = len(dispatched)
            opt.step()
            if m is model:
                per_step.append(len(dispatched) - before)
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-6)
    # AdamW's whole foreach step is one op (device/optim.py; torch's path: one op per foreach call, and
    # one op per tensor was 20 x 6 and more)
    assert [str(op) for op in dispatched[-per_step[-1]:]] == ["neuron_compile._foreach_adam_.default"]
    assert per_step[1:] == [1, 1], per_step  # the first step also makes the moment buffers (zeros_like)


_MAPPINGS_SCRIPT = r"""
import json, sys, warnings, torch
from neuron_compile import compiler
from neuron_compile.device import ops
from neuron_compile.runtime import executor

kept, lengths, allowance = (int(value) for value in sys.argv[1:4])
ops.KERNELS_KEPT = compiler.MEMORY.limit = kept

def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)

hot_cpu = torch.arange(7.0)
hot = hot_cpu.to("neuron")
torch.neuron.synchronize()
before, compiles = mappings(), ops.COUNTS["op_compiles"]
if allowance:  # as if vm.max_map_count were low: its MAPPINGS_HIGH share reached `allowance` mappings from here
    real = executor.mappings
    limit = int((before + allowance) / executor.MAPPINGS_HIGH)
    executor.mappings = lambda: (real()[0], limit)
    executor.MAPPINGS_EVERY = 8
ok, peak = True, 0
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in range(1, lengths + 1):  # new kernels each length (arange, mul, add, sum), one kernel used all along
        a = torch.arange(float(n + 8), device="neuron")
        ok &= (a * 2 + 1).sum().item() == float(sum(2 * i + 1 for i in range(n + 8)))
        ok &= torch.equal((hot * 3).cpu(), hot_cpu * 3)
        peak = max(peak, mappings() - before)
print(json.dumps({"mappings": mappings() - before, "peak": peak, "compiles": ops.COUNTS["op_compiles"] - compiles,
                  "dropped": ops.COUNTS["kernels_dropped"], "releases": ops.COUNTS["mapping_releases"],
                  "warnings": [[str(w.message), w.filename, w.lineno] for w in caught], "ok": bool(ok)}))
"""


def _mappings_run(tmp_path, kept: int, lengths: int, allowance: int = 0) -> dict:
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / f"cache{kept}-{allowance}"))
    out = subprocess.run([sys.executable, "-c", _MAPPINGS_SCRIPT, str(kept), str(lengths), str(allowance)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory mappings in /proc (Linux)")
def test_a_process_building_ever_new_kernels_keeps_its_memory_mappings_bounded(tmp_path):
    # every XLA executable holds ~4 memory mappings; a process that kept every kernel it built reached
    # vm.max_map_count and XLA crashed (PyTorch's test_modules.py on the device). Kept two generations of
    # KERNELS_KEPT kernels (and as many executables in the compile cache's memory), the count stays bounded,
    # and the kernel in use all along is never dropped (compiled once: no recompile storm)
    bounded, kept = _mappings_run(tmp_path, 20, 120), _mappings_run(tmp_path, 100000, 120)
    assert bounded["ok"] and kept["ok"], (bounded, kept)
    assert kept["dropped"] == 0 and bounded["dropped"] > 300, (bounded, kept)
    assert bounded["compiles"] == kept["compiles"] >= 3 * 120 + 1, (bounded, kept)  # each signature once, the hot one too
    assert kept["mappings"] > 4 * 360, (bounded, kept)  # the unbounded process holds every executable's mappings
    assert bounded["mappings"] < kept["mappings"] / 3, (bounded, kept)




@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory mappings in /proc (Linux)")
def test_near_the_kernels_mapping_limit_the_device_lets_go_of_its_executables_and_says_so(tmp_path):
    # the kernels' bound is by count (KERNELS_KEPT); what a process holds beyond it (compiled graphs, a test
    # file's thousands of signatures) is caught by counting the mappings themselves: past MAPPINGS_HIGH of
    # vm.max_map_count the device drops what it holds for reuse, warns once, and computes on, right
    got = _mappings_run(tmp_path, 100000, 40, allowance=150)  # no bound by count: the mappings' own check alone
    assert got["ok"], got
    assert got["releases"] >= 1, got
    # 40 lengths hold some 3 x 40 executables, 500 mappings and more kept; let go near 150, counted every 8
    # executables made (at most 10 mappings each): the peak stays near the allowance
    assert got["peak"] < 150 + 8 * 10 + 100, got
    assert len(got["warnings"]) == 1 and "vm.max_map_count" in got["warnings"][0][0], got  # said once
    _, filename, line = got["warnings"][0]
    loop = [n + 1 for n, text in enumerate(_MAPPINGS_SCRIPT.splitlines()) if text.startswith(" " * 8)]
    assert filename == "<string>" and line in loop, got  # the user's line whose op crossed the mark
    # each signature traced once (4 kernels a length, and the hot one): after a release the hot kernel comes
    # back from the op index and the artifact cache, not traced again
    assert got["compiles"] == 4 * 40 + 1, got


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory mappings in /proc (Linux)")
def test_mapping_pressure_counts_once_per_batch_of_executables_made(monkeypatch):
    from neuron_compile.runtime import executor

    count, limit = executor.mappings()
    with open("/proc/sys/vm/max_map_count") as f:
        assert limit == int(f.read())
    assert 0 < count < limit
    monkeypatch.setattr(executor, "MAPPINGS_HIGH", 0.0)  # any count is past the share: reported when counted
    assert executor.mapping_pressure(force=True)[1] == limit
    assert executor.mapping_pressure() is None  # counted just now: not again until MAPPINGS_EVERY more are made
    monkeypatch.setattr(executor, "_MADE", executor._MADE + executor.MAPPINGS_EVERY)
    assert executor.mapping_pressure() is not None
    monkeypatch.setattr(executor, "MAPPINGS_HIGH", 1.0)
    assert executor.mapping_pressure(force=True) is None
