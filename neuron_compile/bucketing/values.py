"""What the padding analysis knows about the *values* of integer and bool tensors (``analysis.py`` asks).

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
  Otherwise ``where(c, t, f)`` holds values of either interval, the true
  branch's raised to ``k`` where ``c`` is ``t >= k`` (deepseek_v4's
  ``where(i >= 0, i, full_like(i, n))``: picks and a sentinel in ``[0, n]``);
* ``Filled(v)``: an integer fill (``full_like(i, n)``) of ``v``, an int or a
  size read at its true value: the interval ``[v, v]``, and a ``Uniform``;

* ``Positions(atoms, bijective)``: the indices of a sort along a padded dim
  (a MoE router's ``sort(expert_ids)``). At the bucket they are positions in
  the padded layout ``atoms`` (row-major), so with a symbolic atom after the
  first they are *not* eager's values: position ``(b, t)`` of ``(2, s)`` is
  ``b * S + t`` at the bucket and ``b * s + t`` in eager. What they are good
  for holds anyway: every real entry points at a real element (``bijective``:
  each exactly once, and padded entries at padded ones), so ``src[p]``
  gathers real rows and ``out[p] = v`` writes them back. ``p // k`` by a
  static last atom ``m`` (``k`` dividing it) is ``Positions(atoms[:-1] + (m // k,))``;
  ``p < 0`` is false. With no symbolic atom after the first the positions are
  eager's (``exact``) and the fact is an interval too. A topk's indices along a
  padded dim (the first ``k`` of such a sort) are real positions at real
  entries and padded positions at padded ones (``padded_at_padded``), not a
  permutation unless ``k`` is the whole dim;
* ``Uniform``: every element the same value (zeros, ``full``, their expands and
  copies): a tensor with no layout of its own, which an ``index_put`` by
  positions may lay out as the positions say, and which takes its fellow
  operands' layout (``adopt_uniform``); so do ``empty`` (its values are
  unspecified) and ``Draws``, random values drawn elementwise and what unary
  pointwise ops make of them (phimoe's Gumbel noise, ``-log`` of an
  ``exponential_`` of an ``empty`` of flattened tokens): they are never eager's,
  and i.i.d. draws in any layout are draws alike;
* ``Tainted``: arithmetic on inexact positions (the dead branch of the
  negative-index wrap ``where(p < 0, p + n, p)``).

Anything else has no fact (``None``), and a rule that needs one keeps exact
shapes. A node whose real values are not eager's (an inexact ``Positions`` or
``Tainted``) may only be read by the ops that know it (``check_reads``), and
may leave the graph only as an activation saved for the backward, its fact
carried across with its layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx

from .layouts import NotBucketable, _broadcast, _dim_expr, _norm, _padded, _static, size_expr

aten = torch.ops.aten


@dataclass(frozen=True)
class Interval:
    lo: sympy.Expr
    hi: sympy.Expr


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Positions:
    atoms: tuple
    bijective: bool = False  # a permutation: every real element once, padded entries at padded elements
    padded_at_padded: bool = False  # padded entries at padded elements (a topk's first k of a sort)

    @property
    def exact(self) -> bool:
        return all(_static(a) for a in _norm(self.atoms)[1:])


@dataclass(frozen=True)
class Uniform:
    pass


@dataclass(frozen=True)
class Draws(Uniform):
    pass


@dataclass(frozen=True)
class Filled(Uniform):
    """Every element ``value`` (an int, or a size read at its true value): ``full_like(i, n)``."""
    value: sympy.Expr


class Tainted:
    """Values derived from inexact positions: never read as values."""

    def __eq__(self, other):
        return isinstance(other, Tainted)

    def __hash__(self):
        return 0


def inexact(fact) -> bool:
    """The node's real values are not eager's."""
    return isinstance(fact, Tainted) or (isinstance(fact, Positions) and not fact.exact)


def as_interval(fact):
    if isinstance(fact, Positions) and fact.exact:
        return Interval(sympy.Integer(0), _dim_expr(fact.atoms) - 1)
    if isinstance(fact, Filled):
        return Interval(fact.value, fact.value)
    return fact if isinstance(fact, Interval) else None


def _bound(a, b, low=True):
    """The lower (``low``) or the upper of two bounds, where one is provably so; else sympy's."""
    if provably_le(a, b):
        return a if low else b
    if provably_le(b, a):
        return b if low else a
    return sympy.Min(a, b) if low else sympy.Max(a, b)


