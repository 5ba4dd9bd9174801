"""`dot-layout`: large weight-gradient matmuls (transposed lhs, M > N) reach XLA's YNNPACK
library as plain matmuls, with the values of the unrewritten dot; others are left alone."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import neuron_compile
from neuron_compile.passes import parse_pipeline
from neuron_compile.runtime.executor import XlaExecutable


def _ty(shape):
    return "tensor<" + "x".join(map(str, shape)) + "xf32>"


def _module(k, m, n, rhs_contracting):
    lhs, rhs = (k, m), ((k, n) if rhs_contracting == 0 else (n, k))
    text = (f"func.func @main(%a: {_ty(lhs)}, %b: {_ty(rhs)}) -> {_ty((m, n))} {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [0] x [{rhs_contracting}]"
            f" : ({_ty(lhs)}, {_ty(rhs)}) -> {_ty((m, n))}\n"
            f"  return %0 : {_ty((m, n))}\n}}")
    return text, lhs, rhs


def _dots_in_library(exe: XlaExecutable) -> bool:
    """Whether XLA put the module's matmul in a YNNPACK fusion rather than an Eigen dot."""
    return '"__ynn_fusion"' in exe.loaded.hlo_modules()[0].to_string()


@pytest.mark.parametrize("k,m,n,rhs_contracting,form", [
    (512, 512, 256, 0, "transpose-lhs"),  # equal bytes either way: the lhs transpose
    (512, 2048, 256, 0, "swap"),  # LM-head-like: transposing dY and the result moves less
    (512, 1024, 256, 1, "swap"),  # dY already [N,K]: only the result is transposed
])
def test_rewritten_dot_runs_in_the_library_with_the_same_values(k, m, n, rhs_contracting, form):
    text, lhs_shape, rhs_shape = _module(k, m, n, rhs_contracting)
    out, (stat,) = parse_pipeline("dot-layout").run_on_text(text, verify_each=True)
    assert stat.fired == 1 and stat.details[form] == 1
    a, b = torch.randn(*lhs_shape), torch.randn(*rhs_shape)
    before, after = XlaExecutable.compile(text), XlaExecutable.compile(out)
    assert not _dots_in_library(before)  # what the pass is for: XLA leaves a transposed lhs to Eigen
    assert _dots_in_library(after)  # the barrier kept XLA from folding the transpose back
    assert_close(after([a, b])[0], before([a, b])[0], rtol=1e-5, atol=1e-4)
    assert_close(after([a, b])[0], a.t() @ (b if rhs_contracting == 0 else b.t()), rtol=1e-5, atol=1e-4)


def test_a_dot_on_a_transpose_counts_as_a_transposed_lhs():
    """mm(x.t(), dy) lowers to transpose + plain dot, which XLA folds into the Eigen form."""
    k, m, n = 512, 2048, 256
    text = (f"func.func @main(%a: {_ty((k, m))}, %b: {_ty((k, n))}) -> {_ty((m, n))} {{\n"
            f"  %t = stablehlo.transpose %a, dims = [1, 0] : ({_ty((k, m))}) -> {_ty((m, k))}\n"
            f"  %0 = stablehlo.dot_general %t, %b, contracting_dims = [1] x [0]"
            f" : ({_ty((m, k))}, {_ty((k, n))}) -> {_ty((m, n))}\n"
            f"  return %0 : {_ty((m, n))}\n}}")
    out, (stat,) = parse_pipeline("dot-layout").run_on_text(text, verify_each=True)
    assert stat.details == {"transpose-lhs": 0, "swap": 1}
    a, b = torch.randn(k, m), torch.randn(k, n)
    before, after = XlaExecutable.compile(text), XlaExecutable.compile(out)
    assert not _dots_in_library(before) and _dots_in_library(after)
    assert_close(after([a, b])[0], a.t() @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k,m,n,min_work", [
    (512, 256, 512, 0),  # M <= N: Eigen is as fast, nothing to gain
    (64, 128, 32, 1 << 22),  # below min-work: two more kernels would cost more than they save
])
def test_dots_that_gain_nothing_are_left_alone(k, m, n, min_work):
    text, _, _ = _module(k, m, n, 0)
    out, (stat,) = parse_pipeline(f"dot-layout{{min-work={min_work}}}").run_on_text(text)
    assert stat.fired == 0 and "transpose" not in out


def test_plan_ignores_plain_and_batched_dots():
    text = (f"func.func @main(%a: {_ty((8, 512, 1024))}, %b: {_ty((8, 512, 64))}, %c: {_ty((1024, 512))},"
            f" %d: {_ty((512, 64))}) -> ({_ty((8, 1024, 64))}, {_ty((1024, 64))}) {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [1] x [1]"
            f" : ({_ty((8, 512, 1024))}, {_ty((8, 512, 64))}) -> {_ty((8, 1024, 64))}\n"
            f"  %1 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0]"
            f" : ({_ty((1024, 512))}, {_ty((512, 64))}) -> {_ty((1024, 64))}\n"
            f"  return %0, %1 : {_ty((8, 1024, 64))}, {_ty((1024, 64))}\n}}")
    out, (stat,) = parse_pipeline("dot-layout{min-work=0}").run_on_text(text)
    assert stat.fired == 0


def test_a_linear_layers_weight_gradient_through_the_backend():
    """A wide linear layer's weight gradient is such a dot in the backward graph: the default
    profile rewrites it, and the gradients still match eager."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 2048)
    x = torch.randn(512, 256, requires_grad=True)
    compiled = torch.compile(layer, backend="neuron", options={"cache": False})  # compiled here, passes run
    compiled(x).square().mean().backward()
    ours = (layer.weight.grad.clone(), layer.bias.grad.clone(), x.grad.clone())
    layer.zero_grad(set_to_none=True)
    x.grad = None
    layer(x).square().mean().backward()
    for got, want in zip(ours, (layer.weight.grad, layer.bias.grad, x.grad)):
        assert_close(got, want, rtol=1e-4, atol=1e-6)
    (backward,) = [r for r in neuron_compile.compile_reports() if r.kind == "backward"]
    assert {p.name: p for p in backward.passes}["dot-layout"].fired == 1
