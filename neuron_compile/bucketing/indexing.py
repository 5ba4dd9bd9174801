"""Padding rules for ops that move data by index: advanced indexing, ``index_put``, ``gather`` and
``scatter``, ``sort`` and ``topk``, and slices and selects at a position.

``analysis.py`` asks these for a node's layout; what they need to know about
index *values* (an arange over a padded dim, the positions a sort produced)
comes from ``values``. Each rule's algebra is in its docstring. A case
no rule proves raises ``NotBucketable``: the graph keeps exact shapes.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from .layouts import (NotBucketable, _broadcast, agree, _dim_expr, _expr, _norm, _padded, _padded_layout,
                      layout_of_shape, prefix_atoms)
from .values import Positions, Uniform, _sym, inexact, within

aten = torch.ops.aten


def _matches(fact, atoms) -> bool:
    """``fact`` is positions in a dim laid out exactly as ``atoms``."""
    return isinstance(fact, Positions) and _norm(fact.atoms) == _norm(atoms)


def index_layout(node: torch.fx.Node, src, index_layouts: list, facts: dict):
    """Layout of ``aten.index.Tensor(src, indices)`` on a padded tensor, or NotBucketable.

    ``out[j] = src[..., i_0[j], ..., i_k[j], ...]``: a real output position ``j`` (real in the
    broadcast of the index layouts) reads ``src`` at the index values there. Along a source dim
    that is not padded any value reads a real element (if the values are eager's); along a padded
    dim of true size ``n`` the index's real values must lie in ``[0, n - 1]`` (an ``Interval``
    fact: an arange over that dim, the position ids gathered from one, ...), so the read stays in
    the real prefix; along a padded dim of any layout, positions of real elements in that very
    layout (``Positions``: a MoE router's ``hidden[perm // top_k]``) read real elements too. What
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
        fact = facts.get(idx)
        if _matches(fact, src[k]):
            continue
        if inexact(fact):
            raise NotBucketable(f"{node.name}: aten.index.Tensor along dim {k} by positions in another layout")
        if _padded(src[k]) and (len(src[k]) != 1 or not within(fact, src[k][0])):
            raise NotBucketable(f"{node.name}: aten.index.Tensor along padded dim {k}: its index is not "
                                "provably within the real region (not an arange over that dim)")
    if used == list(range(used[0], used[-1] + 1)):  # adjacent: the index dims replace them in place
        before, after = list(src[:used[0]]), list(src[used[-1] + 1:])
    else:
        before, after = [], [src[k] for k in range(len(src)) if k not in used]
    shape = val.shape[len(before):val.dim() - len(after)]
    return tuple(before) + _broadcast(index_layouts, shape) + tuple(after)


def index_put_layout(node: torch.fx.Node, layout_of, facts: dict, rewrite):
    """Layout of ``index_put(target, indices, values, accumulate)``, its rewrites in ``rewrite``.

    * Into a padded dim of true size ``n`` with exact indices (a static KV cache's index_copy_ at
      cache_position; index backward's accumulate into zeros): a valid index ``i`` in
      ``[-n, n - 1]`` names the same element as ``i + n`` when negative, so the indices are
      wrapped with the true ``n`` before the write (at the bucket a negative index would count
      from the bucket's end) and every real index lands where eager's does. Padded index
      positions, only with accumulate, add the values' masked zeros wherever they point.
    * Positions of real elements in the target dim's own layout (a sort's indices, ``//`` a
      top-k): with accumulate, real entries add real values at real elements and padded ones
      add masked zeros (the backward of ``hidden[perm // k]``). Without accumulate, only a
      permutation (``Positions.bijective``): every real element is written exactly once, from a
      real position, and padded entries write padded elements; so the target's old values are
      never read, and the result's dim is laid out as the positions say (``inv[perm] = arange``).
      A target whose elements are all alike (``Uniform``: zeros) has no layout of its own: its
      dim is laid out as the positions say before either rule.
    * Without accumulate from padded indices (a static cache's prefill write at
      ``cache_position``, an arange over the padded prompt): the padded entries would write
      garbage wherever they point, into the cache's real zeros too. They write to a scratch row
      instead (``rewrite.scratch``: the target one row longer along the dim, the padded entries
      pointed past its end, the row dropped after), so only the real entries write.
    * A padded dim the indices leave whole (None) is written row by row from the values' same
      padded dim: real rows from real rows.
    """
    args = node.args
    accumulate = args[3] if len(args) > 3 else node.kwargs.get("accumulate", False)
    target_lay = layout_of(args[0])
    values = layout_of(args[2])
    used = [k for k, i in enumerate(args[1]) if i is not None]
    idx_facts = {k: facts.get(args[1][k]) for k in used}
    if isinstance(facts.get(args[0]), Uniform):
        # every element alike (zeros to accumulate into): any layout of the dim's size is the target's
        target_lay = tuple(_norm(idx_facts[k].atoms) if k in used and isinstance(idx_facts[k], Positions)
                           and sympy.simplify(_dim_expr(idx_facts[k].atoms) - _dim_expr(a)) == 0 else a
                           for k, a in enumerate(target_lay))
    lay = list(target_lay)
    if not accumulate and len(used) == 1 and isinstance(idx_facts[used[0]], Positions) \
            and idx_facts[used[0]].bijective and sympy.simplify(
                _dim_expr(idx_facts[used[0]].atoms) - _dim_expr(target_lay[used[0]])) == 0:
        lay[used[0]] = _norm(idx_facts[used[0]].atoms)
        _values_align(node, tuple(lay), values, layout_of)
        return tuple(lay)
    padded_index = [k for k in used if _padded_layout(layout_of(args[1][k]))]
    if padded_index and not accumulate:
        if len(used) != 1 or inexact(idx_facts[used[0]]):
            raise NotBucketable(f"{node.name}: index_put without accumulate from padded indices")
        index_lay = layout_of(args[1][used[0]])
        rewrite.scratch = (used[0], [(d, a) for d, a in enumerate(index_lay) if _padded(a)])
    for k in used:
        if inexact(idx_facts[k]) and not _matches(idx_facts[k], target_lay[k]):
            raise NotBucketable(f"{node.name}: index_put along dim {k} by positions in another layout")
    into_padded = [k for k in used if _padded(target_lay[k]) and not _matches(idx_facts[k], target_lay[k])]
    if into_padded:
        if len(into_padded) > 1 or len(target_lay[into_padded[0]]) != 1:
            raise NotBucketable(f"{node.name}: index_put into several padded dims")
        rewrite.index_wrap = [(into_padded[0], target_lay[into_padded[0]])]
    _values_align(node, target_lay, values, layout_of)
    if values is not None and _padded_layout(values) and rewrite.scratch is None:
        rewrite.masks.append((2, [(k, a) for k, a in enumerate(values) if _padded(a)], 0))
    return target_lay


def _values_align(node, target_lay, values, layout_of):
    """The values of an index_put into a padded dim: their padded dims must be padded as what they
    broadcast to (target[:first] + the indices' broadcast + target[last + 1:]), so that the mask of
    the values' padding covers every padded index position."""
    indices = [i for i in node.args[1] if i is not None]
    used = [k for k, i in enumerate(node.args[1]) if i is not None]
    index_lay = _broadcast([layout_of(i) for i in indices],
                           torch.broadcast_shapes(*(i.meta["val"].shape for i in indices)))
    if values is None or not (_padded_layout(values) or _padded_layout(index_lay)):
        return
    if used != list(range(used[0], used[-1] + 1)):
        raise NotBucketable(f"{node.name}: index_put with padded values and non-adjacent indices")
    expect = list(target_lay[:used[0]]) + list(index_lay) + list(target_lay[used[-1] + 1:])
    for k in range(1, len(expect) + 1):
        have = values[-k] if k <= len(values) else ()
        if (_padded(have) or _padded(expect[-k])) and not agree(have, expect[-k]):
            raise NotBucketable(f"{node.name}: index_put values padded unlike what they write")


def sort_layout(node: torch.fx.Node, src, rewrite):
    """Layouts and facts of ``sort(x, dim)`` along a padded dim: ``([values, indices], [None, Positions])``.

    At the bucket the sort runs with the padded elements last (``rewrite.sort_last``: a stable
    sort by value, then a stable sort by "is padding"), so the real elements come first, in
    eager's order: restricted to the real elements, an order by (value, position) is the same
    whatever else is sorted with them, and positions keep their order under padding. The sorted
    dim is then laid out as one atom, the product of the input's (its real region a prefix of
    that length), the values are eager's, and the indices are positions of real elements in the
    input's layout, each once (eager's values when that layout has no symbolic atom after its
    first).
    """
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)) % len(src)
    atoms = _norm(src[dim])
    rewrite.sort_last = (dim, atoms)
    lay = list(src)
    lay[dim] = (_dim_expr(atoms),)
    return [tuple(lay), tuple(lay)], [None, Positions(atoms, bijective=True, padded_at_padded=True)]


