"""Precompile: a new process loads Dynamo's and AOTAutograd's output instead of tracing.

Each test runs a script twice in fresh processes sharing one cache folder
(ours) and one PyTorch cache folder (Dynamo's packages), with
NEURON_COMPILE_PRECOMPILE=1. The second process must do no Dynamo/AOTAutograd
trace (our graph compilers are never called), no lowering and no XLA compile,
and still match eager; a package written under other options is refused and
traced afresh; a package whose artifacts were evicted recompiles from the
pickled graph without tracing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import copy, functools, json, sys
    import torch
    import neuron_compile
    from neuron_compile.report import COUNTERS

    def scaled(factor):  # a decorator chain like transformers' on every forward
        def decorate(fn):
            @functools.wraps(fn)
            def inner(self, x):
                return fn(self, x) * factor
            return inner
        return decorate

    def passthrough(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            return fn(self, *args, **kwargs)
        return wrapper

    class Decorated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        @passthrough
        @scaled(2.0)
        def forward(self, x):
            return self.fc(x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    TRAIN = sys.argv[1] == "train"
    ATTENTION = sys.argv[1] == "attention"
    OPAQUE = sys.argv[1] == "opaque"

    @torch._dynamo.allow_in_graph
    def doubled(t):  # a call AOTAutogradCache does not know, so it will not save the graph
        return t * 2

    def step(x):
        if ATTENTION:  # goes through our SDPA rewrite, which we vouch for to AOTAutogradCache
            h = model[0](x).reshape(8, 4, 8)
            return torch.nn.functional.scaled_dot_product_attention(h, h, h)
        if OPAQUE:
            return doubled(model(x))
        return model(x).square().mean() if TRAIN else model(x)

    if sys.argv[1] == "decorated":  # a module compile: Dynamo's frame is the outer wrapper
        step = Decorated()
    elif sys.argv[1] == "wrapped-elsewhere":  # a decorator from another module: see WRAPPING
        from wrapping import doubled_output

        step = doubled_output(step)
    elif sys.argv[1] == "optimizer":  # a whole training step, AdamW's update included
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return loss
    elif sys.argv[1] == "decorated-inlined":  # the same wrappers, reached through the class: saveable
        decorated = Decorated()

        def step(x):
            return decorated(x)
    compiled = torch.compile(step, backend="neuron")
    if sys.argv[1] == "device":  # on neuron tensors: the loaded executable gives neuron tensors too
        cpu_model = copy.deepcopy(model)
        model.to("neuron")
        with torch.no_grad():
            for inp in (x, torch.randn(8, 16)):
                got = compiled(inp.to("neuron"))
                assert got.device.type == "neuron", got.device
                torch.testing.assert_close(got.cpu(), cpu_model(inp), rtol=1e-5, atol=1e-6)
    elif sys.argv[1] == "optimizer":
        twin = copy.deepcopy(model)
        compiled_losses = [compiled(x) for _ in range(3)]
        model.load_state_dict(twin.state_dict())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # step() finds the new one: a global
        for got in compiled_losses:
            torch.testing.assert_close(got, step(x), rtol=1e-5, atol=1e-6)
    elif TRAIN:
        loss = compiled(x)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        step(x).backward()
        for got, want in zip(grads, (p.grad for p in model.parameters())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), step(x), rtol=1e-5, atol=1e-6)
            x2 = torch.randn(8, 16)
            torch.testing.assert_close(compiled(x2), step(x2), rtol=1e-5, atol=1e-6)
    result = dict(neuron_compile.cache_stats()["process"])  # the public counters, precompile's among them
    result["graphs"] = COUNTERS["graphs"]  # graphs our compilers were handed: traced by Dynamo + AOTAutograd
    print("RESULT " + json.dumps(result))
''')


# functools.wraps gives the wrapper the module name of the function it wraps (the script's),
# while the wrapper's code runs in this module's globals
WRAPPING = textwrap.dedent('''
    import functools

    def doubled_output(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return fn(x) * 2
        return wrapper
''')


def _run(tmp_path: Path, mode: str, **env) -> dict:
    script = tmp_path / "precompiled_model.py"
    if not script.exists():
        script.write_text(SCRIPT)
        (tmp_path / "wrapping.py").write_text(WRAPPING)
    full_env = dict(os.environ, NEURON_COMPILE_PRECOMPILE="1", NEURON_COMPILE_CACHE_DIR=str(tmp_path / "nc"),
                    TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "torch"), PYTHONPATH=str(ROOT), **env)
    for name in ("NEURON_COMPILE_CACHE", "NEURON_COMPILE_PASSES", "TORCH_COMPILE_DISABLE"):
        if name not in env:
            full_env.pop(name, None)
    done = subprocess.run([sys.executable, str(script), mode], env=full_env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]), stderr=done.stderr)


@pytest.mark.parametrize("mode", ["infer", "train", "device"])
def test_second_process_does_not_trace_lower_or_compile(tmp_path, mode):
    first = _run(tmp_path, mode)
    assert first["graphs"] >= 1 and first["xla_compiles"] >= 1 and first["precompile_saves"] >= 1
    # PyTorch warns once per identity guard it drops; we let the first through, explained, and count
    dropped = [ln for ln in first["stderr"].splitlines() if "is dropped with caching_precompile=True" in ln]
    assert len(dropped) == 1 and "neuron_compile shows only this first one" in dropped[0], first["stderr"]
    assert first["precompile_dropped_guards"] >= 2, first
    second = _run(tmp_path, mode)
    assert second["graphs"] == 0, second  # no Dynamo/AOTAutograd trace reached our compilers
    assert second["lowerings"] == 0 and second["xla_compiles"] == 0, second
    assert second["precompile_loads"] == first["graphs"], (first, second)
    assert second["disk_hits"] == first["misses"], (first, second)


def test_package_saved_under_other_options_is_refused(tmp_path):
    _run(tmp_path, "infer")
    other = _run(tmp_path, "infer", NEURON_COMPILE_PASSES="none")
    assert other["precompile_stale"] >= 1, other
    assert other["graphs"] >= 1 and other["xla_compiles"] >= 1, other  # traced and compiled afresh


def test_evicted_artifacts_recompile_from_the_package_without_tracing(tmp_path):
    import shutil

    first = _run(tmp_path, "infer")
    shutil.rmtree(tmp_path / "nc")
    second = _run(tmp_path, "infer")
    assert second["graphs"] == 0 and second["precompile_loads"] == first["graphs"], second
    assert second["lowerings"] == first["lowerings"] and second["xla_compiles"] == first["xla_compiles"], second


def test_a_graph_precompile_cannot_save_is_named_not_silent(tmp_path):
    # AOTAutogradCache refuses graphs calling functions it does not know: nothing is saved, and
    # the next process traces again. That must be said, with the reason.
    first = _run(tmp_path, "opaque")
    assert first["precompile_bypasses"] == 1, first
    assert "precompile cannot save graph g0" in first["stderr"] and "doubled" in first["stderr"], first["stderr"]
    second = _run(tmp_path, "opaque")
    assert second["graphs"] >= 1 and second["precompile_loads"] == 0, second  # traced again, as warned


def test_graphs_with_our_sdpa_rewrite_are_saved(tmp_path):
    # scaled_dot_product_attention becomes a call to our _sdpa_math before AOTAutograd; we vouch
    # for it under our tag, so the graph is saved and the next process does not trace it
    first = _run(tmp_path, "attention")
    assert first["precompile_bypasses"] == 0 and first["precompile_saves"] >= 1, first
    second = _run(tmp_path, "attention")
    assert second["graphs"] == 0 and second["precompile_loads"] == first["graphs"], second


@pytest.mark.parametrize("mode, reason", [
    # PyTorch 2.13 saves a guard through the inner functools.wraps wrapper (its closure's constant)
    # as a placeholder, then raised AttributeError inside the next process's torch.compile
    ("decorated", "PyTorch 2.13 would save a guard it cannot load"),
    # PyTorch 2.13 installs a saved frame in the module its function's __module__ names, which
    # functools.wraps copied from the script: the next process raised NameError on the
    # __compiled_fn it had put in the wrong module
    ("wrapped-elsewhere", "in module '__main__' while its code runs in 'wrapping'"),
])
def test_a_package_that_would_crash_the_next_process_is_not_saved(tmp_path, mode, reason):
    # such a frame is kept out of the package, with a warning: the next process traces again, and runs
    first = _run(tmp_path, mode)
    assert first["precompile_bypasses"] == 1, first
    assert reason in first["stderr"], first["stderr"]
    second = _run(tmp_path, mode)  # _run asserts the process exits 0
    assert second["graphs"] >= 1 and second["precompile_loads"] == 0, second
    assert second["xla_compiles"] == 0, second  # the artifact cache still serves the executable


def test_decorated_forward_reached_through_its_class_still_saves(tmp_path):
    # Called from a compiled function, the same wrappers are reached through the model's class,
    # which the next process looks up afresh: the package is saved and loads
    first = _run(tmp_path, "decorated-inlined")
    assert first["precompile_bypasses"] == 0, first
    second = _run(tmp_path, "decorated-inlined")
    assert second["graphs"] == 0 and second["precompile_loads"] == first["graphs"], second


def test_a_compiled_optimizer_step_runs_eagerly_rather_than_crash(tmp_path):
    # AdamW's step carries a CLASS_MATCH guard on type(param) that PyTorch 2.13 can neither drop
    # nor save: with caching precompile on, Dynamo stopped on "check_fn.guards_state must not be
    # None" (Inductor too). Those frames run eagerly, with one warning per place; the model's own
    # graphs are saved and the next process loads them.
    first = _run(tmp_path, "optimizer")
    assert first["precompile_skipped_frames"] >= 1 and first["precompile_saves"] >= 1, first
    warnings = [ln for ln in first["stderr"].splitlines() if "runs eagerly: with precompile on" in ln]
    assert len(warnings) == 1 and "CLASS_MATCH guard on type(" in warnings[0], first["stderr"]
    second = _run(tmp_path, "optimizer")
    assert second["graphs"] == 0 and second["precompile_loads"] >= 2, second
