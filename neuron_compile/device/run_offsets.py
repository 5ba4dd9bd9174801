"""Views' offsets in a fused run: which are built into its module as constants.

A view with fewer elements than its storage is read at a run-time offset, a 0-d int64 input of its op's
executable (``lowering.runtime_offsets``): a batch sliced at a new offset compiles nothing. Inside a fused
run, XLA then computes a ``dynamic_slice`` and a pad around it for each such view, ops of their own. So
``op_queue`` notes a run's offsets at its first sighting (``of_run``), and the build that starts at its
second takes those that did not move as constants (``held``; ``fusion.fused_text``): XLA reads those views
as static slices inside their readers (GPT-2's query, key and value split; GPT-2's fused run took 0.93x the
time). Those that moved (a batch sliced at a random offset each step, a sampling loop's position) stay
parameters. A run whose constant moves later is checked at each run (``hold``) and built again with the
offsets that held (``held``).

The offsets' values come from the 0-d buffers that hold them (``opkernel._scalar_buffer`` keeps one per
value and registers it here: ``remember``).
"""

from __future__ import annotations

_INTS: dict = {}  # id of a kept 0-d int64 buffer -> (the buffer, its value)


def remember(buffer, value: int) -> None:
    """``buffer`` (0-d int64, kept by ``opkernel._scalar_buffer``) holds ``value``."""
    _INTS[id(buffer)] = (buffer, value)


def forget() -> None:
    """The kept buffers were let go (``opkernel._scalar_buffer``'s bound)."""
    _INTS.clear()


def value_of(buffer) -> int | None:
    """The value of a remembered buffer; None for another."""
    entry = _INTS.get(id(buffer))
    return entry[1] if entry is not None and entry[0] is buffer else None


def of_run(calls: tuple, externals: list) -> dict:
    """The run's outside parameters that are views' offsets (``opkernel.OpKernel``'s ``~k`` slots), by
    number: their values."""
    found = {}
    for kernel, refs in calls:
        slots = kernel._direct
        for position, ref in enumerate(refs):
            if ref.__class__ is int:
                slot = slots[position]
                if slot.__class__ is int and slot < 0:
                    value = value_of(externals[ref])
                    if value is not None:
                        found[ref] = value
    return found


def hold(offsets, externals: list) -> bool:
    """Every (parameter, value) of ``offsets`` has its value in this run (a fused run's constants, checked
    before each run)."""
    return all(value_of(externals[i]) == v for i, v in offsets)


def held(offsets, externals: list) -> dict:
    """Those (parameter, value) pairs of ``offsets`` that hold in this run: at a run's second sighting, the
    offsets it shares with its first (``of_run``), a build's constants; at a moved constant, those that
    did not move."""
    return {i: v for i, v in offsets if value_of(externals[i]) == v}
