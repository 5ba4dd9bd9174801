"""Eager fallback: ops that don't lower run in PyTorch between compiled partitions.

torch.linalg.ldl_factor (LAPACK's sytrf, with its pivots) and embedding_bag with
a padding index (forward and backward) have no StableHLO lowering in torch-mlir,
no decomposition of ours and no JAX rule (see benchmarks/results/opinfo.md);
they stand in for any op that does not lower.
"""

import pytest
import torch
import torch.nn as nn

import neuron_compile
from neuron_compile import COUNTERS, LoweringError
from neuron_compile import fallback


@pytest.fixture(autouse=True)
def _forget_learned_ops():
    fallback.forget()
    yield
    fallback.forget()


class LdlInTheMiddle(nn.Module):
    """Lowerable ops, then an LDL factorization (does not lower), then lowerable ops on its result."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        ld, _ = torch.linalg.ldl_factor(y.T @ y + torch.eye(16))
        return (y * 2.0).sum(dim=0) + ld.diagonal(), ld


class EmbeddingBagTraining(nn.Module):
    """Bags of an activation's rows between two linears, trained: forward and backward graphs both fall back."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 12)
        self.fc2 = nn.Linear(12, 4)
        self.register_buffer("bags", torch.tensor([[0, 1, 2], [3, 4, 0], [1, 1, 4]]))

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        return self.fc2(nn.functional.embedding_bag(self.bags, y, mode="sum", padding_idx=0))


def test_fallback_off_is_a_clear_error():
    model = LdlInTheMiddle()
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(model, backend="neuron")(torch.randn(4, 16))
    err = info.value
    while not isinstance(err, LoweringError) and err is not None:
        err = getattr(err, "inner_exception", None) or err.__cause__
    assert isinstance(err, LoweringError), info.value
    assert err.op == "aten.linalg_ldl_factor_ex"
    assert "test_fallback.py" in (err.source or "")


def test_fallback_eager_gives_eagers_result_and_names_the_op():
    model = LdlInTheMiddle()
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        got = torch.compile(model, backend="neuron", options={"fallback": "eager"})(x)
    torch.testing.assert_close(got, ref)
    reports = neuron_compile.compile_reports()
    top = [r for r in reports if r.fallback]
    assert len(top) == 1 and top[0].fallback == {"aten.linalg_ldl_factor_ex.default": 1}
    assert any("aten.linalg_ldl_factor_ex" in n and "test_fallback.py" in n for n in top[0].notes)
    # the lowerable parts before and after the factorization compiled as partitions of their own
    parts = [r for r in reports if r.graph.startswith(top[0].graph + ".p")]
    assert len(parts) == 2 and all(r.nodes > 0 for r in parts)
    assert COUNTERS["fallback_nodes"] == 1 and COUNTERS["fallback:aten.linalg_ldl_factor_ex.default"] == 1
    assert COUNTERS["fallback_runs"] == 1
    assert "aten.linalg_ldl_factor_ex" in fallback.learned_ops()
    assert top[0].as_dict()["fallback"] == {"aten.linalg_ldl_factor_ex.default": 1}


def test_fallback_from_environment(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    model = LdlInTheMiddle()
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
    assert COUNTERS["fallback_graphs"] == 1


def test_fallback_training_matches_eager_gradients():
    model = EmbeddingBagTraining()
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
    assert any("embedding_bag" in op for r in neuron_compile.compile_reports() for op in r.fallback)


def test_xla_rejecting_a_graph_runs_it_eagerly(monkeypatch):
    from runtime.executor import XlaCompileError

    def rejects(gm, *, report, options):
        raise XlaCompileError("UNIMPLEMENTED: pretend XLA refused this graph")

    monkeypatch.setattr(fallback, "compile_graph", rejects)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron", options={"fallback": "eager"})(x), model(x))
    top = [r for r in neuron_compile.compile_reports() if r.fallback]
    assert len(top) == 1 and any("pretend XLA refused" in n for n in top[0].notes)
