"""Search, pairwise, strided and bit-level ops (neuron_compile/decompositions/: search, distances_and_losses, bits, strided, sampling, histograms), compiled, against eager."""

import pytest
import torch


def _compiled(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", fullgraph=True)(*args)


def _same(fn, *args, **tol):
    torch.testing.assert_close(_compiled(fn, *args), fn(*args), equal_nan=True, **tol)


def test_searchsorted_bucketize_isin():
    seq = torch.sort(torch.randn(3, 7).round())[0]  # repeated values: left and right differ
    v = torch.randn(3, 4).round()
    v[0, 0] = float("nan")
    _same(lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True),
                        torch.searchsorted(s[0], v, side="right", out_int32=True), torch.searchsorted(s[0], 0.0),
                        torch.bucketize(v, s[0]), torch.searchsorted(s[:, :0], v)), seq, v)
    unsorted = seq[0][torch.randperm(7)]
    _same(lambda u, v: torch.searchsorted(u, v, sorter=torch.argsort(u)), unsorted, v)
    _same(torch.isin, torch.randn(20).round(), torch.randn(5).round())


def test_pdist():
    x = torch.randn(6, 4)
    _same(lambda x: (torch.pdist(x), torch.pdist(x, 1), torch.pdist(x, float("inf")), torch.pdist(x, 0),
                     torch.pdist(x[:1])), x)


def test_nextafter_bit_exact():
    a = torch.tensor([0.0, 1.0, -1.0, 1e-45, -1e-45, -0.0, float("nan"), 3.0, float("inf"), -float("inf"), 2.0, 0.0])
    b = torch.tensor([1.0, 1.0, 0.0, -1.0, 1.0, -1.0, 1.0, float("nan"), 0.0, 0.0, float("inf"), -0.0])
    _same(torch.nextafter, a, b, rtol=0, atol=0)
    _same(torch.nextafter, a.double(), b.double(), rtol=0, atol=0)
    _same(torch.nextafter, torch.randn(5, 1), torch.randn(5), rtol=0, atol=0)


def test_strided_copies_and_put():
    y = torch.randn(3, 3)
    _same(lambda y: (torch.as_strided_copy(y, (2, 2), (1, 2), 1),
                     torch.as_strided_copy(y.reshape(-1), (2, 2, 2, 2), (1, 1, 1, 1))), y)
    _same(lambda y, s: torch.as_strided_scatter(y, s, (2, 2), (1, 2), 1), y, torch.randn(2, 2))
    _same(lambda y, i, s: (y.put(i, s), y.put(i, s, accumulate=True)), y, torch.tensor([0, -1, 4]), torch.randn(3))


_NESTING_VIEWS = [((2, 2), (1, 2), 1),  # a transpose at an offset
                  ((3, 2), (4, 1), 1),  # a narrow whose last row runs past the storage (padded block)
                  ((2, 3), (1, 0), 5),  # an expand
                  ((4,), (5,), 0),  # the diagonal of a 4x4 block
                  ((2, 1, 2), (6, 9, 2), 0),  # a step slice with a size-1 dim
                  ((), (), 7)]  # one element


@pytest.mark.parametrize("size, stride, offset", _NESTING_VIEWS)
def test_strided_views_are_slices_not_gathers(size, stride, offset):
    """as_strided_copy of a view whose strides nest (transpose, narrow, step, expand, diagonal) lowers to
    slices and a permute: no gather in the graph, the values of eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.decompositions import decomposition_table

    y = torch.randn(16)

    def fn(y):
        return torch.as_strided_copy(y, size, stride, offset)

    gm = make_fx(fn, decomposition_table=decomposition_table())(y)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not targets & {torch.ops.aten.index.Tensor, torch.ops.aten.gather.default}, targets
    torch.testing.assert_close(gm(y), fn(y), rtol=0, atol=0)
    _same(fn, y, rtol=0, atol=0)


@pytest.mark.parametrize("size, stride, offset", [v for v in _NESTING_VIEWS if 0 not in v[1] or 1 in v[0]])
def test_writes_through_strided_views_are_selects_not_scatters(size, stride, offset):
    """as_strided_scatter into a view whose strides nest (a copy into a fresh tensor, a transposed or sliced
    destination) is a pad and a masked select between the storage's untouched ends: no index_put, eager's
    values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.decompositions import decomposition_table

    y = torch.randn(16)
    src = torch.randn(size)

    def fn(y, src):
        return torch.as_strided_scatter(y, src, size, stride, offset)

    gm = make_fx(fn, decomposition_table=decomposition_table())(y, src)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not targets & {torch.ops.aten.index_put.default, torch.ops.aten.scatter.src}, targets
    torch.testing.assert_close(gm(y, src), fn(y, src), rtol=0, atol=0)
    _same(fn, y, src, rtol=0, atol=0)
    _same(fn, y.to(torch.complex64), src.to(torch.complex64), rtol=0, atol=0)