def topk_layout(node: torch.fx.Node, src, rewrite, checks: list):
    """Layouts and facts of ``topk(x, k, dim, largest)`` along a padded dim: ``([values, indices], [None, Positions])``.

    ``topk`` is the first ``k`` entries of ``sort(x, dim, descending=largest)``: at the bucket it
    runs as the sort with the padded elements last (``sort_layout``'s ``rewrite.sort_last``), then
    keeps the first ``k`` (the bucket's ``k``). The real elements come first, in sorted order, and
    eager's ``k`` is at most the true size (eager's topk raises otherwise), so the first ``k``
    entries at the true sizes are eager's, provided the bucket's ``k`` is at least the true one
    (``checks``: ``(k, None)``, at each call). The ``k`` dim is laid out as one atom ``k`` (its real
    region a prefix of the true ``k``); the values are eager's; the indices are positions of real
    elements at real entries and of padded elements at padded ones (``Positions.padded_at_padded``:
    past the true size the sort holds only padded elements), a permutation when ``k`` is the whole
    dim. This covers a static ``k`` (a router's top-k over the tokens) and ``min(index_topk, T)``
    (the sparse-attention indexers of deepseek_v32, glm_moe_dsa, hy_v4: ``T`` when ``T`` is below
    ``index_topk``, a static count past it). Among equal values which indices come first is the
    sort's choice, as it is the lowering's without padding.
    """
    args = node.args
    dim = (args[2] if len(args) > 2 else node.kwargs.get("dim", -1)) % len(src)
    atoms, k = _norm(src[dim]), _sym(args[1])
    if k is None:
        raise NotBucketable(f"{node.name}: topk of {args[1]} elements along padded dim {dim}")
    whole = sympy.simplify(k - _dim_expr(atoms)) == 0
    if not whole and not k.is_number:
        checks.append((k, None))
    rewrite.sort_last = (dim, atoms)
    lay = list(src)
    lay[dim] = (_dim_expr(atoms),) if whole else layout_of_shape([node.meta["val"][0].shape[dim]])[0]
    return [tuple(lay), tuple(lay)], [None, Positions(atoms, bijective=whole, padded_at_padded=True)]


