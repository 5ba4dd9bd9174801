"""Index bounds of eager ops: an op that reads or writes at positions a tensor gives raises, as CPU does,
when one of them is out of range.

XLA's gather clamps an index out of range and its scatter drops the update, so
without this ``embedding`` of a token id past the vocabulary returned another
token's row, ``cross_entropy`` of a label past the classes returned a loss, and
``index_copy_`` at a position past the end wrote nothing: each silently. CPU
raises, with the index and the size, before the op writes anything; so does
the device now, with the same exception type and message, plus the op and the
user's line.

The check reads the index tensor's values on the host before the op runs (our
PJRT client executes synchronously, so this waits for nothing): the storage
when it is small, else the view alone, cloned on the device first (a batch of
ids sliced from a resident corpus must not bring the corpus over). Values are
compared with ``aminmax``; only a tensor with a value out of range is searched
for the first one, to name it. ``COUNTS['index_checks']`` counts the reads;
``NEURON_COMPILE_INDEX_CHECKS=0`` turns the checks off (the op then clamps or
drops, as XLA does).
"""

from __future__ import annotations

import os

import torch

from .storage import data_of

aten = torch.ops.aten

# a storage of more elements: the index view is cloned alone on the device before it comes to the host
_READ_WHOLE = 16384
OPS = None  # ``ops`` (which imports this module) sets itself here: its dispatch, to_host and user_line


def enabled() -> bool:
    return os.environ.get("NEURON_COMPILE_INDEX_CHECKS", "1") != "0"


def _size(tensor: torch.Tensor, dim: int) -> int:
    return tensor.shape[dim] if tensor.dim() else 1


def _dim(tensor: torch.Tensor, dim: int) -> int:
    return dim % max(tensor.dim(), 1)


# --- what each op indexes ----------------------------------------------------------------------
# a rule returns (index tensor, low, high, exempt value or None, error) per index the op reads; a value v
# is in range when low <= v < high (or v == exempt); ``error(v)`` is CPU's exception for a value out of it

def _along(message: str, exc=IndexError, negative: bool = False):
    """A rule for ``op(self, dim, index, ...)``: an index into ``self`` along ``dim``."""

    def rule(args, kwargs):
        self, dim, index = args[0], kwargs.get("dim", args[1] if len(args) > 1 else None), \
            kwargs.get("index", args[2] if len(args) > 2 else None)
        dim = _dim(self, dim)
        size = _size(self, dim)
        return [(index, -size if negative else 0, size, None,
                 lambda v: exc(message.format(v=v, dim=dim, size=size)))]

    return rule


_OUT_OF_BOUNDS = "index {v} is out of bounds for dimension {dim} with size {size}"


def _advanced(args, kwargs):
    """``self[indices]`` (``index.Tensor``, ``index_put``): the k-th index tensor indexes the dim after those
    the indices before it consumed (a bool mask consumes as many dims as it has and is not checked). CPU's
    message names the index's place among the index tensors (a mask counts as one per dim), not the dim."""
    self, indices = args[0], kwargs.get("indices", args[1] if len(args) > 1 else ())
    checks, dim, place = [], 0, 0
    for index in indices:
        if index is None:
            dim += 1
            continue
        if index.dtype in (torch.bool, torch.uint8):
            dim += max(index.dim(), 1)
            place += max(index.dim(), 1)
            continue
        size, at = _size(self, dim), place
        checks.append((index, -size, size, None,
                       lambda v, at=at, size=size: IndexError(_OUT_OF_BOUNDS.format(v=v, dim=at, size=size))))
        dim += 1
        place += 1
    return checks


def _flat(args, kwargs):
    """``take`` and ``put_``: an index into the flattened tensor, negative from the end."""
    self, index = args[0], kwargs.get("index", args[1] if len(args) > 1 else None)
    numel = self.numel()
    return [(index, -numel, numel, None,
             lambda v: IndexError(f"out of range: tried to access index {v} on a tensor of {numel} elements."))]


def _target(args, kwargs):
    """``nll_loss_forward`` / ``nll_loss2d_forward(self, target, weight, reduction, ignore_index)``: a class
    per target, or ``ignore_index``."""
    self, target = args[0], kwargs.get("target", args[1] if len(args) > 1 else None)
    ignore = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
    classes = self.shape[1] if self.dim() >= 2 else self.shape[0] if self.dim() else 1
    return [(target, 0, classes, ignore, lambda v: IndexError(f"Target {v} is out of bounds."))]


RULES: dict = {}
for _ops, _rule in (
        (("index_select.default",), _along("index out of range in self")),
        (("index_add.default", "index_add_.default", "index_reduce.default", "index_reduce_.default"),
         _along("index out of range in self")),
        (("index_copy.default", "index_copy_.default"),
         _along("index_copy_(): " + _OUT_OF_BOUNDS)),
        (("index_fill.int_Scalar", "index_fill_.int_Scalar", "index_fill.int_Tensor", "index_fill_.int_Tensor"),
         _along(_OUT_OF_BOUNDS, negative=True)),
        (("gather.default", "scatter.src", "scatter_.src", "scatter.value", "scatter_.value", "scatter.reduce",
          "scatter_.reduce", "scatter.value_reduce", "scatter_.value_reduce", "scatter_add.default",
          "scatter_add_.default", "scatter_reduce.two", "scatter_reduce_.two"),
         _along(_OUT_OF_BOUNDS, exc=RuntimeError)),
        (("index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default",
          "_unsafe_index_put.default", "_unsafe_index.Tensor"), _advanced),
        (("take.default", "put_.default", "put.default"), _flat),
        (("nll_loss_forward.default", "nll_loss2d_forward.default"), _target)):
    for _name in _ops:
        _packet, _, _overload = _name.partition(".")
        _op = getattr(getattr(aten, _packet, None), _overload, None)
        if _op is not None:
            RULES[_op] = _rule


# --- the check ---------------------------------------------------------------------------------

def _host_values(index: torch.Tensor, counts: dict) -> torch.Tensor:
    if index.device.type != "neuron":
        return index
    if data_of(index).numel > max(_READ_WHOLE, 2 * index.numel()):
        index = OPS.dispatch(aten.clone.default, (index,), {})
    counts["index_checks"] += 1
    return OPS.to_host(index, counter=None).detach()


def check(op, args, kwargs, counts: dict) -> None:
    """Raise CPU's error for ``op`` if an index it is given is out of range (``RULES[op]`` says which)."""
    for index, low, high, exempt, error in RULES[op](args, kwargs):
        if not isinstance(index, torch.Tensor) or index.numel() == 0 or index.is_floating_point():
            continue  # (a float index is CPU's own error, which the op's trace raises)
        values = _host_values(index, counts)
        smallest, largest = (int(v) for v in torch.aminmax(values))
        if low <= smallest and largest < high:
            continue
        bad = (values < low) | (values >= high)
        if exempt is not None:
            bad &= values != exempt
        if bool(bad.any()):
            exc = error(int(values[bad].reshape(-1)[0]))
            exc.args = (f"{exc.args[0]} ({op} on the neuron device, called at {OPS.user_line()}; "
                        f"NEURON_COMPILE_INDEX_CHECKS=0 skips this check)",)
            raise exc