def test_overlapping_strided_view_still_gathers():
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.decompositions import decomposition_table

    def fn(y):  # rows overlap (stride 1 < 3 elements a row): no nest of slices reads this
        return torch.as_strided_copy(y, (4, 3), (1, 1), 2)

    y = torch.randn(9)
    gm = make_fx(fn, decomposition_table=decomposition_table())(y)
    assert torch.ops.aten.index.Tensor in {n.target for n in gm.graph.nodes}
    torch.testing.assert_close(gm(y), fn(y), rtol=0, atol=0)


def test_mode_smallest_most_frequent_last_index():
    m = torch.randint(0, 4, (4, 5, 6)).float()
    _same(lambda m: (torch.mode(m), torch.mode(m, 1), torch.mode(m, 0, True), torch.mode(m[0, 0, 0])), m)
    _same(lambda m: torch.mode(m, -1), torch.tensor([[3, 1, 3, 1, 2], [2, 2, 5, 5, 0]]))
    nan = float("nan")
    rows = torch.tensor([[1, nan, 2, nan, nan], [1, nan, 1, 1, nan], [2, nan, 1, nan, 5], [1, 1, nan, 4, 4],
                         [nan, nan, nan, nan, nan]])
    _same(lambda m: torch.mode(m, -1), rows)


def test_segment_reduce_lengths_offsets_initial():
    d = torch.randn(5, 3)
    d[1, 1] = float("nan")
    lengths, offsets = torch.tensor([2, 0, 3, 0]), torch.tensor([0, 2, 2, 5, 5])

    def fn(d, lengths, offsets):
        out = []
        for r in ("sum", "mean", "max", "min", "prod"):
            out += [torch.segment_reduce(d, r, lengths=lengths), torch.segment_reduce(d, r, lengths=lengths, initial=2.0),
                    torch.segment_reduce(d, r, offsets=offsets, initial=-1.0),
                    torch.segment_reduce(d.T.contiguous(), r, lengths=torch.stack([lengths, lengths.flip(0), lengths]),
                                         axis=1)]
        return out

    _same(fn, d, lengths, offsets)


def test_random_samplers_follow_their_distributions():
    # compiled and eager draw different numbers: their quartiles agree (200k draws: the
    # quartiles' sampling error is well under the 0.05 allowed), and the supports are right
    torch.manual_seed(0)
    n = 200_000
    x, m, s = torch.zeros(n), torch.full((n,), 3.0), torch.full((n,), 2.0)

    def fn(x, m, s):
        return (torch.empty_like(x).cauchy_(1.0, 2.0), torch.empty_like(x).log_normal_(0.5, 0.3),
                torch.empty_like(x).geometric_(0.3), torch.normal(m, s), torch.normal(m, 2.0), torch.normal(1.0, s),
                torch.normal(0.0, 1.0, (n,)), torch.randint_like(x, 10), torch.randint_like(x, -3, 4),
                torch.randint_like(x.long(), 5))

    got, ref = _compiled(fn, x, m, s), fn(x, m, s)
    q = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == r.dtype and g.shape == r.shape, i
        if i < 7:
            torch.testing.assert_close(torch.quantile(g.double(), q), torch.quantile(r.double(), q), rtol=0.05,
                                       atol=0.05, msg=str(i))
        else:  # randint_like: the same integer range and mean (a discrete median may flip)
            assert g.min() == r.min() and g.max() == r.max(), i
            torch.testing.assert_close(g.double().mean(), r.double().mean(), rtol=0.03, atol=0.03)
    assert got[2].min() == 1 and (got[2] == got[2].round()).all()  # geometric: whole trials, at least one
    assert got[1].min() > 0 and got[7].max() == 9 and got[8].min() == -3 and got[9].max() == 4


def test_stable_sort_keeps_ties_in_order():
    x = torch.randint(0, 3, (4, 5, 64)).float()
    x[0, 0, 3] = x[0, 0, 9] = float("nan")
    xi = torch.randint(0, 3, (70,))
    _same(lambda x, xi: (torch.sort(x, stable=True), torch.sort(x, dim=1, descending=True, stable=True),
                         torch.argsort(x, dim=0, stable=True), torch.sort(xi, stable=True, descending=True)), x, xi,
          rtol=0, atol=0)


