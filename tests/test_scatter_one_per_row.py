"""scatter with one index per row (nll_loss's backward): a fused compare, not an int64 scatter.

The general decomposition of ``scatter.value``/``scatter.src`` counts writes
with a scatter_add into an int64 tensor the size of the input; a language
model's loss backward did that on the logits (an extra 3x logits of XLA temp
memory in a training step). When the index writes one position per row and
covers every other dim, the written mask is ``iota == index`` instead.
"""

import torch
import torch.nn.functional as F

import neuron_compile


def _compiled_ops() -> dict:
    ops: dict = {}
    for report in neuron_compile.compile_reports():
        for name, n in report.ops.items():
            ops[name] = ops.get(name, 0) + n
    return ops


def test_one_per_row_scatter_matches_eager_without_scatter():
    x = torch.randn(6, 10)
    index = torch.randint(0, 10, (6, 1))
    src = torch.randn(6, 1)
    index0, src0 = torch.randint(0, 6, (1, 10)), torch.randn(1, 10)  # along dim 0

    def fn(x, s, s0):
        return x.scatter(1, index, 2.5), x.scatter(1, index, s), x.scatter(0, index0, s0)

    got = torch.compile(fn, backend="neuron", fullgraph=True)(x, src, src0)
    torch.testing.assert_close(got, fn(x, src, src0))
    ops = _compiled_ops()
    assert not any("scatter" in name for name in ops), ops


def test_general_scatter_still_exact():
    x = torch.randn(4, 6)
    index = torch.argsort(torch.rand(4, 6), dim=1)[:, :3]  # three writes per row
    fn = lambda x: x.scatter(1, index, -1.0)  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="neuron", fullgraph=True)(x), fn(x))


def test_repeated_indices_write_one_of_their_values_as_eager_does():
    # where indices repeat, eager writes one of the values (CPU: the last along dim); the
    # decomposition picks the last too. It used to add the repeats up: a value eager never
    # writes (22 off on rows of 37 from x.scatter(1, idx, 3 x) with idx of x's magnitudes)
    def fn(x, idx, src):
        return x.scatter(1, idx, src), x.scatter(0, idx[:, :3].t().contiguous() % 4, src[:, :3].t().contiguous())

    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    for dtype in (torch.float32, torch.int64, torch.bool):
        x = torch.randint(0, 2, (4, 37)).to(dtype)
        idx = torch.randint(0, 5, (4, 9))  # nine writes into five columns per row: repeats
        src = torch.randint(-3, 4, (4, 9)).to(dtype)
        got, want = compiled(x, idx, src), fn(x, idx, src)
        for g, w in zip(got, want):
            assert torch.equal(g, w), (dtype, g, w)


def test_cross_entropy_backward_with_ignore_index():
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 5))
    target[0, 1] = -100

    def loss(logits):
        return F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=-100)

    ref_logits = logits.detach().clone().requires_grad_()
    loss(ref_logits).backward()
    got = torch.compile(loss, backend="neuron")(logits)
    got.backward()
    torch.testing.assert_close(got, loss(ref_logits.detach()))
    torch.testing.assert_close(logits.grad, ref_logits.grad)
    backward_ops = {}
    for report in neuron_compile.compile_reports():
        if report.kind == "backward":
            backward_ops.update(report.ops)
    assert backward_ops and not any("scatter" in name for name in backward_ops), backward_ops
    # and no sum of the one-hot over the classes either (graph_rewrites.fold_one_hot_sums)
    assert "sum.dim_IntList" not in backward_ops, backward_ops
