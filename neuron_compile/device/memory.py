"""``torch.neuron.memory``: the device's memory as ``torch.cuda.memory`` shows CUDA's.

Every neuron storage holds at most one PJRT buffer (``storage.Data``); its
bytes are counted when ``Data.set`` gives it one and uncounted when it is
replaced or the storage dies (``storage._Counters``: current, peak, allocated,
freed). PJRT allocates each buffer on its own and frees it with its last
reference: there is no caching allocator, so every live buffer is a segment of
one block, reserved bytes are allocated bytes, and nothing is fragmented.

* ``memory_summary()``: ``torch.cuda.memory_summary``'s table (current, peak,
  allocated, freed; live allocations and the largest of them);
* ``memory_snapshot()`` / ``_snapshot()``: ``torch.cuda.memory._snapshot()``'s
  dict (``segments`` with their ``blocks``, ``device_traces``), built from the
  live storages (found by the garbage collector's list: a debugging call,
  tens of milliseconds on a large heap);
* ``_record_memory_history(enabled="all", max_entries=...)``: from now on
  each allocation keeps the Python stack that made it, and with ``"all"``
  each alloc and free is a trace entry (``storage._Counters.recorder``: one
  attribute check per ``Data.set`` while off);
* ``_dump_snapshot(path)``: the snapshot pickled, which
  ``torch.cuda._memory_viz`` (``python -m torch.cuda._memory_viz trace_plot``)
  and https://pytorch.org/memory_viz read.

Addresses are made up (a running offset per allocation: PJRT's CPU buffers
have host addresses, but a device's would not) and unique while recorded.
"""

from __future__ import annotations

import collections
import sys
import time

from . import storage as _storage

_SELF = (__file__, _storage.__file__)  # frames of this bookkeeping, left out of the stacks
_ALIGN = 512


class _History:
    """What ``_record_memory_history`` keeps: each live allocation's (address, bytes, frames), and the trace."""

    def __init__(self, trace: bool, max_entries: int, stacks: bool):
        self.trace = collections.deque(maxlen=max_entries) if trace else None
        self.stacks = stacks
        self.live: dict[int, tuple] = {}  # id(Data) -> (address, nbytes, frames)

    def on_set(self, data, nbytes: int) -> None:
        """``data`` (a ``storage.Data``) is about to hold ``nbytes`` (0: nothing) in place of what it holds."""
        if data.nbytes:
            self.on_free(data)
        if nbytes:
            frames = _frames() if self.stacks else []
            address = _new_address(nbytes)
            self.live[id(data)] = (address, nbytes, frames)
            if self.trace is not None:
                self.trace.append(_entry("alloc", address, nbytes, frames))

    def on_free(self, data) -> None:
        known = self.live.pop(id(data), None)
        if self.trace is not None and data.nbytes:
            address = known[0] if known is not None else _address_of(data)
            frames = _frames() if self.stacks else []
            self.trace.append(_entry("free_requested", address, data.nbytes, frames))
            self.trace.append(_entry("free_completed", address, data.nbytes, frames))


_next_address = 1 << 32
_addresses: dict[int, tuple] = {}  # id(Data) -> (address, nbytes): storages met by a snapshot, not recorded


