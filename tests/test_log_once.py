"""Hugging Face's once-only log calls inside a model do not break the graph (``backend.skip_log_once_calls``).

transformers adds ``warning_once``/``info_once`` to ``logging.Logger``; Dynamo graph-breaks on
logger methods unless they are in ``torch._dynamo.config.ignore_logging_functions``, which the
``neuron`` backend fills when torch.compile looks it up.
"""

import logging

import torch
import transformers.utils.logging as hf_logging
from torch._dynamo.utils import counters

from neuron_compile.capture.backend import skip_log_once_calls

logger = hf_logging.get_logger("neuron_compile.tests.log_once")


class WarnsOnce(torch.nn.Module):
    """A layer, a transformers-style once-only warning, then more work: one graph when skipped, two otherwise."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        logger.warning_once("WarnsOnce: defaulting to the squared loss")
        logger.info_once("WarnsOnce: info")
        return self.fc2(h).pow(2).mean()


def _step(fn, model, x):
    model.zero_grad(set_to_none=True)
    loss = fn(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _compile_and_compare():
    model = WarnsOnce()
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend="neuron")
    loss, grads = _step(compiled, model, x)
    expected_loss, expected_grads = _step(model, model, x)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grads, expected_grads)


def test_hf_log_once_calls_do_not_break_the_graph():
    counters.clear()
    _compile_and_compare()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert {logging.Logger.warning_once, logging.Logger.info_once} <= torch._dynamo.config.ignore_logging_functions


def test_opting_out_keeps_dynamos_graph_break(monkeypatch):
    # NEURON_COMPILE_SKIP_LOG_ONCE=0 is read at every graph too, so the backend does not add them back
    monkeypatch.setenv("NEURON_COMPILE_SKIP_LOG_ONCE", "0")
    assert skip_log_once_calls(False) == []
    try:
        assert logging.Logger.warning_once not in torch._dynamo.config.ignore_logging_functions
        counters.clear()
        _compile_and_compare()
        assert sum(counters["graph_break"].values()) >= 1
        assert counters["stats"]["unique_graphs"] == 2
        assert logging.Logger.warning_once not in torch._dynamo.config.ignore_logging_functions
    finally:
        skip_log_once_calls(True)
