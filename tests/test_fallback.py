"""Eager fallback: ops that don't lower run in PyTorch between compiled partitions.

The op that does not lower is a custom op, ``neuron_test::cube_rows``, with a
backward custom op of its own: Torch-MLIR will never lower them, whatever
decompositions or JAX rules we add, so they stand in for any op that does not.
"""

import pytest
import torch
import torch.nn as nn

import neuron_compile
from neuron_compile import COUNTERS, LoweringError
from neuron_compile.capture import fallback


@pytest.fixture(autouse=True)
def _forget_learned_ops():
    fallback.forget()
    yield
    fallback.forget()


@torch.library.custom_op("neuron_test::cube_rows", mutates_args=())
def cube_rows(x: torch.Tensor) -> torch.Tensor:
    return x.flip(0) ** 3


@cube_rows.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("neuron_test::cube_rows_backward", mutates_args=())
def cube_rows_backward(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return (3 * x.flip(0) ** 2 * grad).flip(0)


@cube_rows_backward.register_fake
def _(x, grad):
    return torch.empty_like(x)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


cube_rows.register_autograd(lambda ctx, grad: cube_rows_backward(ctx.saved_tensors[0], grad),
                            setup_context=_save_input)


class CubeInTheMiddle(nn.Module):
    """Lowerable ops, then an op that does not lower, then lowerable ops on its result."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        h = cube_rows(y)
        return (y * 2.0).sum(dim=0) + h.mean(dim=0), h


class CubeTraining(nn.Module):
    """The op between two linears, trained: forward and backward graphs both fall back."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 12)
        self.fc2 = nn.Linear(12, 4)

    def forward(self, x):
        return self.fc2(cube_rows(torch.relu(self.fc1(x))))


def test_fallback_off_is_a_clear_error():
    model = CubeInTheMiddle()
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(model, backend="neuron")(torch.randn(4, 16))
    err = info.value
    while not isinstance(err, LoweringError) and err is not None:
        err = getattr(err, "inner_exception", None) or err.__cause__
    assert isinstance(err, LoweringError), info.value
    assert err.op.startswith("neuron_test.cube_rows")
    assert "test_fallback.py" in (err.source or "")


def test_fallback_eager_gives_eagers_result_and_names_the_op():
    model = CubeInTheMiddle()
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        got = torch.compile(model, backend="neuron", options={"fallback": "eager"})(x)
    torch.testing.assert_close(got, ref)
    reports = neuron_compile.compile_reports()
    top = [r for r in reports if r.fallback]
    assert len(top) == 1 and top[0].fallback == {"neuron_test.cube_rows.default": 1}
    assert any("neuron_test.cube_rows" in n and "test_fallback.py" in n for n in top[0].notes)
    # the lowerable parts before and after the op compiled as partitions of their own
    parts = [r for r in reports if r.graph.startswith(top[0].graph + ".p")]
    assert len(parts) == 2 and all(r.nodes > 0 for r in parts)
    assert COUNTERS["fallback_nodes"] == 1 and COUNTERS["fallback:neuron_test.cube_rows.default"] == 1
    assert COUNTERS["fallback_runs"] == 1
    assert "neuron_test.cube_rows" in fallback.learned_ops()
    assert top[0].as_dict()["fallback"] == {"neuron_test.cube_rows.default": 1}


def test_fallback_from_environment(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    model = CubeInTheMiddle()
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
    assert COUNTERS["fallback_graphs"] == 1


def test_fallback_training_matches_eager_gradients():
    model = CubeTraining()
    x = torch.randn(5, 8)
    ref = model(x)
    ref.square().sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got = torch.compile(model, backend="neuron", options={"fallback": "eager"})(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, ref)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], msg=name)
    kinds = {r.kind for r in neuron_compile.compile_reports() if r.fallback}
    assert "forward" in kinds
    assert any("cube_rows_backward" in op for r in neuron_compile.compile_reports() for op in r.fallback)


def test_xla_rejecting_a_graph_runs_it_eagerly(monkeypatch):
    from neuron_compile.runtime.executor import XlaCompileError

    def rejects(gm, *, report, options):
        raise XlaCompileError("UNIMPLEMENTED: pretend XLA refused this graph")

    monkeypatch.setattr(fallback, "compile_graph", rejects)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron", options={"fallback": "eager"})(x), model(x))
    top = [r for r in neuron_compile.compile_reports() if r.fallback]
    assert len(top) == 1 and any("pretend XLA refused" in n for n in top[0].notes)


def test_data_dependent_shape_is_refused_not_miscompiled():
    """index_put with a boolean mask: its backward indexes the gradient with the mask, a shape that
    depends on the mask's values. Torch-MLIR lowered it to a dynamic shape that XLA ran with wrong
    gradients; now the graph is refused naming the op, and with fallback the gradients are eager's."""
    x, mask, v = torch.randn(5, 5), torch.tensor([True, True, False, True, False]), torch.randn(5)

    def fn(x, mask, v):  # the mask an input: its values unknown when the graph compiles
        return torch.index_put(x, (mask,), v)

    def grads(call):
        xs, vs = x.clone().requires_grad_(True), v.clone().requires_grad_(True)
        out = call(xs, mask, vs)
        return torch.autograd.grad((out * torch.arange(25.0).reshape(5, 5)).sum(), [xs, vs])

    ref = grads(fn)
    with pytest.raises(Exception) as info:
        grads(torch.compile(fn, backend="neuron", fullgraph=True))  # without fullgraph, Dynamo leaves it eager
    from neuron_compile.lowering import exception_chain

    err = next(e for e in exception_chain(info.value) if isinstance(e, LoweringError))
    assert err.op == "aten.index.Tensor" and "depends on tensor values" in str(err)
    torch._dynamo.reset()
    got = grads(torch.compile(fn, backend="neuron", fullgraph=True, options={"fallback": "eager"}))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
