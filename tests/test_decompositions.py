"""Our decompositions (neuron_compile/decompositions/), compiled, against eager.

Each case names the op the decomposition stands in for; the model or OpInfo
entry that hits it is in the decomposition's comment.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten


def compiled(fn):
    return torch.compile(fn, backend="neuron", fullgraph=True)


def check(fn, *args, grad=False, **tol):
    """Forward (and with grad=True, the gradient of every float input) of compiled fn equals eager's."""
    ref_args = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                for a in args]
    got_args = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                for a in args]
    ref = fn(*ref_args)
    got = compiled(fn)(*got_args)
    torch.testing.assert_close(got, ref, **tol)
    if grad:
        gen = torch.Generator().manual_seed(0)
        outs = [o for o in tree_flatten(ref)[0] if o.is_floating_point()]
        weights = [torch.randn(o.shape, generator=gen) for o in outs]
        got_outs = [o for o in tree_flatten(got)[0] if o.is_floating_point()]
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        sum((o * w).sum() for o, w in zip(got_outs, weights)).backward()
        for r, g in zip(ref_args, got_args):
            if isinstance(r, torch.Tensor) and r.requires_grad:
                torch.testing.assert_close(g.grad, r.grad, **tol)


def test_sdpa_boolean_mask():
    # aten SDPA turns a boolean mask into 0/-inf before its math kernel; so must we
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()[None, None].expand(2, -1, 8, 8)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, grad=True)


@pytest.mark.parametrize("offset,dims", [(0, (0, 1)), (2, (1, 2)), (-1, (2, 0))])
def test_diagonal_and_its_backward(offset, dims):
    x = torch.randn(4, 5, 6)
    check(lambda x: torch.diagonal(x, offset, *dims) * 2, x, grad=True)


def test_diagonal_scatter():
    x, src = torch.randn(3, 5, 4), torch.randn(3, 3)
    check(lambda x, s: torch.diagonal_scatter(x, s, 1, 1, 2), x, src, grad=True)


def test_diag_and_trace():
    x = torch.randn(5, 5)
    check(lambda x: (torch.diag(x, -1), torch.trace(x), torch.diag(x[0])), x)


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (0, 0)])
def test_histc(lo, hi):
    x = torch.randn(50)
    check(lambda x: torch.histc(x, bins=7, min=lo, max=hi), x)


def test_histc_counts_tokens_per_expert():
    # what transformers' MoE layers do: integer expert ids as floats, one bin per expert
    ids = torch.randint(0, 4, (32,)).float()
    check(lambda x: torch.histc(x, bins=4, min=0, max=3), ids)


def test_median_kthvalue_nanmedian():
    x = torch.randn(4, 7)
    check(lambda x: torch.median(x, dim=1), x, grad=True)
    check(lambda x: torch.median(x), x)
    check(lambda x: torch.kthvalue(x, 3, dim=0, keepdim=True), x, grad=True)
    y = x.clone()
    y[0, 2] = y[3, 1] = float("nan")
    check(lambda x: torch.median(x, dim=1).values, y, equal_nan=True)
    check(lambda x: torch.nanmedian(x, dim=1).values, y)
    check(lambda x: torch.nanmedian(x), y)


def test_cumprod_and_its_backward():
    check(lambda x: torch.cumprod(x, dim=1), torch.randn(3, 6), grad=True)
    check(lambda x: torch.cumprod(x, 0), torch.randint(-3, 4, (5,)))


def test_addmv_and_cdist():
    check(lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2.0), torch.randn(4), torch.randn(4, 3),
          torch.randn(3), grad=True)
    # integers: ATen converts beta and alpha to the dtype first (0.2 and 0.6 become 0)
    ints = torch.randint(-9, 9, (4,)), torch.randint(-9, 9, (4, 3)), torch.randint(-9, 9, (3,))
    check(lambda b, m, v: (torch.addmv(b, m, v, beta=0.2, alpha=0.6), torch.addmv(b, m, v, beta=2, alpha=3)), *ints)
    check(lambda a, b: torch.cdist(a, b), torch.randn(2, 5, 3), torch.randn(2, 4, 3))
    check(lambda a, b: torch.cdist(a, b, p=1.0), torch.randn(5, 3), torch.randn(4, 3))


