"""``x == x`` at a NaN in compiled graphs (lowering/fx_to_stablehlo.keep_nan_self_compares)."""

import math

import torch


def _nan_inf():
    g = torch.randn(3, 4)
    g[0, 0], g[1, 1], g[2, 2] = math.nan, math.inf, -math.inf
    return g


def test_self_equality_and_isfinite_are_false_at_nan_when_compiled():
    """Torch-MLIR folds ``aten.eq.Tensor(x, x)`` to True; ATen's isfinite is ``(x == x) * (abs(x) != inf)``,
    so ``where(isfinite(g), g, 0)`` kept a NaN (and a matmul after it spread it over a row)."""
    def fn(g, w):
        return g == g, torch.isfinite(g), torch.matmul(torch.where(torch.isfinite(g), g, torch.zeros_like(g)), w)

    g, w = _nan_inf(), torch.rand(4, 2)
    got = torch.compile(fn, backend="neuron", fullgraph=True)(g.to("neuron"), w.to("neuron"))
    for got_one, want in zip(got, fn(g, w)):
        torch.testing.assert_close(got_one.cpu(), want)


def test_integer_self_equality_still_folds_true():
    def fn(x):
        return x == x

    x = torch.arange(6).reshape(2, 3)
    torch.testing.assert_close(torch.compile(fn, backend="neuron", fullgraph=True)(x.to("neuron")).cpu(), fn(x))