def _branch_interval(cond, branch, fact):
    """``where(x >= c, x, y)``: where the true branch is taken, ``x >= c`` (``x > c``: ``>= c + 1``)."""
    if isinstance(cond, torch.fx.Node) and cond.target in (aten.ge.Scalar, aten.gt.Scalar) and cond.args[0] is branch:
        c = _sym(cond.args[1])
        if c is not None:
            return Interval(_bound(fact.lo, c + (cond.target is aten.gt.Scalar), low=False), fact.hi)
    return fact


def _sym(x):
    """A sympy expression for an int, a SymInt node or a SymInt; None for anything else."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.SymInt):
        return size_expr(x.node.expr)
    return None


def provably_le(a, b) -> bool:
    """a <= b for every value of the (positive integer) size symbols."""
    d = sympy.simplify(b - a)
    if d.is_number:
        return bool(d >= 0)
    return d.is_nonnegative is True


def within(fact, size) -> bool:
    """Every value in ``[0, size - 1]``: an index that stays in a dim of true size ``size``."""
    fact = as_interval(fact)
    return isinstance(fact, Interval) and provably_le(0, fact.lo) and provably_le(fact.hi, size - 1)


_KEEP = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.permute.default,
         aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int, aten.clone.default,
         aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default}
# the same values in the same order: a permutation stays one
_SAME = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
         aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.clone.default, aten.alias.default,
         aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default}
_ROUNDINGS = ("floor", "trunc")  # alike on positions, which are >= 0 (jetmoe's perm.div(top_k, "trunc"))
_CONVERT = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_COMPARE = {aten.lt.Scalar: "lt", aten.ge.Scalar: "ge", aten.gt.Scalar: "gt", aten.le.Scalar: "le"}
_UNIFORM = {aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
            aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.full_like.default,
            aten.zeros_like.default, aten.ones_like.default, aten.empty.memory_format, aten.empty_strided.default,
            aten.new_empty.default, aten.new_empty_strided.default, aten.empty_like.default}  # empty: unspecified
# fills -> the position of their value (deepseek_v4's full_like(top_k, compressed_len) sentinel)
_FILLS = {aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2, aten.scalar_tensor.default: 0}
_DRAWS = {aten.exponential.default, aten.uniform.default, aten.bernoulli.p, aten.rand_like.default,
          aten.randn_like.default, aten.rand.default, aten.randn.default}
# what may read a node whose values are not eager's (check_reads): value_fact knows each of them
_READS_INEXACT = _KEEP | _CONVERT | set(_COMPARE) | {
    aten.add.Tensor, aten.sub.Tensor, aten.where.self, aten.div.Tensor_mode, aten.index.Tensor,
    aten.index_put.default, aten.index_put_.default, aten.full_like.default, aten.zeros_like.default,
    aten.ones_like.default, aten.empty_like.default}


def _fact_inputs(node):
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.fx.Node))


def check_reads(node: torch.fx.Node, facts: dict) -> None:
    """NotBucketable when ``node`` reads, as values, a node whose real values are not eager's."""
    bad = [a for a in _fact_inputs(node) if inexact(facts.get(a))]
    if not bad:
        return
    target = node.target
    ok = target in _READS_INEXACT
    if target is aten.div.Tensor_mode:
        ok = node.kwargs.get("rounding_mode") in _ROUNDINGS and isinstance(value_fact(node, facts), Positions)
    if target in (aten.index_put.default, aten.index_put_.default):
        ok = not any(a is node.args[2] or a is node.args[0] for a in bad)  # only as indices
    if not ok:
        raise NotBucketable(f"{node.name}: {target} reads {bad[0].name}, positions in the padded layout "
                            "(a sort's indices along a padded dim), as values")