def test_scatter_src_and_value():
    x = torch.randn(4, 6)
    index = torch.argsort(torch.rand(4, 6), dim=1)[:, :3]
    check(lambda x, s: x.scatter(1, index, s), x, torch.randn(4, 3))
    check(lambda x: x.scatter(1, index, 2.5), x)


def test_empty_then_filled():
    # an empty tensor whose every element is written (argsort's inverse permutation)
    perm = torch.randperm(10)
    check(lambda p: torch.empty_like(p).scatter_(0, p, torch.arange(10)), perm)
    check(lambda x: x.new_empty((3, 2)).fill_(4.0) + x.sum(), torch.randn(2))


def test_constant_tensors_are_dense():
    # group norm's graph carries a constant index table; XLA rejects dense_resource constants
    x = torch.randn(2, 6, 5)
    check(lambda x: F.group_norm(x, 3), x, grad=True)


def test_transformers_grouped_mm():
    moe = pytest.importorskip("transformers.integrations.moe", reason="transformers is in the test extra")
    assert hasattr(torch.ops.transformers, "grouped_mm_fallback"), moe
    x, w = torch.randn(10, 8), torch.randn(3, 8, 5)
    offs = torch.tensor([3, 3, 9], dtype=torch.int32)  # an empty group, and a row past the last offset
    check(lambda x, w: torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs), x, w, grad=True,
          rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce", [
    lambda x: x.sum(0, keepdim=True), lambda x: x.amax(0), lambda x: x.mean(0), lambda x: x.max(0),
    lambda x: x.argmax(0), lambda x: x.prod(0), lambda x: x.logsumexp(0), lambda x: x.cumsum(0),
    lambda x: x.to(torch.int64).sum(0), lambda x: x.any(0),
], ids=["sum", "amax", "mean", "max", "argmax", "prod", "logsumexp", "cumsum", "sum_int", "any"])
def test_reductions_of_a_0d_tensor(reduce):
    # torch-mlir's pipeline segfaulted on these (OpInfo's 0-d samples of every reduction)
    check(reduce, torch.tensor(3.5))


def test_negative_fancy_indices_count_from_the_end():
    # XLA's gather clamps them; falcon's _split_heads reads qkv[:, :, :, [-2]]
    x = torch.randn(3, 4, 5)
    check(lambda x: (x[:, :, [-2]], x[:, [1, -1]], x[torch.tensor([-1, 0])]), x, grad=True)


def test_negative_indices_in_index_put():
    x, v = torch.randn(4, 3), torch.randn(2, 3)
    check(lambda x, v: x.index_put((torch.tensor([-1, 1]),), v), x, v, grad=True)


def test_remainder_takes_the_divisors_sign():
    a, b = torch.randn(20) * 5, torch.randn(20)
    check(lambda a, b: (torch.remainder(a, b), a % -1.5, a % 1.5, 7 % b), a, b)
    check(lambda a, b: torch.remainder(a, b), torch.randint(-9, 9, (20,)), torch.tensor([3, -4] * 10))


def test_boolean_masked_writes():
    x = torch.randn(5, 4)
    mask = torch.tensor([True, False, True, True, False])
    check(lambda x, v: x.index_put((mask,), v), x, torch.randn(4))
    check(lambda x, v: x.index_put((mask,), v, accumulate=True), x, torch.randn(4))

    def write_where_negative(x, v):
        y = x.clone()
        y[y[:, 0] < 0] = v
        return y

    check(write_where_negative, x, torch.randn(4))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_and_index_reduce(reduce, include_self):
    x, src = torch.randn(6, 4), torch.randn(5, 3)
    index = torch.randint(0, 6, (5, 3))  # shorter than x in dim 1: only that slice is reduced into
    check(lambda x, s: x.scatter_reduce(0, index, s, reduce, include_self=include_self), x, src)
    if reduce != "sum":
        check(lambda x, s: x.index_reduce(0, torch.tensor([0, 2, 2, 5, 0]), s, reduce, include_self=include_self),
              x, torch.randn(5, 4))


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce_on_bool_stays_bool(reduce):
    """A bool sum is an or, a product an and: the result keeps x's dtype."""
    x, src = torch.rand(6, 4) > 0.5, torch.rand(5, 4) > 0.5
    index = torch.randint(0, 6, (5, 4))
    check(lambda x, s: x.scatter_reduce(0, index, s, reduce), x, src)


