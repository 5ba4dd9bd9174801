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
before the op runs (our PJRT client executes synchronously, so this waits for
nothing): the storage when it is small, else the view alone, cloned on the
device first (``ops.alone``: a batch of ids sliced from a resident corpus must
not bring the corpus over). ``aminmax`` of the values decides; the error names the smallest
value below the range, else the largest above it. ``COUNTS['index_checks']``
counts the reads; ``NEURON_COMPILE_INDEX_CHECKS=0`` turns the checks off (the
op then clamps or drops, as XLA does).
"""

from __future__ import annotations

import torch

from .._profiler_hooks import STATE, event
from ..index_bounds import RULES, checked, enabled  # noqa: F401 - ops reads enabled and RULES here

OPS = None  # ``ops`` (which imports this module) sets itself here: its alone, to_host and user_line


# --- the check ---------------------------------------------------------------------------------

def _host_values(index: torch.Tensor, counts: dict) -> torch.Tensor:
    if index.device.type != "neuron":
        return index
    counts["index_checks"] += 1
    if STATE._is_profiler_enabled:  # torch.profiler records: a neuron::index_check event
        with event("neuron::index_check", (index,)):
            return OPS.to_host(OPS.alone(index), counter=None).detach()
    return OPS.to_host(OPS.alone(index), counter=None).detach()


def check(op, args, kwargs, counts: dict) -> None:
    """Raise CPU's error for ``op`` if an index it is given is out of range (``RULES[op]`` says which)."""
    for index, bound in RULES[op](args, kwargs):
        if not checked(index):
            continue
        values = _host_values(index, counts)
        if bound.exempt is not None:
            values = torch.where(values == bound.exempt, bound.low, values)
        value = bound.first_out(*(int(v) for v in torch.aminmax(values)))
        if value is not None:
            raise bound.error(value, op, f"on the neuron device, called at {OPS.user_line()}")
