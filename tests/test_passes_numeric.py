"""Numeric tests: every pass, and the profiles, on realistic lowered modules
(MLP, attention block, layer norm, RMS norm, conv; the backend's TinyGPT),
run through XLA and through the StableHLO reference interpreter, equal to the
unpassed module; plus counts of how often each pass fired."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).parent / "passes"))

from pass_models import MODELS, lower, lowered, run_interpreter, run_xla  # noqa: E402

from neuron_compile.passes import parse_pipeline  # noqa: E402

TOL = dict(rtol=2e-5, atol=2e-5)
# The interpreter is slow on 128-padded matmuls; it checks the same rewrite at 32.
XLA_PIPELINES = [
    "canonicalize",
    "pad-to-multiple{max-ratio=inf}",
    "pad-to-multiple{max-ratio=inf,free-dims=both}",
    "fuse",
    "default",
    "neuron",
]
INTERP_PIPELINES = [
    "canonicalize",
    "pad-to-multiple{multiple=32,max-ratio=inf,free-dims=both}",
    "fuse",
    "canonicalize,pad-to-multiple{multiple=32,max-ratio=inf},fuse",
]


@functools.lru_cache(maxsize=None)
def model(name):
    text, inputs, eager = lowered(name)
    return text, inputs, eager


@functools.lru_cache(maxsize=None)
def reference(name, executor):
    text, inputs, _ = model(name)
    return (run_xla if executor == "xla" else run_interpreter)(text, inputs)


def run(name, spec):
    text, _, _ = model(name)
    out, stats = parse_pipeline(spec).run_on_text(text, verify_each=True)
    return out, {s.name: s for s in stats}


@pytest.mark.parametrize("spec", XLA_PIPELINES)
@pytest.mark.parametrize("name", MODELS)
def test_xla_equal_to_unpassed(name, spec):
    out, _ = run(name, spec)
    _, inputs, eager = model(name)
    got = run_xla(out, inputs)
    want = reference(name, "xla")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, **TOL)
    assert_close(got[0], eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", INTERP_PIPELINES)
@pytest.mark.parametrize("name", MODELS)
def test_interpreter_equal_to_unpassed(name, spec):
    out, _ = run(name, spec)
    _, inputs, _ = model(name)
    for g, w in zip(run_interpreter(out, inputs), reference(name, "interpreter")):
        assert_close(g, w, **TOL)


# (model) -> (padded ops under `neuron`, regions by kind under `neuron`)
EXPECTED = {
    "mlp": (2, {"matmul_epilogue": 2}),
    "attention": (2, {"attention": 1}),
    "layer_norm": (0, {"layer_norm": 1}),
    "rms_norm": (0, {"rms_norm": 1}),
    "conv": (1, {"conv_epilogue": 1}),
}


@pytest.mark.parametrize("name", MODELS)
def test_counts_under_neuron_profile(name):
    out, stats = run(name, "neuron")
    padded, regions = EXPECTED[name]
    assert stats["pad-to-multiple"].fired == padded
    assert stats["fuse"].details["regions"] == regions
    assert stats["fuse"].fired == sum(regions.values())
    assert stats["fuse"].details["bytes_saved"] > 0
    assert out.count("stablehlo.composite") == sum(regions.values())
    assert stats["canonicalize"].details.get("arith_constants", 0) >= 0


def test_unprofitable_padding_is_skipped():
    # attention's 20x48 matmuls: padding to 128 is > 4x the work
    _, stats = run("attention", "pad-to-multiple{max-ratio=4.0}")
    assert stats["pad-to-multiple"].fired == 0
    assert stats["pad-to-multiple"].details["unprofitable"] == 2


def test_backend_tiny_gpt_gets_attention_and_padded_matmuls():
    import torch

    from neuron_compile.cli import models
    from torch.func import functional_call

    torch.manual_seed(0)
    net = models.TinyGPT(models.GPTConfig(vocab_size=200, n_positions=32, n_embd=48, n_layer=2)).eval()
    state = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    names = list(state)
    ids = torch.randint(0, 200, (2, 32))

    def fn(*args):
        *ws, x = args
        return functional_call(net, dict(zip(names, ws)), (x,))

    inputs = [v.detach() for v in state.values()] + [ids]
    with torch.no_grad():
        text = lower(fn, *inputs)
        eager = fn(*inputs).numpy()
    out, stats = parse_pipeline("neuron").run_on_text(text, verify_each=True)
    stats = {s.name: s for s in stats}
    assert stats["fuse"].details["regions"].get("attention") == 2
    assert stats["fuse"].details["regions"].get("layer_norm", 0) >= 4
    assert stats["pad-to-multiple"].fired > 0
    np_inputs = [t.numpy() for t in inputs]
    assert_close(run_xla(out, np_inputs)[0], eager, rtol=1e-4, atol=1e-4)
