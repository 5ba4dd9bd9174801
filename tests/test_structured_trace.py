"""Our ``TORCH_TRACE`` artifacts in-process (``neuron_compile.structured_trace``): a bucketing decision and
a lowering error's reproducer folder, read from torch's trace log the way ``tlparse`` reads them."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from neuron_compile import LoweringError


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.artifacts: dict[str, object] = {}

    def emit(self, record):
        artifact = getattr(record, "metadata", {}).get("artifact")
        if artifact and artifact["name"].startswith("neuron_"):
            payload = record.payload
            self.artifacts[artifact["name"]] = json.loads(payload) if artifact["encoding"] == "json" else payload


@pytest.fixture
def artifacts():
    from torch._logging._internal import trace_log

    handler = _Keep()
    trace_log.addHandler(handler)
    try:
        yield handler.artifacts
    finally:
        trace_log.removeHandler(handler)


@torch.library.custom_op("neuron_test_trace::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:  # a custom op: nothing lowers it
    return x.flip(0)


@opaque.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_bucketed_graph_logs_its_bucketing_decision_and_stages(artifacts, fresh_cache):
    fn = torch.compile(lambda x: torch.tanh(x).sum(-1), backend="neuron", dynamic=True)
    x = torch.randn(3, 40)
    torch.testing.assert_close(fn(x), torch.tanh(x).sum(-1))
    bucketing = next(v for k, v in artifacts.items() if k.startswith("neuron_bucketing_g"))
    assert bucketing["bucketed"] is True and bucketing["buckets"] == 128 and bucketing["symbols"]
    report = next(v for k, v in artifacts.items() if k.startswith("neuron_compile_report_g"))
    assert "xla-compile" in report["stages"] and report["cache"] == "miss"
    final = next(v for k, v in artifacts.items() if k.startswith("neuron_stablehlo_final_g"))
    assert "tensor<128x" in final or "x128x" in final  # compiled at the bucket's size


def test_a_lowering_error_logs_its_reproducer_folder(artifacts, fresh_cache):
    fn = torch.compile(lambda x: opaque(torch.relu(x)) * 2, backend="neuron")
    with pytest.raises(Exception) as raised:
        fn(torch.randn(4, 8))
    error = raised.value
    while error is not None and not isinstance(error, LoweringError):
        error = error.__cause__ or error.__context__
    assert error is not None
    logged = next(v for k, v in artifacts.items() if k.startswith("neuron_lowering_error_g"))
    assert logged["error"] == "LoweringError" and "neuron_test_trace" in logged["message"]
    assert logged["repro_dir"] == error.repro_dir and os.path.isdir(logged["repro_dir"])