def test_scatter_with_reduce_and_int32_index():
    x, src = torch.randn(10, 5), torch.randn(5, 5)
    index = torch.randint(0, 10, (5, 5))
    check(lambda x, s: (x.scatter(0, index, s, reduce="add"), x.scatter(0, index, s, reduce="multiply")), x, src)
    perm = torch.argsort(torch.rand(10, 5), dim=0)[:5].to(torch.int32)
    check(lambda x, s: x.scatter(0, perm, s), x, src)


def test_unsorted_topk():
    # deepseek_v3 routes expert groups with topk(sorted=False); any order is valid, compare sorted
    check(lambda x: torch.topk(x, 3, dim=-1, sorted=False)[0].sort(dim=-1)[0], torch.randn(6, 8))


def test_lgamma_digamma_polygamma():
    # none of them lowers in torch-mlir; series and reflection formulas in float64
    x = torch.cat([torch.rand(40) * 20 + 0.01, -torch.rand(10) * 5 - 0.05, torch.tensor([1.0, 2.0, 0.5])])
    check(torch.lgamma, x, grad=True, rtol=1e-4, atol=1e-4)
    check(torch.digamma, x, rtol=1e-4, atol=1e-4)
    # the poles: lgamma is inf at 0, -1, -2...; digamma -inf at 0 and NaN at the negative integers
    poles = torch.tensor([0.0, -1.0, -2.0, -7.0, -30.0, 3.0])
    check(lambda x: (torch.lgamma(x), torch.digamma(x), torch.lgamma(x.long())), poles, equal_nan=True)
    positive = x.abs() + 0.01
    check(lambda x: (torch.polygamma(1, x), torch.polygamma(3, x), torch.mvlgamma(x + 3, 3)), positive,
          rtol=1e-4, atol=1e-4)


def test_long_tail_small_ops():
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    b[0, 0] = float("nan")
    check(lambda a, b: (torch.hypot(a, b), torch.fmax(a, b), torch.fmin(a, b), torch.dist(a, b.nan_to_num()),
                        torch.narrow_copy(a, 1, 1, 3), torch.permute_copy(a, (1, 0)), torch.unbind_copy(a, 1)[2]),
          a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_picking_reductions_on_bool_and_uint8(dtype):
    """max/min with indices, argmax/argmin and cummax/cummin on bool and uint8 (many ties): through
    int32, since torch-mlir's own reductions gave wrong values and indices on them."""
    x = (torch.rand(5, 7) > 0.5).to(dtype) if dtype == torch.bool else torch.randint(0, 3, (5, 7), dtype=dtype)
    fns = [lambda x: torch.max(x, 1), lambda x: torch.min(x, 0, keepdim=True), lambda x: torch.cummax(x, 1),
           lambda x: torch.cummin(x, 0)]
    if dtype != torch.bool:  # eager has no argmax, median or kthvalue on bool
        fns += [lambda x: torch.argmax(x, 1), lambda x: torch.argmin(x), lambda x: torch.argmax(x, 0, keepdim=True),
                lambda x: torch.median(x, 1), lambda x: torch.kthvalue(x, 2, 0).values]
    check(lambda x: [f(x) for f in fns], x)


def test_half_precision_statistics_accumulate_in_float32():
    """var/std/var_mean and cumsum of bfloat16 and float16 as ATen computes them: in float32, rounded
    once at the end (accumulating in bfloat16 was 2.5% off on a 25-element variance)."""
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(6, 9) * 5).to(dtype)
        check(lambda x: (torch.var(x), torch.var_mean(x, 1), torch.std(x, 0, correction=0), torch.cumsum(x, 1)), x,
              rtol=0, atol=0)


