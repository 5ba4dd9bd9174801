"""Kernels (neuron_compile.kernels): custom ops and fuse composites served by registered kernels.

Against eager PyTorch: a custom op with a JAX kernel compiled in a model (inference and training,
the backward through its backward kernel), a composite swapped by name (golden StableHLO and
numerics), a kernel package found through its entry point (a fake distribution on sys.path), the
shipped attention kernel, the cache key, ``neuron-compile explain``, and the errors, each naming the
kernel.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile.kernels import KernelError, register_kernel, rediscover, unregister_kernel

GOLDEN = Path(__file__).parent / "kernels"


@torch.library.custom_op("neuron_test_kernels::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.tanh(x) * s


@scaled_tanh.register_fake
def _(x, s):
    return torch.empty_like(x)


def _tanh_kernel(x, s):
    import jax.numpy as jnp

    return jnp.tanh(x) * s


def _tanh_backward(grad, x, s):
    import jax.numpy as jnp

    return (grad * s * (1 - jnp.tanh(x) ** 2),)


register_kernel("neuron_test_kernels::scaled_tanh", _tanh_kernel, backward=_tanh_backward)


class TanhModel(torch.nn.Module):
    def __init__(self, op=scaled_tanh):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.op = op

    def forward(self, x):
        return self.op(self.fc(x), 2.0) + 1


def _kernels(kind=None):
    return [(r.kind, k["kernel"]) for r in neuron_compile.compile_reports() for k in r.kernels
            if kind is None or r.kind == kind]


def test_custom_op_inference_and_training():
    model = TanhModel()
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="neuron")
    out = compiled(x)
    out.square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)  # eager: the op's own implementation, its backward through the backward kernel
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert _kernels() == [("forward", "neuron_test_kernels::scaled_tanh"),
                          ("backward", "neuron_test_kernels::scaled_tanh")]
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
    assert _kernels("inference") == [("inference", "neuron_test_kernels::scaled_tanh")]


def _rms(x, w):
    import jax.numpy as jnp

    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


@pytest.fixture
def composite_kernel():
    registered = []

    def register(*args, **kwargs):
        registered.append(args[0])
        return register_kernel(*args, **kwargs)

    yield register
    for name in registered:
        unregister_kernel(name)


def test_composite_swapped_by_name(composite_kernel, tmp_path):
    sites = []
    composite_kernel("neuron.rms_norm", _rms, match=lambda site: sites.append(site) or len(site.operands) == 2)
    model, x = Norm(), torch.randn(4, 16)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)})(x)
        torch.testing.assert_close(out, model(x))
    assert [s.name for s in sites] == ["neuron.rms_norm"] and "stablehlo.rsqrt" in sites[0].decomposition
    assert _kernels() == [("inference", "neuron.rms_norm")]
    final = next(tmp_path.rglob("04-final.mlir"))
    filecheck = Path(sys.executable).with_name("filecheck")
    proc = subprocess.run([str(filecheck), str(GOLDEN / "rms_norm_swap.mlir"), "--input-file", str(final)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr + final.read_text()

    # a kernel that declines keeps the default decomposition
    torch._dynamo.reset()
    neuron_compile.reset()
    composite_kernel("neuron.rms_norm", _rms, match=lambda site: False)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x + 1), model(x + 1))
    assert _kernels() == []


def test_kernel_package_found_by_entry_point(tmp_path, monkeypatch):
    (tmp_path / "neuron_test_kernel_pkg.py").write_text(textwrap.dedent('''
        import torch
        from neuron_compile.kernels import register_kernel

        @torch.library.custom_op("neuron_test_pkg::cube", mutates_args=())
        def cube(x: torch.Tensor) -> torch.Tensor:
            return x * x * x

        @cube.register_fake
        def _(x):
            return torch.empty_like(x)

        def register():
            register_kernel("neuron_test_pkg::cube", lambda x: x ** 3, version="2")
    '''))
    info = tmp_path / "neuron_test_kernel_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: neuron-test-kernel-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[neuron_compile.kernels]\ncube = neuron_test_kernel_pkg:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rediscover()
    try:
        import neuron_test_kernel_pkg

        from neuron_compile.kernels import kernels

        kernel = kernels()["neuron_test_pkg::cube"]
        assert kernel.version == "2" and kernel.origin == "entry point cube of neuron-test-kernel-pkg"
        x = torch.randn(3, 5)
        with torch.no_grad():
            out = torch.compile(lambda t: neuron_test_kernel_pkg.cube(t) + 1, backend="neuron")(x)
        torch.testing.assert_close(out, x ** 3 + 1)
        assert _kernels() == [("inference", "neuron_test_pkg::cube")]
    finally:
        unregister_kernel("neuron_test_pkg::cube")


def test_shipped_attention_kernel_against_sdpa():
    import torch.nn.functional as F

    from neuron_compile.kernels.attention import attention

    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    keep = torch.rand(16, 16) > 0.3
    keep[:, 0] = True
    keep[5] = False  # a row with no key: zeros, as ATen's
    bias = torch.randn(2, 1, 16, 16)

    def three(attend, q, k, v):  # causal, a boolean mask, an additive mask: one graph
        return (attend(q, k, v, is_causal=True), attend(q, k, v, attn_mask=keep), attend(q, k, v, attn_mask=bias))

    def kernel(q, k, v, attn_mask=None, is_causal=False):
        return attention(q, k, v, attn_mask, None, is_causal)

    outs = torch.compile(lambda *t: three(kernel, *t), backend="neuron")(q, k, v)
    sum(o.square().sum() for o in outs).backward()
    got = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    expected = three(F.scaled_dot_product_attention, q, k, v)
    sum(o.square().sum() for o in expected).backward()
    torch.testing.assert_close(outs, expected)
    for g, t in zip(got, (q, k, v)):
        torch.testing.assert_close(g, t.grad)
    assert _kernels() == [("forward", "neuron::attention")] * 3 + [("backward", "neuron::attention")] * 3

    # more than 128 tokens, causal: the queries in blocks of 128 rows (here 128 + 8)
    q, k, v = (torch.randn(1, 1, 136, 8) for _ in range(3))
    with torch.no_grad():
        out = torch.compile(lambda *t: kernel(*t, is_causal=True), backend="neuron")(q, k, v)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_kernel_version_and_source_are_in_the_cache_key():
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.graph_keys import fx_cache_key

    gm = make_fx(lambda x: scaled_tanh(x, 2.0))(torch.randn(2, 3))
    before = fx_cache_key(gm, "default")
    try:
        register_kernel("neuron_test_kernels::scaled_tanh", _tanh_kernel, backward=_tanh_backward, version="2")
        after = fx_cache_key(gm, "default")
    finally:
        register_kernel("neuron_test_kernels::scaled_tanh", _tanh_kernel, backward=_tanh_backward)
    changed = [n for n, h in after.part_hashes().items() if before.part_hashes().get(n) != h]
    assert changed == ["kernels"]
    assert "neuron_test_kernels::scaled_tanh@2" in after.as_manifest()["kernels"]["value"]


# --------------------------------------------------------------------------- errors


@torch.library.custom_op("neuron_test_kernels::plain", mutates_args=())
def plain(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@plain.register_fake
def _(x, s):
    return torch.empty_like(x)


def _compile_error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("kernel, problem", [
    (lambda x, s: x.reshape(-1) * s, "returned float32[32]"),
    (lambda x, s: (x * s).astype("float64"), "returned float64[4, 8]"),
    (lambda x, s: x.no_such_method(), "failed to lower (AttributeError"),
], ids=["shape", "dtype", "raises"])
def test_kernel_that_does_not_fit_is_named(kernel, problem):
    register_kernel("neuron_test_kernels::plain", kernel)
    try:
        with torch.no_grad():
            message = _compile_error(torch.compile(TanhModel(plain), backend="neuron"), torch.randn(4, 8))
    finally:
        unregister_kernel("neuron_test_kernels::plain")
    assert "kernel 'neuron_test_kernels::plain'" in message and problem in message, message
    assert "unregister" in message


def test_training_without_backward_says_so():
    register_kernel("neuron_test_kernels::plain", lambda x, s: x * s)
    try:
        message = _compile_error(torch.compile(TanhModel(plain), backend="neuron"), torch.randn(4, 8))
    finally:
        unregister_kernel("neuron_test_kernels::plain")
    assert "'neuron_test_kernels::plain' is served by a neuron_compile kernel that has no backward" in message
    assert "backward=" in message


def test_composite_kernel_with_the_wrong_signature_is_named(composite_kernel):
    composite_kernel("neuron.rms_norm", lambda x, w: (x * w).sum(-1))
    with torch.no_grad():
        message = _compile_error(torch.compile(Norm(), backend="neuron"), torch.randn(4, 16))
    assert "kernel 'neuron.rms_norm'" in message and "does not fit" in message, message
    assert "tensor<4xf32>" in message and "tensor<4x16xf32>" in message


def test_register_kernel_refuses_what_it_cannot_serve():
    with pytest.raises(KernelError, match="composite 'neuron.<kind>' or a custom op"):
        register_kernel("rms_norm", _rms)
    with pytest.raises(KernelError, match="a backward is for custom ops"):
        register_kernel("neuron.rms_norm", _rms, backward=_rms)
    with pytest.raises(KernelError, match="a custom op's kernel is a JAX function"):
        register_kernel("neuron_test_kernels::plain", stablehlo="module {}")


def test_explain_lists_the_kernels(tmp_path, capsys):
    from neuron_compile.cli import main

    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f'''
        import torch, importlib.util
        spec = importlib.util.spec_from_file_location("test_kernels_module", {str(Path(__file__))!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        def factory():
            return module.TanhModel(), (torch.randn(4, 8),)
    '''))
    assert main(["explain", f"{spec}:factory"]) == 0
    out = capsys.readouterr().out
    assert "kernels: 1 site(s) served by registered kernels" in out, out
    assert "custom op scaled_tanh <- kernel neuron_test_kernels::scaled_tanh (from code)" in out, out
