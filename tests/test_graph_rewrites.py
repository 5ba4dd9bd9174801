"""Graph rewrites before planning and partitioning.

fold_one_hot_sums: cross-entropy's backward without summing a one-hot tensor over the classes.
The compiled end-to-end check (loss, gradient, no class sum in the backward graph) is
tests/test_scatter_one_per_row.py::test_cross_entropy_backward_with_ignore_index.

eliminate_common_subexpressions: the CSE the partitioner gets instead of PyTorch's (which imports
all of Inductor); tests/test_cold_start.py checks a training step through it against eager.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.decompositions import decomposition_table
from neuron_compile.decompositions.graph_rewrites import eliminate_common_subexpressions, fold_one_hot_sums


def _loss_and_grad(kwargs):
    def fn(logits, target, weight):
        logits = logits.detach().requires_grad_()
        loss = F.cross_entropy(logits, target, weight=weight if kwargs.get("weighted") else None,
                               **{k: v for k, v in kwargs.items() if k != "weighted"})
        (grad,) = torch.autograd.grad(loss, logits)
        return loss, grad

    return fn


# (cross_entropy arguments, one-hot sums folded): with class weights the scale varies along the
# classes, and label smoothing sums other terms; neither is the pattern, so neither is touched.
CASES = [(dict(), 1), (dict(ignore_index=3), 1), (dict(reduction="sum"), 1), (dict(weighted=True), 0),
         (dict(label_smoothing=0.1), 0)]


@pytest.mark.parametrize("kwargs,expected", CASES, ids=["mean", "ignore_index", "sum", "weight", "label_smoothing"])
def test_folded_graph_computes_the_same(kwargs, expected):
    logits, target, weight = torch.randn(6, 11), torch.randint(0, 11, (6,)), torch.rand(11) + 0.5
    target[1] = 3  # hit ignore_index where it is set
    gm = make_fx(_loss_and_grad(kwargs), decomposition_table=decomposition_table(),
                 tracing_mode="fake")(logits, target, weight)
    original = copy.deepcopy(gm)
    folded = fold_one_hot_sums(gm)
    assert folded == expected, gm.code
    torch.testing.assert_close(gm(logits, target, weight), original(logits, target, weight))


def test_nothing_to_fold_leaves_the_graph_alone():
    def fn(x):
        return (x * (torch.arange(5) == 2)).sum(1)  # one-hot, but the index is not per row: no where(.., 0)

    gm = make_fx(fn)(torch.randn(3, 5))
    before = gm.code
    assert fold_one_hot_sums(gm) == 0 and gm.code == before



def _ops(gm, name):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target))


def test_cse_merges_repeats_and_computes_the_same():
    def fn(x, w):
        a = torch.mm(x, w.t())
        b = torch.mm(x, w.t())  # the same transpose and matmul again
        return (a.relu() + b.sigmoid()).sum(0)

    x, w = torch.randn(4, 8), torch.randn(3, 8)
    gm = make_fx(fn, tracing_mode="fake")(x, w)
    assert _ops(gm, "aten.mm") == 2 and _ops(gm, "aten.t") == 2
    assert eliminate_common_subexpressions(gm.graph) == 2
    gm.recompile()
    assert _ops(gm, "aten.mm") == 1 and _ops(gm, "aten.t") == 1
    torch.testing.assert_close(gm(x, w), fn(x, w))


def test_cse_keeps_random_ops_outputs_and_reads_across_a_mutation():
    def fn(x, buf):
        r1, r2 = torch.rand_like(x), torch.rand_like(x)  # two draws, not one
        before = buf * 2
        buf[:2].add_(1)  # a mutation through a view: the same `buf * 2` after it reads other data
        after = buf * 2
        return r1 + r2, before + 1, after + 1, x.exp(), x.exp()  # two outputs must not alias

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4), torch.zeros(4))
    counts = {op: _ops(gm, op) for op in ("rand_like", "aten.mul", "aten.exp")}
    assert eliminate_common_subexpressions(gm.graph) == 0
    gm.recompile()
    assert {op: _ops(gm, op) for op in counts} == counts == {"rand_like": 2, "aten.mul": 2, "aten.exp": 2}
    x, buf = torch.randn(4), torch.zeros(4)
    _, before, after, e1, e2 = gm(x, buf)
    torch.testing.assert_close(before, torch.ones(4))
    torch.testing.assert_close(after, torch.tensor([3.0, 3.0, 1.0, 1.0]))
    assert e1.data_ptr() != e2.data_ptr()


@pytest.mark.parametrize("fn", [
    lambda x: x[:, :, :0].sum(),  # Torch-MLIR lowers a slice ending at 0 as one ending at the dim's size
    lambda x: (x[..., :0] * 2).mean(-1) + x[:, :1, :1].sum(),
    lambda x: torch.cat([x[:, :0], x[:, 1:]], 1).exp(),
], ids=["sum", "mean", "cat"])
def test_zero_size_values_compile(fn):
    import neuron_compile

    torch._dynamo.reset()
    neuron_compile.reset()
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), fn(x), equal_nan=True)  # a mean of nothing


def test_zero_size_values_become_constants():
    from neuron_compile.decompositions.graph_rewrites import zero_size_values_to_constants

    def fn(x):
        return x[:, :0].sum(1) + 1, x[:, :0]

    gm = make_fx(fn)(torch.randn(3, 4))
    assert zero_size_values_to_constants(gm) == 1  # the sliced operand of sum; the output keeps its node
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.zeros.default in targets
    x = torch.randn(3, 4)
    for got, ref in zip(gm(x), fn(x)):
        torch.testing.assert_close(got, ref)