def test_cummax_cummin():
    x = torch.randint(0, 4, (3, 7)).float()  # ties: the last index reaching the extreme, as in ATen
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), x)
    check(lambda x: torch.cummax(x, 0), torch.randint(-5, 5, (6,)))


def test_variance_and_its_edges():
    x = torch.randn(4, 6)
    check(lambda x: (torch.var(x, 1), torch.std(x, 0, keepdim=True), torch.var_mean(x, correction=0),
                     torch.std_mean(x, (0, 1))), x, grad=True, rtol=1e-5, atol=1e-5)
    # one element, one degree of freedom taken: NaN as in eager
    check(lambda x: (torch.var(x), torch.std_mean(x)), torch.randn(1), equal_nan=True)


def test_polygamma_negative_arguments():
    # below zero: the reflection formula (n >= 2), ATen's own trigamma (n = 1); poles are +-inf
    x = torch.cat([torch.linspace(-12, 3, 301) + 0.013, torch.tensor([-8.4784, -100.3, -3.0, 0.0, float("inf"),
                                                                      float("-inf"), float("nan")])])
    check(lambda x: tuple(torch.polygamma(n, x) for n in (1, 2, 3, 4)), x, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_small_ops_second_round():
    # clamp with broadcast tensor bounds, all over dims (None, () and a list), angle of reals,
    # an empty narrow_copy, roll of an empty tensor
    x, b = torch.randn(5, 1), torch.randn(5)
    b[1] = float("nan")
    check(lambda x, b: (torch.clamp_max(x, b), torch.clamp_min(x, b), torch.clamp(x, b, b + 1)), x, b, equal_nan=True)
    m = torch.randn(3, 4).round()
    check(lambda m: (torch.all(m, dim=()), torch.all(m[0, 0], dim=0, keepdim=True),
                     torch.all(m, dim=(0, 1), keepdim=True), torch.all(m, dim=(1,))), m)
    check(torch.angle, torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), -float("inf")]), equal_nan=True)
    check(lambda x: (torch.narrow_copy(x, 1, 0, 0), torch.roll(x[:0], 1, 0), torch.roll(x, 0, 0), torch.roll(x, 5, 1),
                     torch.roll(x, (1, 2), (0, 2))), torch.randn(5, 5, 5))


def test_logcumsumexp_with_infinities():
    # torch-mlir's own lowering returned inf/NaN; a logaddexp scan keeps large and infinite values
    y = torch.randn(5, 6, 7) * 30
    y[0, 0, 2], y[1, 1, 1], y[3, 3, 3] = float("inf"), -float("inf"), float("nan")
    y[2, :, 3] = -float("inf")
    check(lambda y: (torch.logcumsumexp(y, 0), torch.logcumsumexp(y, -1), torch.logcumsumexp(y[0, 0, 0], 0)), y,
          equal_nan=True)


def test_erfinv():
    # ATen's rational guess and two Newton steps, in float64 (near +-1 the Newton step cancels)
    y = torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([1.5, -1.5, float("nan"), 0.7, -0.7, 1 - 1e-7, 1e-30])])
    check(torch.erfinv, y, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_rank0_norm_broadcast_masked_scatter_empty_bilinear():
    s = torch.tensor(-1.5)
    check(lambda s: (torch.linalg.vector_norm(s, 2, 0, True), torch.linalg.vector_norm(s, 0, 0),
                     torch.linalg.vector_norm(s, float("inf"), 0), torch.nn.functional.cosine_similarity(s, s * 2, 0)), s)
    x, mask, src = torch.randn(5), torch.rand(5, 5) > 0.5, torch.randn(5, 5)
    check(lambda x, m, s: (torch.masked_scatter(x, m, s), torch.masked_scatter(x.unsqueeze(1), m, s)), x, mask, src)
    check(torch.nn.functional.bilinear, torch.randn(0, 3), torch.randn(0, 4), torch.randn(5, 3, 4), torch.randn(5))
