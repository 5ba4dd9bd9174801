"""A CI-sized slice of the OpInfo coverage run: ops known to pass must keep passing.

``tests/opinfo_passing.json`` pins the OpInfo entries whose float32 samples all
passed in ``benchmarks/opinfo_coverage.py`` (regenerate it with ``--write-passing``).
This test runs an evenly spread slice of them (every op with
NEURON_OPINFO_ALL=1): the first float32 sample forward, and backward where
the pinned run passed backward, compiled with ``fullgraph=True`` against eager,
through the same code as the harness.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("expecttest", reason="PyTorch's OpInfo database imports expecttest (test extra)")

ROOT = Path(__file__).resolve().parent.parent
PINNED = json.loads((Path(__file__).parent / "opinfo_passing.json").read_text())
SLICE = 48  # ops per CI run, spread over the pinned list (about a minute on 2 cores)


def _harness():
    spec = importlib.util.spec_from_file_location("opinfo_coverage", ROOT / "benchmarks" / "opinfo_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _selected() -> list[str]:
    names = sorted(PINNED)
    if os.environ.get("NEURON_OPINFO_ALL") == "1" or len(names) <= SLICE:
        return names
    step = len(names) / SLICE
    return [names[int(i * step)] for i in range(SLICE)]


@pytest.fixture(scope="module")
def op_db():
    harness = _harness()
    return harness, harness.ops_by_name()


def test_pin_is_substantial():
    assert len(PINNED) > 300, "the pinned list lost most of its ops: regenerate it from a full run"


@pytest.mark.parametrize("name", _selected())
def test_pinned_op_still_passes(op_db, name):
    harness, by_name = op_db
    op = by_name[name]
    torch.manual_seed(0)
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))
    status, error = harness._run_forward(op, sample, "float32", harness.is_shape_only(op, sample))
    assert status in ("pass", "eager-error"), f"{name} forward: {status}: {error}"
    if PINNED[name]["backward"]:
        torch.manual_seed(0)
        sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=True)))
        status, error = harness._run_backward(op, sample, harness.is_shape_only(op, sample))
        assert status in ("pass", "eager-error", "no-grad"), f"{name} backward: {status}: {error}"
