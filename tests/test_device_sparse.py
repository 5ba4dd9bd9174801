"""Sparse COO tensors on ``neuron`` (``neuron_compile/device/sparse.py``), against the same code on CPU.

PyTorch's test_optim.py turns gradients sparse with ``grad.to_sparse()`` for
SparseAdam, and ``Embedding(sparse=True)`` makes sparse gradients by itself;
before ``device/sparse.py`` the device could not lower ``aten._to_sparse`` and
had no kernel for any ``SparsePrivateUse1`` op.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_to_sparse_keeps_indices_and_values_on_the_device():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    s = x.to("neuron").to_sparse()
    assert s.device.type == "neuron" and s.layout == torch.sparse_coo
    assert s._indices().device.type == "neuron" and s._values().device.type == "neuron"
    ref = x.to_sparse()
    assert_close(s._indices().cpu(), ref._indices())
    assert_close(s._values().cpu(), ref._values())
    assert_close(s.to_dense().cpu(), x)
    assert_close(s.coalesce().values().cpu(), ref.coalesce().values())
    assert_close(copy.deepcopy(s).to_dense().cpu(), x)
    assert_close(x.to("neuron").to_sparse(1).to_dense().cpu(), x)


def test_an_empty_sparse_gradient_built_on_the_device_is_a_noop_for_sparse_adam():
    # test_optim.py's test_step_is_noop_for_zero_grads: indices and values made on the device
    param = torch.randn(5, 1)
    on_device = param.to("neuron").requires_grad_()
    on_device.grad = torch.sparse_coo_tensor(torch.empty((1, 0), device="neuron"),
                                             torch.empty((0, 1), device="neuron"), (5, 1), device="neuron")
    assert on_device.grad.device.type == "neuron" and on_device.grad._nnz() == 0
    torch.optim.SparseAdam([on_device]).step()
    assert_close(on_device.detach().cpu(), param)


def _sparse_adam_steps(device):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(10, 5).to(device))
    bias = torch.nn.Parameter(torch.randn(10).to(device))
    x = torch.randn(5).to(device)
    optimizer = torch.optim.SparseAdam([weight, bias], lr=0.01)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = (weight.mv(x) + bias).pow(2).sum()
        loss.backward()
        weight.grad, bias.grad = weight.grad.to_sparse(), bias.grad.to_sparse()
        optimizer.step()
        losses.append(loss.detach().cpu())
    state = optimizer.state[weight]
    return weight.detach().cpu(), bias.detach().cpu(), torch.stack(losses), state["exp_avg"].cpu()


def test_sparse_adam_on_the_device_matches_cpu():
    for got, want in zip(_sparse_adam_steps("neuron"), _sparse_adam_steps("cpu")):
        assert_close(got, want)


def test_sparse_embedding_gradient_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 3, sparse=True)
    emb = copy.deepcopy(ref).to("neuron")
    index = torch.tensor([[1, 2, 1], [7, 2, 0]])
    (ref(index) * 2).sum().backward()
    (emb(index.to("neuron")) * 2).sum().backward()
    assert emb.weight.grad.layout == torch.sparse_coo and emb.weight.grad.device.type == "neuron"
    assert_close(emb.weight.grad.to_dense().cpu(), ref.weight.grad.to_dense())
    torch.optim.SGD(emb.parameters(), lr=0.5).step()
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    assert_close(emb.weight.detach().cpu(), ref.weight.detach())
