"""The ``neuron`` device behaves as CPU and CUDA do where PyTorch's own device-generic code expects it.

``tensor.data = ...`` across CPU and neuron, ``Module.to`` moving parameters
in place, CPU index tensors into neuron tensors (CUDA's rules), the memory
format of op results, and ops that used to be missing. Each test compares
with CPU eager (``assert_close``, and strides where the layout is the point).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def N(t):
    return t.to("neuron")


# --- .data = across the host boundary, and Module.to --------------------------------------------

@pytest.mark.parametrize("make", [lambda: torch.nn.Parameter(torch.ones(3)), lambda: torch.ones(3)],
                         ids=["parameter", "tensor"])
def test_data_assignment_moves_a_tensor_to_the_device_and_back_keeping_the_object(make):
    t = make()
    ident, kind, requires_grad = id(t), type(t), t.requires_grad
    t.data = t.to("neuron")
    assert id(t) == ident and type(t) is kind and t.requires_grad == requires_grad
    assert t.device.type == "neuron"
    assert_close(t.cpu(), torch.ones(3))
    t.data = t.cpu()
    assert id(t) == ident and t.device.type == "cpu"
    assert_close(t, torch.ones(3))


def test_a_parameter_moved_by_data_keeps_its_hooks_and_gets_its_gradient_on_the_device():
    p = torch.nn.Parameter(torch.arange(3.0))
    seen = []
    p.register_hook(lambda g: seen.append(g.device.type))
    p.data = p.to("neuron")
    (p * p).sum().backward()
    assert seen == ["neuron"] and p.grad.device.type == "neuron"
    assert_close(p.grad.cpu(), 2 * torch.arange(3.0))


def test_module_to_moves_parameters_in_place_as_for_cuda():
    """PyTorch's device-generic ``test_modules.py::test_to``: ``param.data`` changes, the Parameter object
    stays (an optimizer built before the move still holds it), tied weights stay tied, ``.grad`` moves."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 4), head)
    ids = torch.tensor([1, 2, 3])
    model(ids).sum().backward()
    want = model(ids)  # alive: its autograd graph holds the CPU parameters (torch's swap path refuses them)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    model.to("neuron")
    assert model[0].weight is model[2].weight
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p.device.type == "neuron" and p.grad.device.type == "neuron" for p in params)
    assert all(p.grad is g for p, g in zip(params, grads))  # moved by `.data =` too
    assert_close(model(N(ids)).cpu(), want)
    model.to("cpu")
    assert all(p is q and p.device.type == "cpu" for p, q in zip(model.parameters(), params))
