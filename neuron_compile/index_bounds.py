"""Which indices an ATen op accepts, as CPU checks them: one rule per op that reads or writes at positions an
index tensor gives, and the check of a compiled graph's indices.

XLA's gather clamps an index out of range and its scatter drops the update, so a
graph of such ops would return a wrong number where CPU raises. ``RULES[op](args,
kwargs)`` names each index tensor of a call with its ``Bound``: the values CPU
accepts and the exception and message it raises for another. Two users:

* the ``neuron`` device's eager ops (``device/bounds.py``) read the index's values
  on the host before the op runs;
* ``add_checks`` gives a graph ``torch.compile`` hands us one more output: the
  smallest and largest value of every index tensor (an exempt value, ``ignore_index``,
  counted as in range), a few int64s the executable computes beside its results;
  ``check_results`` compares them after each call and raises CPU's error, naming
  the op and the user's line the graph recorded for it. Graphs padded to a bucket
  are not checked: their padded rows hold anything.

``NEURON_COMPILE_INDEX_CHECKS=0`` turns both off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from .lowering.diagnostics import user_source_line

aten = torch.ops.aten


def enabled() -> bool:
    return os.environ.get("NEURON_COMPILE_INDEX_CHECKS", "1") != "0"


@dataclass(frozen=True)
class Bound:
    """Values ``low <= v < high`` (or ``v == exempt``) are in range; another raises ``exc(message.format(v=v))``."""

    low: int
    high: int
    exempt: int | None
    exc: type
    message: str

    def error(self, value: int, op, where: str) -> Exception:
        return self.exc(f"{self.message.format(v=value)} ({op} {where}; NEURON_COMPILE_INDEX_CHECKS=0 skips "
                        "this check)")

    def first_out(self, smallest: int, largest: int) -> int | None:
        """The value to name, given the smallest and largest index (exempt values taken as ``low``)."""
        if smallest < self.low:
            return smallest
        if largest >= self.high:
            return largest
        return None


def checked(index) -> bool:
    """An index tensor a check reads: integer, not empty (bool masks select, and a float index is CPU's
    own error, which the op's trace raises)."""
    return isinstance(index, torch.Tensor) and index.numel() != 0 and not index.is_floating_point() \
        and index.dtype not in (torch.bool, torch.uint8)


def _size(tensor: torch.Tensor, dim: int) -> int:
    return tensor.shape[dim] if tensor.dim() else 1


def _dim(tensor: torch.Tensor, dim: int) -> int:
    return dim % max(tensor.dim(), 1)


# --- what each op indexes ----------------------------------------------------------------------
# a rule returns a Bound per index tensor the op reads

def _along(message: str, exc=IndexError, negative: bool = False):
    """A rule for ``op(self, dim, index, ...)``: an index into ``self`` along ``dim``."""

    def rule(args, kwargs):
        self, dim, index = args[0], kwargs.get("dim", args[1] if len(args) > 1 else None), \
            kwargs.get("index", args[2] if len(args) > 2 else None)
        dim = _dim(self, dim)
        size = _size(self, dim)
        return [(index, Bound(-size if negative else 0, size, None, exc,
                               message.replace("{dim}", str(dim)).replace("{size}", str(size))))]

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
        size = _size(self, dim)
        message = (f"index {{v}} is out of bounds for dimension {place} with size {size}" if size else
                   "index is out of bounds for dimension with size 0")  # (CPU's words for an empty dim)
        checks.append((index, Bound(-size, size, None, IndexError, message)))
        dim += 1
        place += 1
    return checks


def _flat(args, kwargs):
    """``take`` and ``put_``: an index into the flattened tensor, negative from the end."""
    self, index = args[0], kwargs.get("index", args[1] if len(args) > 1 else None)
    numel = self.numel()
    return [(index, Bound(-numel, numel, None, IndexError,
                          f"out of range: tried to access index {{v}} on a tensor of {numel} elements."))]


def _target(args, kwargs):
    """``nll_loss_forward`` / ``nll_loss2d_forward(self, target, weight, reduction, ignore_index)``: a class
    per target, or ``ignore_index``."""
    self, target = args[0], kwargs.get("target", args[1] if len(args) > 1 else None)
    ignore = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
    classes = self.shape[1] if self.dim() >= 2 else self.shape[0] if self.dim() else 1
    return [(target, Bound(0, classes, ignore, IndexError, "Target {v} is out of bounds."))]


def _embedding(args, kwargs):
    """``embedding(weight, indices, ...)``: a row of ``weight`` per index (compiled graphs keep the op;
    on the device it reaches us as ``index_select``)."""
    weight, index = args[0], kwargs.get("indices", args[1] if len(args) > 1 else None)
    return [(index, Bound(0, weight.shape[0], None, IndexError, "index out of range in self"))]


RULES: dict = {}
for _ops, _rule in (
        (("index_select.default",), _along("index out of range in self")),
        (("embedding.default",), _embedding),
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




# --- compiled graphs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GraphCheck:
    """One index tensor of a compiled graph: its bound, the op and the user's line that indexed with it."""

    bound: Bound
    op: str
    where: str


def add_checks(gm: torch.fx.GraphModule) -> tuple[GraphCheck, ...]:
    """Give ``gm`` one more output, last: an int64 vector of the smallest and largest value of every index
    tensor its ops read (``RULES``), an exempt value counted as ``low``. Returns what each pair checks; ()
    (and the graph unchanged) when no op indexes."""
    graph = gm.graph
    pairs, checks = [], []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in RULES:
            continue
        origin = node.meta.get("original_aten")  # the op a decomposition wrote this node for
        if origin is not None and "backward" in str(origin):
            continue  # (embedding's backward scatters at the ids its forward checked)
        nodes = {}

        def val(n):
            v = n.meta.get("val")
            nodes[id(v)] = n
            return v

        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), val)
        try:
            bounds = RULES[node.target](args, kwargs)
        except Exception:  # noqa: BLE001 - arguments no rule expects: the op's own trace judged them
            continue
        for index, bound in bounds:
            source = nodes.get(id(index))
            if source is None or not checked(index) or not hasattr(index, "fake_mode"):
                continue
            with graph.inserting_before(node):
                values = _call(graph, aten._to_copy.default, (source,), {"dtype": torch.int64})
                if bound.exempt is not None:  # v + (v == exempt) * (low - exempt): the exempt value becomes low
                    hit = _call(graph, aten.eq.Scalar, (values, bound.exempt), {})
                    shift = _call(graph, aten._to_copy.default, (hit,), {"dtype": torch.int64})
                    shift = _call(graph, aten.mul.Tensor, (shift, bound.low - bound.exempt), {})
                    values = _call(graph, aten.add.Tensor, (values, shift), {})
                pairs += [_call(graph, aten.amin.default, (values,), {}),
                          _call(graph, aten.amax.default, (values,), {})]
            if str(origin) in _DECOMPOSED:  # CPU's error is the op the user called, not the gather it became
                bound = Bound(bound.low, bound.high, bound.exempt, *_DECOMPOSED[str(origin)])
            checks.append(GraphCheck(bound, str(origin or node.target), user_source_line(node) or "<unknown>"))
    if not checks:
        return ()
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = output.args[0]
    with graph.inserting_before(output):
        stacked = _call(graph, aten.stack.default, (pairs,), {})
    output.args = ((tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)) + (stacked,),)
    gm.recompile()
    return tuple(checks)


# ops our decompositions write as a gather of the same bounds (ignore_index already made 0): CPU's error.
# By name: a node's ``original_aten`` need not be the very OpOverload object ``torch.ops.aten`` holds
_DECOMPOSED = {name: (IndexError, "Target {v} is out of bounds.") for name in
               ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")}


def _call(graph: torch.fx.Graph, target, args, kwargs) -> torch.fx.Node:
    """A new node with its fake value (what planning and lowering read), computed in its inputs' fake mode."""
    node = graph.call_function(target, args, kwargs)
    vals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    fake = next(v for v in torch.utils._pytree.tree_leaves(vals) if isinstance(v, torch.Tensor))
    with fake.fake_mode:
        node.meta["val"] = target(*vals[0], **vals[1])
    return node


def check_results(extremes, checks: tuple[GraphCheck, ...]) -> None:
    """Raise CPU's error for the first index out of range, given ``add_checks``'s output after a call."""
    values = np.asarray(extremes).tolist()
    for k, check in enumerate(checks):
        value = check.bound.first_out(values[2 * k], values[2 * k + 1])
        if value is not None:
            raise check.bound.error(value, check.op, f"in a graph compiled by torch.compile, at {check.where}")
