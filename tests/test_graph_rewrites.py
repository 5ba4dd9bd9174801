"""fold_one_hot_sums: cross-entropy's backward without summing a one-hot tensor over the classes.

The compiled end-to-end check (loss, gradient, no class sum in the backward graph) is
tests/test_scatter_one_per_row.py::test_cross_entropy_backward_with_ignore_index.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.decompositions import decomposition_table
from neuron_compile.graph_rewrites import fold_one_hot_sums


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

