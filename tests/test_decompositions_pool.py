"""Pooling and window ops (neuron_compile/decompositions/pool.py), compiled, against eager."""

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.decompositions.pool import _out_size


def _compiled(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", fullgraph=True)(*args)


def test_pooling_cases_torch_mlir_gets_wrong_match_eager():
    x = torch.randn(2, 3, 7, 8)
    x3 = torch.randn(1, 2, 5, 6, 7)
    x[0, 0, 0, 0] = float("nan")
    x[0, 0, 5, 1] = x[0, 0, 5, 3] = float("nan")  # two NaNs in one window: ATen's index is the last
    x[1, 1, 0, :4] = float("-inf")  # an all -inf window: ATen's index is its first valid element
    x[1, 2, 2:4, 2:4] = 1.5  # ties: the first in scan order

    def fn(x, x3):
        return {
            "max2_ceil_idx": F.max_pool2d(x, 3, 2, 1, (1, 2), ceil_mode=True, return_indices=True),
            "max2_ceil": F.max_pool2d(x, 3, 2, 0, (1, 2), ceil_mode=True),
            "max3_idx": F.max_pool3d(x3, 3, 2, 1, return_indices=True),
            "max3_ceil_idx": F.max_pool3d(x3, 3, 2, 0, (1, 2, 1), ceil_mode=True, return_indices=True),
            "max3_ceil": F.max_pool3d(x3, 3, 2, 0, ceil_mode=True),
            "avg2_ceil": F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
            "avg2_ceil_nopad": F.avg_pool2d(x, (4, 4), (2, 3), 1, ceil_mode=True, count_include_pad=False),
            "avg2_div": F.avg_pool2d(x, 3, 2, 1, divisor_override=2),
            "avg3_ceil_nopad": F.avg_pool3d(x3, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            "avg3_div": F.avg_pool3d(x3, (2, 3, 4), (1, 2, 2), (0, 1, 2), ceil_mode=True, divisor_override=2),
            "avg1_ceil": F.avg_pool1d(x[0], 6, 3, 2, ceil_mode=True),
            "adaptive_avg3": F.adaptive_avg_pool3d(x3, (2, 4, 3)),
            "adaptive_max3": F.adaptive_max_pool3d(x3, (2, 4, 3), return_indices=True),
            "unfold": x.unfold(2, 3, 2),
            "unfold_last": x.unfold(-1, 2, 3),
        }

    got = _compiled(fn, x, x3)
    ref = fn(x, x3)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], equal_nan=True, msg=name)


def test_integer_average_pooling_divides_toward_zero():
    """int64 averages: ATen divides the window sum in C++ integer arithmetic (toward zero)."""
    x3 = torch.randint(-20, 20, (1, 2, 5, 6, 7))
    x = x3[0, :, 0]

    def fn(x, x3):
        return (F.avg_pool3d(x3, 2, 1, 1, ceil_mode=True, count_include_pad=False, divisor_override=2),
                F.avg_pool3d(x3, (2, 3, 4), (1, 2, 2), (0, 1, 2), ceil_mode=True),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False))

    for got, ref in zip(_compiled(fn, x, x3), fn(x, x3)):
        assert got.dtype == torch.int64
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_integer_max_pooling_in_ceil_mode():
    """int64 max pooling with ceil_mode: torch-mlir's reduce_window drops elements of the extra
    right window for integers as for floats (OpInfo's int64 max_pool2d/3d samples gave 7 for 9)."""
    x3 = torch.randint(-9, 10, (1, 2, 3, 6, 5))
    x = x3[0, :, 0]

    def fn(x, x3):
        return (F.max_pool2d(x.unsqueeze(0), 3, 2, ceil_mode=True),
                F.max_pool2d(x.unsqueeze(0), 3, 2, ceil_mode=True, dilation=(1, 2)),
                F.max_pool3d(x3, 2, 2, ceil_mode=True),
                F.max_pool2d(x, 2, 2, 1, ceil_mode=True, return_indices=True)[0])

    for got, ref in zip(_compiled(fn, x, x3), fn(x, x3)):
        assert got.dtype == torch.int64
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_zero_size_inputs_give_empty_results():
    x = torch.randn(0, 3, 5, 5)

    def fn(x):
        return (F.pad(x, (1, 2, 1, 1), mode="reflect"), F.pad(x[:, 0], (1, 2), mode="replicate"),
                F.unfold(x, 2, 1, 1, 1), F.adaptive_avg_pool2d(x, (3, 2)), F.max_pool2d(x, 2, ceil_mode=True))

    for g, r in zip(_compiled(fn, x), fn(x)):
        assert g.shape == r.shape and g.dtype == r.dtype


@pytest.mark.parametrize("size,k,s,p,dil", [(6, 3, 2, 0, 1), (3, 3, 2, 0, 1), (9, 6, 3, 2, 1), (7, 3, 2, 1, 2)])
def test_output_size_is_atens(size, k, s, p, dil):
    ref = F.max_pool1d(torch.zeros(1, size), k, s, p, dil, ceil_mode=True).shape[-1]
    assert _out_size(size, k, s, p, dil, True) == ref


