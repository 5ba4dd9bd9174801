"""Padded layouts: the arithmetic shape bucketing reasons in (``bucketing.py`` decides, with it,
whether a graph is exact when padded).

A dim of a padded tensor is a row-major product of *atoms*, each a sympy
expression of the true size (``s1``, ``s1 + 1``, a static ``64``); its real
content is the prefix of each atom. ``_broadcast`` is the layout of a
pointwise result, ``_regroup`` of a view (static atoms may split; a view that
splits a padded size is not bucketable). Pure functions of shapes and layouts:
no graph, no tensors.
"""

from __future__ import annotations

import contextvars

import sympy
import torch

Atoms = tuple  # tuple[sympy.Expr, ...] : one dim as a row-major product of atoms
Layout = tuple  # tuple[Atoms, ...]     : one tensor


class NotBucketable(Exception):
    """The analysis could not prove bucketing exact for this graph."""


_ASSUMED: contextvars.ContextVar = contextvars.ContextVar("bucket_assumed", default=None)


def assume_equal_sizes() -> list:
    """Start collecting, for this analysis, the pairs of one-atom sizes ``_broadcast`` met that
    sympy can neither prove equal nor different (mpt's ``512 - Max(0, 512 - s)`` against ``s``,
    equal for every length the model takes): the list they go to, checked at each call."""
    pairs: list = []
    _ASSUMED.set(pairs)
    return pairs


_SPECIALIZED: contextvars.ContextVar = contextvars.ContextVar("bucket_specialized", default=None)


class Specialize(NotBucketable):
    """The analysis needs ``symbol`` at ``value``, the value Dynamo traced it at (``_respecialize``)."""

    def __init__(self, symbol, value: int):
        super().__init__(f"{symbol} is needed at {value}")
        self.symbol, self.value = symbol, value


def specialize_sizes(spec: dict, hints: dict) -> None:
    """For this analysis, the size symbols in ``spec`` are their values there (a symbol -> int map,
    checked at each call), and ``hints`` (symbol -> the value Dynamo traced it at) lets
    ``_respecialize`` add more."""
    _SPECIALIZED.set((spec, hints))


def _expr(size) -> sympy.Expr:
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        state = _SPECIALIZED.get()
        if state is not None and state[0] and expr.free_symbols & state[0].keys():
            expr = sympy.expand(expr.xreplace({k: sympy.Integer(v) for k, v in state[0].items()}))
        return expr
    return sympy.Integer(int(size))


def _static(atom) -> bool:
    return not atom.free_symbols


def _dim_expr(atoms: Atoms) -> sympy.Expr:
    return sympy.Mul(*atoms) if atoms else sympy.Integer(1)


def _norm(atoms) -> Atoms:
    """Canonical atoms: adjacent static atoms merged, ones dropped ((s, 2, 2) == (s, 4))."""
    out = []
    for a in atoms:
        if a == 1:
            continue
        if out and _static(a) and _static(out[-1]):
            out[-1] = out[-1] * a
        else:
            out.append(a)
    return tuple(out)


def _padded(atoms: Atoms) -> bool:
    return any(not _static(a) for a in atoms)


def layout_of_shape(shape) -> Layout:
    """A fresh layout: each dim one atom (its content is valid on a prefix)."""
    return tuple(() if _expr(s) == 1 else (_expr(s),) for s in shape)


def _broadcast(layouts: list, out_shape) -> Layout:
    out = []
    nd = len(out_shape)
    for d in range(nd):
        chosen = None
        for lay in layouts:
            k = d - (nd - len(lay))
            if k < 0:
                continue
            atoms = lay[k]
            if _dim_expr(atoms) == 1:
                continue
            if chosen is None:
                chosen = atoms
            elif (_padded(atoms) or _padded(chosen)) and not agree(atoms, chosen):
                raise NotBucketable(f"operands disagree on the padding of dim {d}: {atoms} vs {chosen}")
        if chosen is None:
            chosen = layout_of_shape([out_shape[d]])[0]
        out.append(tuple(chosen))
    return tuple(out)


def agree(a: Atoms, b: Atoms) -> bool:
    """Two operands lay a dim out alike: the same atoms, or atoms assumed equal (checked at each
    call). Where they differ only because Dynamo gave a size a symbol of its own (a batch after a
    graph break, met against a static batch), ``_respecialize`` raises ``Specialize``."""
    a, b = _norm(a), _norm(b)
    if a == b:
        return True
    if len(a) == len(b) and all(x == y or _assume_equal((x,), (y,)) for x, y in zip(a, b)):
        return True
    _respecialize(a, b)
    return False