def value_fact(node: torch.fx.Node, facts: dict):
    """The fact about ``node``'s real values, from its arguments' facts (``facts``: node -> fact)."""
    target = node.target
    args = node.args
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    get = lambda a: facts.get(a) if isinstance(a, torch.fx.Node) else None  # noqa: E731
    if target in _DRAWS or (isinstance(get(args[0]), Draws) and (target in _KEEP | _CONVERT or (
            torch.Tag.pointwise in getattr(target, "tags", ()) and sum(isinstance(a, torch.fx.Node) for a in args) == 1))):
        return Draws()
    if target in _FILLS and not val.dtype.is_floating_point and val.dtype != torch.bool:
        value = _sym(args[_FILLS[target]]) if len(args) > _FILLS[target] else None
        if value is not None:
            return Filled(value)  # a size as the value is its true value (bucketing's true_values)
    if target in _KEEP | _CONVERT and isinstance(get(args[0]), Filled) and not val.dtype.is_floating_point:
        return get(args[0])
    if target in _UNIFORM or (target in _KEEP | _CONVERT and isinstance(get(args[0]), Uniform)):
        return Uniform()
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
        fact = get(args[0])
        if isinstance(fact, Positions) and fact.bijective and target not in _SAME:
            return Positions(fact.atoms)  # a subset or repeats of a permutation: no longer one
        return fact
    if target is aten.div.Tensor_mode and node.kwargs.get("rounding_mode") in _ROUNDINGS:
        fact, k = get(args[0]), args[1]
        atoms = _norm(fact.atoms) if isinstance(fact, Positions) else ()
        if atoms and k == 1:
            return fact  # top-1 routing: perm // 1
        if isinstance(k, int) and not isinstance(k, bool) and k > 0 and atoms and _static(atoms[-1]) \
                and int(atoms[-1]) % k == 0:
            # p = q * m + r with r < m static: p // k = q * (m // k) + r // k, real exactly where q is
            return Positions(_norm(atoms[:-1] + (sympy.Integer(int(atoms[-1]) // k),)))
        return Tainted() if inexact(fact) else None
    if target in _CONVERT and not val.dtype.is_floating_point and val.dtype != torch.bool:
        src = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        widening = isinstance(src, torch.Tensor) and not src.dtype.is_floating_point and src.dtype != torch.bool \
            and val.dtype.itemsize >= src.dtype.itemsize
        if widening:
            return get(args[0])  # a widening integer copy keeps every value
        if isinstance(get(args[0]), Positions) and val.dtype.itemsize >= 4:
            return get(args[0])  # positions in a dim (< 2**31 elements) fit in int32 (a topk's .to(int32))
        return Tainted() if inexact(get(args[0])) else None
    if target in (aten.add.Tensor, aten.sub.Tensor) and not val.dtype.is_floating_point:
        alpha = node.kwargs.get("alpha", 1)
        a, b = args[0], args[1]
        if any(inexact(get(x)) for x in (a, b)):
            return Tainted()
        fa = as_interval(get(a))
        fb = get(b) if isinstance(b, torch.fx.Node) and isinstance(b.meta.get("val"), torch.Tensor) else None
        fb = as_interval(fb)
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
        if isinstance(fa, Positions) and c is not None and provably_le(c, 0) and _COMPARE[target] in ("lt", "ge"):
            return Const(_COMPARE[target] == "ge")  # positions are >= 0
        if inexact(fa):
            return Tainted()
        fa = as_interval(fa)
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
        if any(inexact(get(a)) for a in args):
            return Tainted()
        fa, fb = as_interval(get(args[1])), as_interval(get(args[2]))
        if isinstance(fa, Interval) and isinstance(fb, Interval):  # either branch's values
            fa = _branch_interval(args[0], args[1], fa)
            return Interval(_bound(fa.lo, fb.lo), _bound(fa.hi, fb.hi, low=False))
        return None
    if target in (aten.index_put.default, aten.index_put_.default):
        accumulate = args[3] if len(args) > 3 else node.kwargs.get("accumulate", False)
        facts_in = [get(i) for i in args[1] if i is not None]
        if not accumulate and len(facts_in) == 1 and isinstance(facts_in[0], Positions) and facts_in[0].bijective:
            return get(args[2])  # every real element written once, from a real value (indexing)
        return None
    if target is aten.empty_like.default:
        return None  # the values are not read
    if any(inexact(get(a)) for a in _fact_inputs(node)):
        return Tainted()
    if target is aten.logical_not.default:
        fa = get(args[0])
        return Const(not fa.value) if isinstance(fa, Const) else None
    return None


def adopt_uniform(tensor_args, facts):
    """A tensor whose elements are all alike (``Uniform``: zeros expanded to a merged size) has no
    layout of its own: along a dim where another operand is padded with the same size, it takes
    that operand's layout (backward's ``scatter_add(zeros, -1, topk_index, ones)``)."""
    others = [lay for _, a, lay in tensor_args if not isinstance(facts.get(a), Uniform)]
    out = []
    for i, a, lay in tensor_args:
        if isinstance(facts.get(a), Uniform) and others:
            new = list(lay)
            for d, atoms in enumerate(lay):
                for other in others:
                    k = d - (len(lay) - len(other))
                    if 0 <= k < len(other) and _padded(other[k]) and \
                            sympy.simplify(_dim_expr(other[k]) - _dim_expr(atoms)) == 0:
                        new[d] = other[k]
                        break
            lay = tuple(new)
        out.append((i, a, lay))
    return out