def test_linear_cross_entropy_chunked_forward():
    # torch.nn's chunked custom op without gradients: linear then cross_entropy
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    options = LinearCrossEntropyOptions(allow_retain_graph=True, batch_chunk_size=2)
    x, w, b = torch.randn(8, 3), torch.randn(5, 3), torch.randn(5)
    t = torch.tensor([0, 1, 4, 2, -100, 3, 1, 0])
    cw = torch.rand(5)
    F = torch.nn.functional

    def fn(x, w, b, t, cw):
        return (F.linear_cross_entropy(x, w, t, options=options, ignore_index=-100),
                F.linear_cross_entropy(x, w, t, linear_bias=b, weight=cw, reduction="sum", options=options,
                                       ignore_index=-100),
                F.linear_cross_entropy(x, w, t, reduction="none", options=options, ignore_index=-100))

    with torch.no_grad():
        _same(fn, x, w, b, t, cw)


def test_histogram():
    x, w = torch.randn(7, 9), torch.rand(7, 9)
    edges = torch.tensor([-1.0, -0.2, 0.0, 0.5, 2.0])
    _same(lambda x, w, e: (torch.histogram(x, 5), torch.histogram(x, 6, range=(-1.0, 1.0), weight=w),
                           torch.histogram(x, 4, density=True), torch.histogram(x, e),
                           torch.histogram(x, e, weight=w, density=True)), x, w, edges)
    # one element (min == max: edges +-0.5), values on the edges
    _same(lambda s, e: (torch.histogram(s, 1), torch.histogram(s, e[:2], density=True)), torch.tensor(0.3), edges)
    _same(lambda x: (torch.histogram(x, 2), torch.histogram(x, 7)), torch.tensor([1.0, 1.0, 1.0, 2.0, 3.0, 3.0]))


def test_histogramdd():
    x, w = torch.randn(40, 3), torch.rand(40)
    edges = [torch.tensor([-1.0, 0.0, 1.5]), torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0]), torch.tensor([-3.0, 3.0])]
    _same(lambda x, w, e0, e1, e2: (torch.histogramdd(x, [2, 3, 4]),
                                    torch.histogramdd(x, [2, 3, 1], range=[-1.0, 1.0, -2.0, 2.0, 0.0, 1.0], weight=w),
                                    torch.histogramdd(x, [3, 3, 3], density=True), torch.histogramdd(x, [e0, e1, e2]),
                                    torch.histogramdd(x, [e0, e1, e2], weight=w, density=True)), x, w, *edges)


def test_nonzero_static():
    x = torch.tensor([[0.0, 1.5, 0.0, -2.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 7.0, 1.0]])
    _same(lambda x: (torch.nonzero_static(x, size=3), torch.nonzero_static(x, size=9, fill_value=-7),
                     torch.nonzero_static(x[1], size=2), torch.nonzero_static(x[0, 0], size=2),
                     torch.nonzero_static(x > 5, size=1)), x)


def test_multinomial_draws_follow_the_weights():
    """Random: no eager value to match. Checked instead: shapes, dtypes, no repeats without
    replacement, zero weights never drawn, and frequencies within 4 sigma of the weights."""
    weights = torch.tensor([[0.0, 1.0, 3.0, 6.0], [5.0, 0.0, 5.0, 0.0]])

    def fn(w):
        return torch.multinomial(w, 2), torch.multinomial(w, 4000, replacement=True)

    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    without, draws = compiled(weights)
    assert without.dtype == draws.dtype == torch.int64 and without.shape == (2, 2) and draws.shape == (2, 4000)
    assert (without[:, 0] != without[:, 1]).all() and (without[1] % 2 == 0).all()
    for row, w in zip(draws, weights):
        freq = torch.bincount(row, minlength=4).float() / row.numel()
        p = w / w.sum()
        assert (freq[p == 0] == 0).all()
        assert ((freq - p).abs() <= 4 * (p * (1 - p) / row.numel()).sqrt() + 1e-6).all(), (freq, p)


def test_batch_norm_with_update_updates_running_stats():
    """torch.ops.aten._batch_norm_with_update (PyTorch's own decomposition); its zero-size
    ``reserve`` output is made at run time, never computed by XLA."""
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    stats = [torch.randn(3), torch.rand(3) + 0.5]
    ref_stats = [t.clone() for t in stats]

    def fn(x, w, b, mean, var):
        return torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.1, 1e-5)

    got = torch.compile(fn, backend="neuron", fullgraph=True)(x, w, b, *stats)
    ref = fn(x, w, b, *ref_stats)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    for g, r in zip(stats, ref_stats):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