def row_local_layout(node: torch.fx.Node, layout_of, facts: dict, rewrite):
    """Layout of ``gather(x, d, index)`` and ``scatter`` / ``scatter_add`` / ``scatter_reduce(x, d, index, src)``.

    ``gather``: ``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``d``, elementwise in
    every other dim ``k``, where ``index.size(k) <= x.size(k)``: ``index`` and ``x`` are padded
    alike in every other dim or neither is, so real entries sit at real rows. Along a padded
    ``d`` of one atom (its real region a prefix, where eager's index values are positions) the
    index's real values point into the real region: eager raises for an index outside
    ``[0, x.size(d))`` (gather does not wrap negatives as indexing does), so on every call eager
    accepts they do, whatever computed them (blt's patch ids, in its amax's backward); positions
    in another layout (an inexact ``Positions``) are not eager's values and are refused. Padded
    entries read garbage, as padding is anyway. The result is laid out as ``index``. (The
    compiled path checks no bounds, padded or not: XLA clamps where eager would raise.)

    ``scatter``: ``out[..., index[..., j, ...], ...] = src[..., j, ...]`` (or the value). Real
    entries write where eager's do by the same argument (scatters raise outside ``[0, size)`` as
    gather does: deepseek_v4's picks, a user's column ids). Along a padded ``d`` a padded entry of
    ``index`` could point at a real element: allowed only where it cannot, namely where the
    index's own dim ``d`` is not padded (a static ``k`` of top-k indices; its padded entries then
    lie in padded rows of another dim) or its padded entries are known to point at padded
    elements (``Positions.padded_at_padded``: a sort's or a topk's indices). Accumulating scatters (sum)
    add ``src``'s padded entries masked to zeros, wherever they point. The result is laid out as
    ``x``.
    """
    target, args = node.target, node.args
    src = layout_of(args[0])
    d = args[1] % len(src)
    index = layout_of(args[2])
    if index is not None and len(index) == len(src):
        for k in range(len(src)):
            if k != d and (_padded(index[k]) or _padded(src[k])) and not agree(index[k], src[k]):
                raise NotBucketable(f"{node.name}: {target} index and source padded differently in dim {k}")
    values = layout_of(args[3]) if len(args) > 3 else None
    if values is not None and index is not None and len(values) == len(index):
        for k in range(len(index)):  # index.size(k) <= src.size(k): real entries read real values
            if (_padded(index[k]) or _padded(values[k])) and not agree(index[k], values[k]):
                raise NotBucketable(f"{node.name}: {target} index and values padded differently in dim {k}")
    accumulate = target is aten.scatter_add.default or (target is aten.scatter_reduce.two and args[4] == "sum")
    if _padded(src[d]):
        fact = facts.get(args[2])
        if inexact(fact) and not _matches(fact, src[d]):
            raise NotBucketable(f"{node.name}: {target} along dim {d} by positions in another layout")
        # one atom: the real region is a prefix of the true size, which eager's indices lie in
        if not (_matches(fact, src[d]) or len(src[d]) == 1):
            raise NotBucketable(f"{node.name}: {target} along padded dim {d}: its index is not provably within "
                                "the real region")
        if target is not aten.gather.default and not accumulate and index is not None and _padded(index[d]) \
                and not (isinstance(fact, Positions) and fact.padded_at_padded):
            raise NotBucketable(f"{node.name}: {target} along padded dim {d} from padded index entries")
    if accumulate:
        rewrite.masks.append((3, [(k, a) for k, a in enumerate(values) if _padded(a)], 0))
    return index if target is aten.gather.default else src


