"""``torch.neuron.memory``: summary, snapshots in ``torch.cuda._memory_viz``'s format, recorded stacks.

The device's counters count each live storage's PJRT buffer; a snapshot lists
the same storages, so its totals must equal the counters, and each block's
size the PJRT buffer's own size (``on_device_size_in_bytes``).
"""

from __future__ import annotations

import gc
import pickle

import torch
from torch.cuda import _memory_viz

from neuron_compile.device.storage import data_of


def _pjrt_bytes(tensor) -> int:
    return data_of(tensor).buffer.on_device_size_in_bytes()


def _ours(segment) -> bool:
    return any(f["name"] == "_allocate" and f["filename"] == __file__ for f in segment["frames"])


def _allocate():
    a = torch.randn(64, 32).to("neuron")
    b = a * 2.0
    c = torch.arange(1000, dtype=torch.int64).to("neuron") + 1
    return a, b, c


def test_snapshot_totals_match_the_device_counters_and_the_pjrt_buffers(tmp_path):
    _allocate()  # compiles the ops first: what follows allocates only the results
    gc.collect()
    gc.disable()  # the counters are the process's: nothing else may die or appear while we count
    try:
        start = torch.neuron.memory_allocated()
        torch.neuron.reset_peak_memory_stats()
        torch.neuron.memory._record_memory_history(max_entries=10000)
        a, b, c = _allocate()
        sizes = [_pjrt_bytes(t) for t in (a, b, c)]
        assert sizes == [64 * 32 * 4, 64 * 32 * 4, 1000 * 8]
        assert torch.neuron.memory_allocated() - start == sum(sizes)
        snapshot = torch.neuron.memory._snapshot()
        total = sum(s["allocated_size"] for s in snapshot["segments"])
        assert total == torch.neuron.memory_allocated() == torch.neuron.memory_stats()["allocated_bytes.all.current"]
        ours = sorted(s["total_size"] for s in snapshot["segments"] if _ours(s))
        assert ours == sorted(sizes)  # each allocation made here has its stack, at its buffer's size
        del b
        assert torch.neuron.memory_allocated() - start == sizes[0] + sizes[2]
        # the peak: all three, and the arange moved to the device while its "+ 1" was computed
        assert torch.neuron.max_memory_allocated() - start == sum(sizes) + sizes[2]

        path = tmp_path / "snapshot.pickle"
        torch.neuron.memory._dump_snapshot(str(path))
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        torch.neuron.memory._record_memory_history(enabled=None)
    finally:
        gc.enable()
    assert sum(_memory_viz.calc_active(s) for s in loaded["segments"]) == total - sizes[1]
    raw = lambda lines: lines  # noqa: E731 - the flamegraph lines, not flamegraph.pl's SVG (a download)
    lines = _memory_viz.memory(loaded, format_flamegraph=raw)
    assert "_allocate" in lines and "test_device_memory_snapshot.py" in lines
    assert _memory_viz.segments(loaded, format_flamegraph=raw)
    assert "segments:" in _memory_viz.segsum(loaded)
    trace = loaded["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc" and any(f["name"] == "_allocate" for f in e["frames"])]
    # a, b, c and the arange moved to the device before its "+ 1"
    assert sorted(e["size"] for e in allocs) == sorted(sizes + [sizes[2]])
    freed = [e for e in trace if e["action"] == "free_completed" and e["addr"] in {x["addr"] for x in allocs}]
    assert sorted(e["size"] for e in freed) == sorted([sizes[1], sizes[2]])  # b, and that moved arange
    assert "TOTAL MEM" in _memory_viz.trace(loaded)
    assert "snapshot.pickle" in _memory_viz.trace_plot(loaded)  # the HTML viewer's page embeds it


def test_memory_summary_and_memory_snapshot():
    keep = torch.arange(4096, dtype=torch.float32).to("neuron")
    summary = torch.neuron.memory_summary()
    assert "allocated memory" in summary and "live allocations" in summary
    segments = torch.neuron.memory_snapshot()
    assert sum(s["allocated_size"] for s in segments) == torch.neuron.memory_allocated()
    assert any(s["total_size"] == 4096 * 4 for s in segments)
    del keep
