"""Correctness of the call-path shortcuts: parameter buffers reused across calls, never stale."""

import torch
import torch.nn as nn

from neuron_compile.runtime.executor import PersistentBuffers


def compiled(model):
    return torch.compile(model, backend="neuron")


def test_parameters_updated_in_place_between_calls():
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    c = compiled(model)
    x = torch.randn(5, 16)
    with torch.no_grad():
        first = c(x)
        model[0].weight.mul_(-2.0)  # in place: same tensor, new version
        model[2].bias.add_(1.0)
        second = c(x)
        torch.testing.assert_close(second, model(x))
    assert not torch.allclose(first, second)


def test_optimizer_steps_are_seen():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    twin = nn.Linear(8, 1)
    twin.load_state_dict(model.state_dict())
    c = compiled(model)
    opt, opt_twin = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(4):
        for m, o, f in ((model, opt, c), (twin, opt_twin, twin)):
            o.zero_grad()
            loss = (f(x) - y).pow(2).mean()
            loss.backward()
            o.step()
        torch.testing.assert_close(model.weight, twin.weight)


def test_parameter_replaced_by_a_new_tensor():
    model = nn.Linear(6, 3)
    c = compiled(model)
    x = torch.randn(2, 6)
    with torch.no_grad():
        c(x)
        model.weight = nn.Parameter(torch.randn(3, 6))  # a new object
        torch.testing.assert_close(c(x), model(x))
        model.weight.data = torch.randn(3, 6)  # same object, new storage
        torch.testing.assert_close(c(x), model(x))


def test_inputs_that_alias_each_other_and_non_contiguous_inputs():
    def fn(a, b):
        return a * 2 + b.sum(1, keepdim=True)

    c = compiled(fn)
    base = torch.randn(6, 6)
    a = base[:, :3]  # non-contiguous view
    b = base[:, 1:5]  # overlaps a
    assert not a.is_contiguous()
    torch.testing.assert_close(c(a, b), fn(a, b))
    base.add_(1)  # the aliased storage changes in place
    torch.testing.assert_close(c(a, b), fn(a, b))


def test_persistent_buffers_keep_only_parameters_and_revalidate():
    cache = PersistentBuffers()
    p = nn.Parameter(torch.randn(4))
    buf = cache.get(0, p)
    assert cache.get(0, p) is buf  # same tensor, same version: reused
    with torch.no_grad():
        p.add_(1)
    assert cache.get(0, p) is not buf  # version changed: converted again
    activation = torch.randn(4)
    first = cache.get(1, activation)
    assert cache.get(1, activation) is not first  # activations are never kept
