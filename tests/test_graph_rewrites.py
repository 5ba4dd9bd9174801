"""fold_one_hot_sums: cross-entropy's backward without summing a one-hot tensor over the classes."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compile
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


def test_compiled_training_loss_backward_has_no_class_sum():
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 5))
    target[0, 1] = -100

    def loss(logits):
        return F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=-100)

    ref = logits.detach().clone().requires_grad_()
    loss(ref).backward()
    got = torch.compile(loss, backend="neuron")(logits)
    got.backward()
    torch.testing.assert_close(logits.grad, ref.grad)
    backward = [r for r in neuron_compile.compile_reports() if r.kind == "backward"]
    assert backward and all("sum.dim_IntList" not in r.ops for r in backward), [r.ops for r in backward]