def _respecialize(a: Atoms, b: Atoms) -> None:
    """Atoms that must be equal and are not, where one is static ``c`` and the other a size of one
    symbol ``s`` that is ``c`` at the value Dynamo traced ``s`` at: ``Specialize(s, value)``. After a
    graph break Dynamo makes every size of the resumed frame's inputs symbolic, the batch too
    (ctrl's hidden states ``[s94, s14, 64]`` against labels ``[2, s38]``), and a padded batch can
    never meet a static one. ``analyze`` runs again with ``s`` at that value, checked at each call
    (another batch keeps exact shapes), as Dynamo's own specialization of a size would."""
    state = _SPECIALIZED.get()
    if state is None or len(a) != len(b):
        return
    spec, hints = state
    for x, y in zip(a, b):
        for e, c in ((x, y), (y, x)):
            if x != y and _static(c) and len(e.free_symbols) == 1:
                s = next(iter(e.free_symbols))
                if s not in spec and s in hints and e.xreplace({s: sympy.Integer(hints[s])}) == c:
                    raise Specialize(s, int(hints[s]))


def _same_hint(a, b) -> bool:
    """Sizes of different symbols, equal at the values Dynamo traced them at (the lengths of one
    sequence, where each tensor of a resumed frame got a symbol of its own)."""
    state = _SPECIALIZED.get()
    hints = state[1] if state is not None else {}
    symbols = a.free_symbols | b.free_symbols
    if not symbols or not symbols <= hints.keys():
        return False
    env = {x: sympy.Integer(hints[x]) for x in symbols}
    return a.xreplace(env) == b.xreplace(env)


def _assume_equal(a: Atoms, b: Atoms) -> bool:
    pairs = _ASSUMED.get()
    if pairs is None or len(a) != 1 or len(b) != 1:
        return False
    if a[0].free_symbols != b[0].free_symbols and not _same_hint(a[0], b[0]):
        return False
    d = sympy.simplify(a[0] - b[0])
    if d.is_number or d.is_zero is False:
        return False  # provably different
    samples = [{x: n for x in d.free_symbols} for n in (1, 37, 129)]
    if all(d.subs(v) != 0 for v in samples):
        return False  # different wherever tried: a call would only find it out
    if (a[0], b[0]) not in pairs:
        pairs.append((a[0], b[0]))
    return True


def _regroup(layout: Layout, out_shape) -> Layout:
    """Layout after a view: consecutive atoms grouped to the new dims; static atoms may split."""
    atoms = [a for dim in layout for a in dim if a != 1]
    out = []
    i = 0
    for n, size in enumerate(out_shape):
        want = _expr(size)
        if want == 1:
            out.append(())
            continue
        group = []
        have = sympy.Integer(1)
        while sympy.simplify(have - want) != 0:
            if i >= len(atoms):
                raise NotBucketable(f"view to {list(out_shape)} does not follow the padded layout {layout}")
            atom = atoms[i]
            ratio = sympy.simplify(want / have)
            chunk = _chunks(atom, want, out_shape[n + 1:]) if not group else None
            if chunk is not None:
                group.append(want)  # (q, c) of a multiple of c: q's prefix is the real chunks
                atoms[i] = chunk
                have = want
                continue
            if _static(atom) and _static(ratio) and atom != ratio and int(atom) % int(ratio) == 0 and ratio.is_integer:
                group.append(ratio)  # split a static atom
                atoms[i] = sympy.Integer(int(atom) // int(ratio))
                have = have * ratio
                continue
            group.append(atom)
            have = have * atom
            i += 1
            if not _static(sympy.simplify(want / have)) and not sympy.simplify(want / have).free_symbols <= want.free_symbols:
                raise NotBucketable(f"view to {list(out_shape)} splits a padded size")
        out.append(_norm(group))
    if any(a != 1 for a in atoms[i:]):
        raise NotBucketable(f"view to {list(out_shape)} does not consume the layout {layout}")
    return tuple(out)


def _chunks(atom, want, rest):
    """A symbolic ``atom`` viewed as ``(want, c, ...)`` with ``c`` the product of the static sizes
    after it, when ``want * c`` is ``atom`` (Mamba2's tokens padded to a multiple of the chunk and
    viewed as chunks: ``t + (c - t % c) % c`` as ``(t + ...) // c`` chunks of ``c``): the real
    region of a multiple of ``c`` is whole chunks, the prefix of ``want``. Sympy rarely proves
    the product (``FloorDiv``), so it is assumed and checked at each call; ``c`` is returned (a
    size expression where the graph writes the chunk as one)."""
    c = sympy.Integer(1)
    for size in rest:
        if not isinstance(size, int):
            c = c * _expr(size) if c == 1 else c  # bamba's chunk is A // (A // 256), not a literal 256
            break
        c *= size
    if c == 1 or _static(atom) or _static(want) or not want.free_symbols <= atom.free_symbols \
            or sympy.simplify(atom - want) == 0:
        return None
    if sympy.simplify(want * c - atom) != 0 and not _assume_equal((want * c,), (atom,)):
        return None
    return c


def prefix_atoms(atoms: Atoms):
    """``atoms`` as one atom when the real region is a prefix of the dim (no symbolic atom after
    the first: ``(s, 2)`` holds its ``2 * s`` real elements first), else None."""
    atoms = _norm(atoms)
    if all(_static(a) for a in atoms[1:]):
        return (_dim_expr(atoms),) if atoms else atoms
    return None


def _padded_layout(lay) -> bool:
    return lay is not None and any(_padded(a) for a in lay)