def test_transposed_convolution_with_output_padding():
    # the stride/output_padding combinations torch-mlir does not lower, as ordinary convolutions
    x, w, b = torch.randn(2, 2, 4, 4), torch.randn(2, 2, 4, 5), torch.randn(4)
    x3, w3 = torch.randn(2, 2, 4, 4, 3), torch.randn(2, 3, 2, 3, 2)

    def fn(x, w, b, x3, w3):
        return (F.conv_transpose2d(x, w, b, (3, 2), (1, 2), (2, 3), 2, (4, 4)),
                F.conv_transpose2d(x[0], w, None, (3, 2), 0, (2, 1)),
                F.conv_transpose3d(x3, w3, None, (3, 2, 2), (1, 0, 2), (2, 1, 1), 2, (2, 1, 3)),
                F.conv_transpose1d(x[:, :, 0], w[:, :, 0], None, 3, 4, 1, 1, 2))

    for g, r in zip(_compiled(fn, x, w, b, x3, w3), fn(x, w, b, x3, w3)):
        torch.testing.assert_close(g, r)


def test_antialiased_bilinear_resize():
    x = torch.randn(2, 3, 10, 20)

    def fn(x):
        return (F.interpolate(x, size=(3, 3), mode="bilinear", antialias=True),
                F.interpolate(x, scale_factor=(1.7, 0.9), mode="bilinear", antialias=True),
                F.interpolate(x, size=(7, 33), mode="bilinear", antialias=True, align_corners=True),
                F.interpolate(x, scale_factor=(0.33, 2.5), mode="bilinear", antialias=True))

    for g, r in zip(_compiled(fn, x), fn(x)):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode):
    x, g = torch.randn(2, 3, 5, 6, 7), torch.rand(2, 4, 3, 5, 3) * 2.4 - 1.2  # some points outside the volume

    def fn(x, g):
        return tuple(F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=ac)
                     for pad in ("zeros", "border") for ac in (False, True))

    for got, ref in zip(_compiled(fn, x, g), fn(x, g)):
        torch.testing.assert_close(got, ref)


POOL_GRADIENTS = {  # torch-mlir lowers none of these backwards but the global average pool's
    "avg2d": (lambda x: F.avg_pool2d(x, 3, 2), 2),
    "avg2d-pad": (lambda x: F.avg_pool2d(x, 3, 2, 1), 2),
    "avg2d-pad-no-count": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), 2),
    "avg2d-ceil-no-count": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), 2),
    "avg2d-divisor": (lambda x: F.avg_pool2d(x, 2, divisor_override=3), 2),
    "avg1d": (lambda x: F.avg_pool1d(x.flatten(2), 3, 2, 1), 2),
    "avg3d-ceil": (lambda x: F.avg_pool3d(x, 2, 2, ceil_mode=True), 3),
    "adaptive-avg2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), 2),
    "adaptive-avg2d-global": (lambda x: F.adaptive_avg_pool2d(x, 1), 2),
    "adaptive-avg3d": (lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), 3),
    "adaptive-max2d": (lambda x: F.adaptive_max_pool2d(x, (2, 3)), 2),
    "adaptive-max3d": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), 3),
    "max3d-ceil-dilation": (lambda x: F.max_pool3d(x, 2, 2, 1, (1, 2, 1), ceil_mode=True), 3),
}


@pytest.mark.parametrize("name", POOL_GRADIENTS)
def test_pooling_gradients_match_eager(name):
    pool, d = POOL_GRADIENTS[name]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 9) if d == 2 else torch.randn(1, 2, 5, 7, 6)

    def loss(x):  # weights make every output's gradient different
        out = pool(x)
        return (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)).sum()

    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    torch.compile(loss, backend="neuron", fullgraph=True)(xc).backward()
    loss(xe).backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_average_pooling_gradient_keeps_a_nan_in_its_window(d):
    """A NaN or infinite output gradient reaches only the input positions its window covers, as on CPU
    (the spread was a matmul, and NaN * 0 made the whole input gradient NaN: test_modules.py's LPPool3d
    parity, whose gradient at a negative input is NaN)."""
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[d]
    x = torch.randn(1, 2, *(7,) * d)
    out = pool(x, 2)
    grad = torch.randn_like(out)
    flat = grad.view(-1)
    flat[0], flat[3], flat[5] = float("nan"), float("inf"), float("-inf")
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    pool(xc, 2).backward(grad)
    pool(xn, 2).backward(grad.to("neuron"))
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, equal_nan=True)


def test_lp_pool_gradient_at_negative_inputs_matches_cpu():
    """test_modules.py's test_cpu_gpu_parity_nn_LPPool3d: a fractional norm of negative inputs (NaN)."""
    x = torch.randn(1, 3, 7, 7, 7)
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    out_c, out_n = F.lp_pool3d(xc, 1.5, 2), F.lp_pool3d(xn, 1.5, 2)
    torch.testing.assert_close(out_n.cpu(), out_c, equal_nan=True)
    grad = torch.randn_like(out_c)
    out_c.backward(grad)
    out_n.backward(grad.to("neuron"))
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, equal_nan=True)
