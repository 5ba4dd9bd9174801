"""The private torch APIs of our profiler events and trace artifacts (``neuron_compile._profiler_hooks``).

Each test exercises one directly, so a torch upgrade that changes it fails
here, by name, before a profile silently loses our events.
"""

from __future__ import annotations

import json
import logging

import torch

from neuron_compile import _profiler_hooks


def test_is_profiler_enabled_follows_the_profiler():
    assert _profiler_hooks.STATE is torch.autograd.profiler
    assert _profiler_hooks.STATE._is_profiler_enabled is False
    with torch.profiler.profile():
        assert _profiler_hooks.STATE._is_profiler_enabled is True
        assert _profiler_hooks.profiler_active()
    assert _profiler_hooks.STATE._is_profiler_enabled is False
    with torch.autograd.profiler.profile():  # the legacy profiler sets it too
        assert _profiler_hooks.profiler_active()
    assert not _profiler_hooks.profiler_active()


def test_record_function_fast_gives_an_event_with_shapes_and_args(tmp_path):
    x = torch.ones(3, 5)
    with torch.profiler.profile(record_shapes=True) as prof:
        with _profiler_hooks.event("neuron::probe", (x,), {"bytes": 60, "graph": "g0.forward"}):
            pass
        with _profiler_hooks.event("neuron::bare"):  # no inputs, no values: must not reach torch as None
            pass
    events = {e.name: e for e in prof.profiler.function_events}
    assert events["neuron::probe"].input_shapes == [[3, 5]] and "neuron::bare" in events
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    probe = next(e for e in json.loads(path.read_text())["traceEvents"] if e["name"] == "neuron::probe")
    assert probe["args"]["bytes"] == 60 and probe["args"]["graph"] == "g0.forward"


def test_trace_structured_artifact_reaches_the_trace_log():
    from torch._logging._internal import trace_log

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    trace_log.addHandler(handler)
    try:
        assert _profiler_hooks.trace_active()
        _profiler_hooks.trace_artifact("neuron_probe", "json", lambda: {"a": 1})
    finally:
        trace_log.removeHandler(handler)
    # torch's records carry the metadata and the payload as attributes (TorchLogsFormatter writes them)
    record = next(r for r in records if getattr(r, "metadata", {}).get("artifact"))
    assert record.metadata["artifact"] == {"name": "neuron_probe", "encoding": "json"}
    assert json.loads(record.payload) == {"a": 1}
    assert _profiler_hooks.current_compile_id() is None  # outside a compile