def _new_address(nbytes: int) -> int:
    global _next_address
    address = _next_address
    _next_address += -(-nbytes // _ALIGN) * _ALIGN
    return address


def _address_of(data) -> int:
    known = _addresses.get(id(data))
    if known is None or known[1] != data.nbytes:
        known = _addresses[id(data)] = (_new_address(data.nbytes), data.nbytes)
    return known[0]


def _frames(limit: int = 64) -> list[dict]:
    """The Python stack, innermost first, as ``torch.cuda.memory``'s frames (our bookkeeping left out)."""
    frames, frame = [], sys._getframe(1)
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        if code.co_filename not in _SELF:
            frames.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return frames


def _entry(action: str, address: int, nbytes: int, frames: list) -> dict:
    return {"action": action, "addr": address, "size": nbytes, "stream": 0, "frames": frames,
            "time_us": time.time_ns() // 1000, "device_free": 0}


# --- recording --------------------------------------------------------------------------------

def _record_memory_history(enabled="all", context="all", stacks="python", max_entries: int = sys.maxsize,
                           device=None, clear_history: bool = False, **_ignored) -> None:
    """``torch.cuda.memory._record_memory_history``: ``enabled`` None stops recording; ``"state"`` keeps the
    stack of each live allocation; ``"all"`` also keeps a trace of every alloc and free (the last
    ``max_entries``). ``context=None`` keeps no stacks. Allocations made before recording show in snapshots
    without stacks."""
    recorder = _storage._memory.recorder
    if enabled is None:
        _storage._memory.recorder = None
        return
    if enabled not in ("state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', not {enabled!r}")
    history = _History(trace=enabled == "all", max_entries=max_entries, stacks=context is not None)
    if recorder is not None and not clear_history:
        history.live = recorder.live
        if recorder.trace is not None and history.trace is not None:
            history.trace.extend(recorder.trace)
    _storage._memory.recorder = history


def _live_datas() -> list:
    """Every storage's data that holds bytes now (the garbage collector's list of objects)."""
    import gc

    data_type = _storage.Data
    return [o for o in gc.get_objects() if type(o) is data_type and o.nbytes]


def _device_of(data) -> int:
    buffer = getattr(data, "_buffer", None) if hasattr(data.__class__, "_buffer") else data.buffer
    device = getattr(buffer, "device", None)
    return getattr(device, "id", 0) if device is not None and not callable(device) else 0


def _snapshot(device=None) -> dict:
    """``torch.cuda.memory._snapshot()``'s dict: one segment of one active block per live buffer (with the
    stack that allocated it while history was recorded), and the recorded trace per device."""
    recorder = _storage._memory.recorder
    live = recorder.live if recorder is not None else {}
    segments, count = [], 1
    for data in _live_datas():
        known = live.get(id(data))
        if known is not None and known[1] == data.nbytes:
            address, frames = known[0], known[2]
        else:
            address, frames = _address_of(data), []
        index = _device_of(data)
        count = max(count, index + 1)
        nbytes = data.nbytes
        block = {"address": address, "size": nbytes, "requested_size": nbytes, "state": "active_allocated",
                 "frames": frames}
        segments.append({"device": index, "address": address, "total_size": nbytes, "allocated_size": nbytes,
                         "active_size": nbytes, "requested_size": nbytes, "stream": 0,
                         "segment_type": "large" if nbytes > (1 << 20) else "small", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": frames, "blocks": [block]})
    segments.sort(key=lambda s: s["address"])
    alive = {s["address"] for s in segments}
    for key in [k for k, (address, _) in _addresses.items() if address not in alive]:
        del _addresses[key]  # storages gone since the last snapshot
    traces = [[] for _ in range(count)]
    if recorder is not None and recorder.trace is not None:
        traces[0] = list(recorder.trace)
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "backend": "pjrt (one buffer per storage)"}}


def memory_snapshot(device=None) -> list:
    """``torch.cuda.memory_snapshot()``: the segments of ``_snapshot()``."""
    return _snapshot(device)["segments"]


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle ``_snapshot()`` to ``filename``, for ``torch.cuda._memory_viz`` and pytorch.org/memory_viz."""
    import pickle

    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


# --- summary ----------------------------------------------------------------------------------

def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return str(nbytes)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary``'s report: allocated bytes (current, peak, allocated and freed since
    the last reset), live allocations, and the largest of them with the line that made it when recorded."""
    counters = _storage._memory
    datas = _live_datas()
    recorder = counters.recorder
    lines = ["|" + "=" * 75 + "|",
             "|" + " neuron memory summary (PJRT buffers: one per storage, no cache)".ljust(75) + "|",
             "|" + "-" * 75 + "|",
             f"| {'metric':<28}{'current':>11}{'peak':>12}{'allocated':>12}{'freed':>11} |",
             "|" + "-" * 75 + "|",
             f"| {'allocated memory':<28}{_size(counters.live):>11}{_size(counters.peak):>12}"
             f"{_size(counters.allocated):>12}{_size(counters.freed):>11} |",
             f"| {'reserved memory':<28}{_size(counters.live):>11}{_size(counters.peak):>12}"
             f"{_size(counters.allocated):>12}{_size(counters.freed):>11} |",
             f"| {'live allocations':<28}{len(datas):>11}{'':>35} |",
             "|" + "=" * 75 + "|"]
    if not abbreviated and datas:
        lines.append("largest live allocations:")
        for data in sorted(datas, key=lambda d: -d.nbytes)[:10]:
            known = recorder.live.get(id(data)) if recorder is not None else None
            where = _user_frame(known[2]) if known is not None else "(not recorded: _record_memory_history)"
            lines.append(f"  {_size(data.nbytes):>11}  {data.dtype} x {data.numel}  {where}")
    return "\n".join(lines)


def _user_frame(frames: list) -> str:
    for frame in frames:
        path = frame["filename"]
        if not any(part in path for part in ("/torch/", "/neuron_compile/", "<frozen")):
            return f"{path}:{frame['line']} in {frame['name']}"
    return f"{frames[0]['filename']}:{frames[0]['line']}" if frames else "?"
