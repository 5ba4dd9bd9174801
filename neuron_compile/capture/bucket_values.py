"""What the padding analysis knows about the *values* of integer and bool tensors (``bucketing.py`` asks).

Layouts say where a tensor's real region is; some ops also need to know what
the real region *holds*. Advanced indexing is the case real models have:
transformers' mask functions read ``position_ids[batch_idx, q_idx]`` and
``padding_mask[batch_idx, kv_idx]``, where the indices are aranges over the
padded dims. ``index.Tensor`` along a padded dim is exact when every index at
a real position points into the source's real region, and that is a fact about
index values.

The facts, per node, at real positions only (what padded positions hold is
never assumed):

* ``Interval(lo, hi)``: every value lies in ``[lo, hi]``, sympy expressions
  of the true sizes. ``arange(start, end)`` with a static start holds ``[start, end - 1]``
  at its real positions (the bucketed arange runs to the bucket, but its first
  ``end - start`` values are the true ones); ``x + c`` shifts by ``c`` (an int
  or a size used as a value, which the executable reads as its true value);
  ``x + y`` adds the bounds; views, expands, slices, copies and indexing of
  ``x`` keep ``x``'s bounds (a subset of its values);
* ``Const(b)``: a bool tensor equal to ``b`` everywhere real. ``x < c`` is
  false when ``lo >= c`` (``x >= c`` is true), ``x >= c`` and ``x > c``
  likewise; ``where(Const(b), t, f)`` is ``t`` or ``f``. This is what proves
  the negative-index wrap ``where(i < 0, i + n, i)`` is ``i`` for an arange.

Anything else has no fact (``None``), and a rule that needs one keeps exact
shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx

from .bucket_layouts import NotBucketable, _broadcast, _padded

aten = torch.ops.aten


@dataclass(frozen=True)
class Interval:
    lo: sympy.Expr
    hi: sympy.Expr


@dataclass(frozen=True)
class Const:
    value: bool


def _sym(x):
    """A sympy expression for an int, a SymInt node or a SymInt; None for anything else."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return None


def provably_le(a, b) -> bool:
    """a <= b for every value of the (positive integer) size symbols."""
    d = sympy.simplify(b - a)
    if d.is_number:
        return bool(d >= 0)
    return d.is_nonnegative is True


def within(fact, size) -> bool:
    """Every value in ``[0, size - 1]``: an index that stays in a dim of true size ``size``."""
    return isinstance(fact, Interval) and provably_le(0, fact.lo) and provably_le(fact.hi, size - 1)


_KEEP = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.permute.default,
         aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int, aten.clone.default,
         aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default}
_CONVERT = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_COMPARE = {aten.lt.Scalar: "lt", aten.ge.Scalar: "ge", aten.gt.Scalar: "gt", aten.le.Scalar: "le"}


def value_fact(node: torch.fx.Node, facts: dict):
    """The fact about ``node``'s real values, from its arguments' facts (``facts``: node -> fact)."""
    target = node.target
    args = node.args
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    get = lambda a: facts.get(a) if isinstance(a, torch.fx.Node) else None  # noqa: E731
    if target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        start, end = (0, args[0]) if target is aten.arange.default else (args[0], args[1])
        step = args[2] if target is aten.arange.start_step and len(args) > 2 else 1
        lo, hi = _sym(start), _sym(end)
        # a static start only: a size in it would be the bucket's at the bucket (arange's arguments are
        # shapes), so its first values would not be the true ones; the end only sets the length
        if lo is None or hi is None or not lo.is_number or step != 1 or val.dtype.is_floating_point:
            return None
        return Interval(lo, hi - 1)
    if target in _KEEP or target is aten.index.Tensor:
        return get(args[0])
    if target in _CONVERT and not val.dtype.is_floating_point and val.dtype != torch.bool:
        src = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        widening = isinstance(src, torch.Tensor) and not src.dtype.is_floating_point and src.dtype != torch.bool \
            and val.dtype.itemsize >= src.dtype.itemsize
        return get(args[0]) if widening else None  # a widening integer copy keeps every value
    if target in (aten.add.Tensor, aten.sub.Tensor) and not val.dtype.is_floating_point:
        alpha = node.kwargs.get("alpha", 1)
        a, b = args[0], args[1]
        fa = get(a)
        fb = get(b) if isinstance(b, torch.fx.Node) and isinstance(b.meta.get("val"), torch.Tensor) else None
        cb = _sym(b) if fb is None else None
        if alpha != 1 or not isinstance(fa, Interval):
            return None
        if cb is not None:
            fb = Interval(cb, cb)
        if not isinstance(fb, Interval):
            return None
        if target is aten.add.Tensor:
            return Interval(fa.lo + fb.lo, fa.hi + fb.hi)
        return Interval(fa.lo - fb.hi, fa.hi - fb.lo)
    if target in _COMPARE:
        fa, c = get(args[0]), _sym(args[1])
        if not isinstance(fa, Interval) or c is None:
            return None
        op = _COMPARE[target]
        if op in ("lt", "ge") and provably_le(c, fa.lo):  # every x >= c
            return Const(op == "ge")
        if op in ("gt", "le") and provably_le(fa.hi, c):  # every x <= c
            return Const(op == "le")
        return None
    if target is aten.where.self:
        cond = get(args[0])
        if isinstance(cond, Const):
            return get(args[1] if cond.value else args[2])
        return None
    if target is aten.logical_not.default:
        fa = get(args[0])
        return Const(not fa.value) if isinstance(fa, Const) else None
    return None


def index_layout(node: torch.fx.Node, src, index_layouts: list, facts: dict):
    """Layout of ``aten.index.Tensor(src, indices)`` on a padded tensor, or NotBucketable.

    ``out[j] = src[..., i_0[j], ..., i_k[j], ...]``: a real output position ``j`` (real in the
    broadcast of the index layouts) reads ``src`` at the index values there. Along a source dim
    that is not padded any value reads a real element; along a padded dim of true size ``n`` the
    index's real values must lie in ``[0, n - 1]`` (an ``Interval`` fact: an arange over that
    dim, the position ids gathered from one, ...), so the read stays in the real prefix. What
    padded ``j`` read is garbage, as padding is anyway (XLA's gather clamps, so no read is out of
    bounds). The result's layout: the broadcast index dims where the indexed dims were (in front
    when they are not adjacent), then the source's other dims, as their layouts.
    """
    indices = node.args[1]
    val = node.meta["val"]
    used = [k for k, i in enumerate(indices) if i is not None]
    for k in used:
        idx = indices[k]
        ival = idx.meta.get("val") if isinstance(idx, torch.fx.Node) else None
        if not isinstance(ival, torch.Tensor) or ival.dtype == torch.bool:
            raise NotBucketable(f"{node.name}: aten.index.Tensor with a mask or non-tensor index on a padded tensor")
        if _padded(src[k]):
            fact = facts.get(idx)
            if len(src[k]) != 1 or not within(fact, src[k][0]):
                raise NotBucketable(f"{node.name}: aten.index.Tensor along padded dim {k}: its index is not "
                                    "provably within the real region (not an arange over that dim)")
    if used == list(range(used[0], used[-1] + 1)):  # adjacent: the index dims replace them in place
        before, after = list(src[:used[0]]), list(src[used[-1] + 1:])
    else:
        before, after = [], [src[k] for k in range(len(src)) if k not in used]
    shape = val.shape[len(before):val.dim() - len(after)]
    return tuple(before) + _broadcast(index_layouts, shape) + tuple(after)
