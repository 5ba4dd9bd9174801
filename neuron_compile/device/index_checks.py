"""Index bounds of eager ops: an op that reads or writes at positions a tensor gives raises, as CPU does,
when one of them is out of range.

XLA's gather clamps an index out of range and its scatter drops the update, so
without this ``embedding`` of a token id past the vocabulary returned another
token's row, ``cross_entropy`` of a label past the classes returned a loss, and
``index_copy_`` at a position past the end wrote nothing: each silently. CPU
raises, with the index and the size, before the op writes anything; so does
the device now, with the same exception type and message, plus the op and the
user's line.

Which indices each op accepts is ``index_bounds.RULES`` (compiled graphs check
with the same rules). The check reads the index tensor's values on the host
before the op runs (an index an op still queued computes is checked at the
next synchronization: ``check``): the storage when it is small, else the view alone, cloned on the
device first (``transfers.alone``: a batch of ids sliced from a resident corpus must
not bring the corpus over). ``aminmax`` of the values decides; the error names the smallest
value below the range, else the largest above it. ``COUNTS['index_checks']``
counts the reads; ``NEURON_COMPILE_INDEX_CHECKS=0`` turns the checks off (the
op then clamps or drops, as XLA does).
"""

from __future__ import annotations

import torch

from .. import _profiler_hooks
from . import issuers as _issuers
from . import op_queue as _queue
from . import storage as _storage
from . import transfers
from ..index_bounds import RULES, checked, enabled  # noqa: F401 - ops reads enabled and RULES here

OPS = None  # ``ops`` (which imports this module) sets itself here: its user_line


# --- the check ---------------------------------------------------------------------------------

def _extremes(index: torch.Tensor, bound, counts: dict) -> tuple[int, int]:
    """The index's smallest and largest values (an exempt value counted as ``bound.low``). A neuron index's
    values are resident (a queued op computing them defers the check to the queue's run: ``check``): read in
    place (``storage.resident_extremes``: no op on the device, no copy of a corpus a batch is sliced from),
    else copied to the host beside the queue, which keeps gathering its run."""
    if index.device.type != "neuron":
        return _aminmax(index, bound)
    counts["index_checks"] += 1
    if _profiler_hooks.STATE._is_profiler_enabled:  # torch.profiler records: a neuron::index_check event
        with _profiler_hooks.event("neuron::index_check", (index,)):
            return _read_extremes(index, bound)
    return _read_extremes(index, bound)


def _read_extremes(index: torch.Tensor, bound) -> tuple[int, int]:
    found = _storage.resident_extremes(index, bound.exempt, bound.low)
    if found is not None:
        return found
    with _queue.unqueued():
        return _aminmax(transfers.to_host(transfers.alone(index), counter=None).detach(), bound)


def _aminmax(values: torch.Tensor, bound) -> tuple[int, int]:
    if bound.exempt is not None:
        values = torch.where(values == bound.exempt, bound.low, values)
    return tuple(int(v) for v in torch.aminmax(values))


def check(op, args, kwargs, counts: dict) -> None:
    """Raise CPU's error for ``op`` if an index it is given is out of range (``RULES[op]`` says which).

    An index tensor that an op still in the device's queue computes (``op_queue``: labels shifted on the
    device, ids stacked from slices) is checked at the next synchronization (a host read, ``synchronize``:
    ``op_queue.defer_check``), not now: reading it here would cut the run in two, and reading it where the
    queue runs without the host waiting (a donation) would wait for XLA. The error is then raised at that
    synchronization, as CUDA's device-side asserts are, naming the op and the line that issued it; the op
    itself has run (clamped or dropped, as XLA does), and so have the ops issued after it until then, but
    nothing was read from the device before the error."""
    for index, bound in RULES[op](args, kwargs):
        if not checked(index):
            continue
        if index.device.type == "neuron" and _queue.computing(index):
            index, issuer = index.detach(), _issuers.issuer()
            _queue.defer_check(lambda index=index, bound=bound, issuer=issuer: _check_values(
                op, index, bound, counts, lambda: f"{_issuers.describe(issuer)} (found when the device's queue ran)"))
            continue
        _check_values(op, index, bound, counts, OPS.user_line)


def _check_values(op, index, bound, counts: dict, where) -> None:
    value = bound.first_out(*_extremes(index, bound, counts))
    if value is not None:
        raise bound.error(value, op, f"on the neuron device, called at {where()}")