def slice_layout(node: torch.fx.Node, src, rewrite):
    """Layout of ``slice(x, d, start, end, step)``.

    Along a padded dim (one atom) from a static start with step 1 the result's real region is the
    prefix of its true length; the whole dim keeps its layout. From a symbolic start (the last
    ``t`` rows of a static table, mpt's alibi ``bias[:, max(0, P - t):]``; the backward of a cat
    after a padded piece, ``grad[..., s:]``): the bucketed slice would begin at the bucket's
    start, so it reads rows ``start + j`` at the *true* start instead (``rewrite.read_at``: an
    ``index_select``, clamped to the dim), which are eager's rows for every real ``j``: inside
    the table, or inside the real prefix of a padded dim (eager's slice is in bounds). A negative
    static start along a padded dim counts from the true end the same way (``cumsum[..., -1:]``).
    """
    args, val = node.args, node.meta["val"]
    d = (args[1] if len(args) > 1 else 0) % len(src)
    step = args[4] if len(args) > 4 else 1
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    lay = list(src)
    blocks = _blocks(src[d], _sym(start), _expr(val.shape[d])) if _padded(src[d]) and step == 1 else None
    if blocks is not None:
        lay[d] = blocks  # whole blocks of a cat of pieces padded alike: the cat's backward
    elif not isinstance(start, int):
        if prefix_atoms(src[d]) is None or step != 1 or _sym(start) is None:
            raise NotBucketable(f"{node.name}: slice of dim {d} from a symbolic start {start}")
        rewrite.read_at = (d, _sym(start), _dim_expr(src[d]))
        lay[d] = layout_of_shape([val.shape[d]])[0]
    elif _padded(src[d]) and start == 0 and step == 1 and _expr(val.shape[d]) == _dim_expr(src[d]):
        pass  # the whole dim (backward's slice of a gradient to its input's size)
    elif _padded(src[d]) and start < 0 and step == 1 and prefix_atoms(src[d]) is not None:
        rewrite.read_at = (d, sympy.Integer(start), _dim_expr(src[d]))  # from the true end (x[..., -1:])
        lay[d] = layout_of_shape([val.shape[d]])[0]
    elif _padded(src[d]):
        if prefix_atoms(src[d]) is None or step != 1 or start < 0:
            raise NotBucketable(f"{node.name}: slice of padded dim {d} with start={start}, step={step}")
        lay[d] = (_expr(val.shape[d]),)
    else:
        lay[d] = layout_of_shape([val.shape[d]])[0]
    return tuple(lay)


def _blocks(atoms, start, length):
    """Where a dim laid out as ``(n, *inner)`` (``n`` static: a cat of ``n`` pieces padded alike,
    ``conv_cat.cat_layout``) is sliced from ``k E`` for ``m E`` (``E`` the inner size), whole
    blocks ``k .. k + m``, at the bucket as in eager: the layout ``(m, *inner)``; else None."""
    if len(atoms) < 2 or atoms[0].free_symbols or start is None:
        return None
    inner = _dim_expr(atoms[1:])
    k, m = sympy.simplify(start / inner), sympy.simplify(length / inner)
    if not (k.is_Integer and m.is_Integer and 0 <= k and 0 < m and k + m <= atoms[0]):
        return None
    return _norm((sympy.Integer(m), *atoms[1:]))


def select_layout(node: torch.fx.Node, src, rewrite):
    """Layout of ``select(x, d, i)``: the other dims. At a symbolic ``i`` the bucket would read at
    the bucket's ``i``: it reads at the true one (``rewrite.read_at``; negative counts from the
    dim's true end), a real element as eager's."""
    d, index = node.args[1] % len(src), node.args[2]
    if not isinstance(index, int):
        if len(src[d]) > 1 or _sym(index) is None:
            raise NotBucketable(f"{node.name}: select at a symbolic index {index}")
        rewrite.read_at = (d, _sym(index), _dim_expr(src[d]))
    elif _padded(src[d]) and index < 0:
        if prefix_atoms(src[d]) is None:
            raise NotBucketable(f"{node.name}: select from the end of a merged padded dim")
        rewrite.read_at = (d, sympy.Integer(index), _dim_expr(src[d]))
    return tuple(src[:d]) + tuple(src[d + 1:])
