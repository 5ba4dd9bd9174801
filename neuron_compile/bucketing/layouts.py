"""Padded layouts: the arithmetic shape bucketing reasons in (``analysis.py`` decides, with it,
whether a graph is exact when padded).

A dim of a padded tensor is a row-major product of *atoms*, each a sympy
expression of the true size (``s1``, ``s1 + 1``, a static ``64``); its real
content is the prefix of each atom. ``_broadcast`` is the layout of a
pointwise result, ``_regroup`` of a view (static atoms may split; a view that
splits a padded size is not bucketable). Pure functions of shapes and layouts:
no graph, no tensors. The size arithmetic the analysis and the call share (the
bucket of a true size, a size expression's value) is ``sizes``.

A symbolic atom whose value is the same at the true and at the bucket sizes
(``round_up(t, 256)`` under buckets of 128: Mamba2's tokens padded to whole
chunks) is *invariant*: its whole extent is real, so it is not padded
(``_padded``), which each call checks (``assume_invariant_sizes``). A size
that the graph's guards make a constant or ``t + k`` (bamba's chunk count,
guarded to 1, and sizes written through it) takes that form (``_canonical``),
checked at each call too.
"""

from __future__ import annotations

import contextvars

import sympy
import torch

from .sizes import _ANY, _SAMPLES, NotBucketable, _holds, bucket_within, sym_to_value
from .shape_env import guards as shape_env_guards, value_ranges

Atoms = tuple  # tuple[sympy.Expr, ...] : one dim as a row-major product of atoms
Layout = tuple  # tuple[Atoms, ...]     : one tensor

_ASSUMED: contextvars.ContextVar = contextvars.ContextVar("bucket_assumed", default=None)
_INVARIANT: contextvars.ContextVar = contextvars.ContextVar("bucket_invariant", default=None)


def assume_equal_sizes() -> list:
    """Start collecting, for this analysis, the pairs of one-atom sizes ``_broadcast`` met that
    sympy can neither prove equal nor different (mpt's ``512 - Max(0, 512 - s)`` against ``s``,
    equal for every length the model takes): the list they go to, checked at each call."""
    pairs: list = []
    _ASSUMED.set(pairs)
    return pairs


_SPECIALIZED: contextvars.ContextVar = contextvars.ContextVar("bucket_specialized", default=None)
_PRODUCTS: contextvars.ContextVar = contextvars.ContextVar("bucket_products", default=None)
_SHAPE_ENV: contextvars.ContextVar = contextvars.ContextVar("bucket_shape_env", default=None)


def guarded_products(shape_env, views=()) -> dict:
    """The size symbols the graph's guards define as a product of two others: ``Eq(Mod(s, a), 0)``
    with ``Eq(b, s // a)`` is ``s == a * b`` (``a * (s // a) + s % a == s``), ``s -> (a, b)``.
    A resumed frame gets a symbol of its own for a size it did not compute (longcat's
    ``[s38, 64]`` flattened tokens, viewed back as ``orig_shape = (s61, s39, 64)``), and the
    view's guards relate it to the sizes it came from. Dynamo checks the guards at every call, so
    the identity holds for every call the graph serves; so does ``Eq(s, a * b)`` (a reshape of a
    resumed frame's input to ``[a, b]``). The order ``(a, b)`` is the view's (``a`` rows of ``b``;
    ``views``: the graph's views as pairs of input and output sizes): the blocks it is laid out in
    when an input (``merged_input``)."""
    if shape_env is None:
        return {}
    divisible, quotients, products = set(), {}, {}
    for g in shape_env_guards(shape_env):
        if not isinstance(g, sympy.Eq):
            continue
        for x, y in ((g.lhs, g.rhs), (g.rhs, g.lhs)):
            if type(x).__name__ in ("Mod", "PythonMod") and y == 0 and x.args[0].is_Symbol:
                divisible.add(tuple(x.args))
            if type(x).__name__ == "FloorDiv" and y.is_Symbol and x.args[0].is_Symbol:
                quotients[tuple(x.args)] = y
            if x.is_Symbol and y.is_Mul and len(y.args) == 2 and x not in y.free_symbols \
                    and all(f.is_Symbol or f.is_Integer for f in y.args):
                products[x] = _view_order(x, y.args, views)  # blt's Eq(s38, s21*s56)
    products.update({s: (a, b) for (s, a), b in quotients.items()
                     if (s, a) in divisible and s != b and s not in a.free_symbols and (a.is_Symbol or a.is_Integer)})
    return products


def _view_order(s, factors, views) -> tuple:
    """The two ``factors`` of ``s`` in the order a view of a size-``s`` dim into them writes them (blt's
    ``patch_starts.reshape(batch, seq_len)``), else sympy's."""
    for before, after in views:
        for d, size in enumerate(before):
            if size == s:
                for i in range(len(after) - 1):
                    if set(after[i:i + 2]) == set(factors) and sympy.Mul(*after[i:i + 2]) == sympy.Mul(*factors):
                        return tuple(after[i:i + 2])
    return tuple(factors)


def assume_products(products: dict, shape_env=None) -> None:
    """For this analysis, the size symbols in ``products`` (``guarded_products``) are those
    products wherever a size is read (``size_expr``); ``shape_env`` is the graph's (its guards
    give sizes the forms ``_same_size`` compares)."""
    _PRODUCTS.set(products or None)
    _SHAPE_ENV.set(shape_env)


def assumed_products() -> dict:
    """The products ``assume_products`` set for this analysis (symbol -> its two factors)."""
    return _PRODUCTS.get() or {}


def size_expr(expr):
    """``expr`` with each symbol the guards define as a product written as it (``guarded_products``):
    a bucket is chosen for the factors, so every size, bucketed or read as a true value, is
    written in them."""
    products = _PRODUCTS.get()
    if products and expr.free_symbols & products.keys():
        expr = expr.xreplace({s: a * b for s, (a, b) in products.items()})
    return expr


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


def assume_invariant_sizes(buckets, admits=None) -> list:
    """Start collecting, for this analysis under ``buckets``, the symbolic atoms taken for
    *invariant*: equal at the true sizes and at their buckets, so that a dim of that size holds
    no padding at the bucket. Algebra: an atom ``a`` of a layout promises eager's values on the
    positions below ``a(true)`` (with the other atoms real); at the bucket the dim has ``a(bucket)``
    positions, so where ``a(bucket) == a(true)`` every position is real and the dim is exact as a
    static one is: every rule that holds for an unpadded dim holds for it. Mamba2's chunked scan
    is the case: the tokens padded to a multiple of the chunk, ``P(t) = t + (c - t % c) % c``,
    have ``P(t) == P(round_up(t, m))`` when the bucket multiple ``m`` divides ``c`` (both round to
    the same multiple of ``c``), and ``constant_pad_nd`` writes its value from the true end, so
    the padded tokens are eager's; so are the chunk count ``P // c`` and every size computed
    from ``P`` alone. An atom is taken for invariant when it is at every one of many sampled
    true sizes (``_SAMPLES``); the list returned goes to ``BucketAnalysis.checks``, which each
    call checks at its own sizes (a failure keeps the graph at exact shapes). ``buckets`` None:
    no atom is invariant. ``admits``: the graph's ``Admits``, which caps each symbol's bucket
    (``bucket_within``)."""
    found: list = []
    _INVARIANT.set((buckets, found, {"admits": admits or {}}) if buckets else None)
    return found


def end_assumptions() -> None:
    """An analysis is over: no pair is assumed equal, no size invariant, until the next starts."""
    _ASSUMED.set(None)
    _INVARIANT.set(None)
    _SPECIALIZED.set(None)
    _PRODUCTS.set(None)
    _SHAPE_ENV.set(None)


def _invariant(atom) -> bool:
    """``atom`` is the same at the true sizes and at their buckets (``assume_invariant_sizes``)."""
    state = _INVARIANT.get()
    if state is None or _static(atom):
        return False
    buckets, found, cache = state
    if atom not in cache:
        cache[atom] = _same_at_bucket(atom, buckets, cache["admits"])
    if cache[atom] and atom not in found:
        found.append(atom)
    return cache[atom]


def _same_at_bucket(atom, buckets, admits) -> bool:
    """``atom`` is the same at each sampled true size its guards admit and at its bucket (every
    symbol of it at that size: the lengths of one sequence, where Dynamo gave each tensor its own
    symbol)."""
    symbols = atom.free_symbols
    tried = [n for n in _samples(symbols, admits) if all(admits.get(x, _ANY)(n) for x in symbols)]
    if len(tried) < 3:
        return False
    alike = [admits[x] for x in symbols if x in admits]
    try:
        for n in tried:
            true = {x: n for x in symbols}
            bucket = dict.fromkeys(symbols, bucket_within(n, buckets, alike))
            if int(sym_to_value(atom, true)) != int(sym_to_value(atom, bucket)):
                return False
    except Exception:  # noqa: BLE001 - an expression it cannot evaluate is not invariant
        return False
    return True


def _expr(size) -> sympy.Expr:
    if isinstance(size, torch.SymInt):
        expr = size_expr(size.node.expr)
        state = _SPECIALIZED.get()
        if state is not None and state[0] and expr.free_symbols & state[0].keys():
            expr = sympy.expand(expr.xreplace({k: sympy.Integer(v) for k, v in state[0].items()}))
        return _canonical(expr, size.node.shape_env)
    return sympy.Integer(int(size))


def _canonical(expr, shape_env):
    """``expr`` as a constant or as ``a * s + b`` where it is one at every true size the graph's
    guards admit (``_SAMPLES`` where every guard of ``shape_env`` on ``s`` alone holds) and at
    their buckets; its subexpressions so, where it is not. Dynamo specializes sizes by guards
    that sympy does not apply: at one chunk (``Eq(P // 256, 1)``, ``P <= 256``) bamba's graphs
    write the chunk count as ``P // 256``, the chunk as ``P // (P // 256)``, its 640 channels as
    ``256 * (P // 256) + 384`` and its ``t + 3`` conv length as ``(P // 256) * (P // (P // 256)) -
    (256 - t % 256) % 256 + 3``: a view that drops the chunk count, or a weight gradient's conv
    of output length ``4``, cannot be proven from those forms and is from ``1``, ``640``, ``t + 3``.
    Exact: the replacement is the expression at the true sizes and at the bucket of every call,
    which each call checks (``BucketAnalysis.checks``, a pair equal at both; a failure keeps exact
    shapes), so a layout in the replaced form describes the same tensors. Only while an analysis
    with buckets runs (``assume_invariant_sizes``). Several symbols (the lengths of one sequence,
    where Dynamo gave each tensor its own) are sampled alike, and only a constant replaces an
    expression of them."""
    state = _INVARIANT.get()
    if state is None or _static(expr) or shape_env is None:
        return expr
    buckets, found, cache = state
    key = ("canonical", expr)
    if key not in cache:
        symbols = tuple(sorted(expr.free_symbols, key=str))
        admits = [cache["admits"][x] for x in symbols if x in cache["admits"]]
        cache[key] = _canonical_form(expr, _admitted(symbols, shape_env, cache), buckets,
                                     lambda n: bucket_within(n, buckets, admits))
    if cache[key] is not expr and _ASSUMED.get() is not None and (expr, cache[key]) not in _ASSUMED.get():
        _ASSUMED.get().append((expr, cache[key]))  # checked at each call, at the true and the bucket sizes
    return cache[key]


def _admitted(symbols, shape_env, cache) -> tuple:
    """The sampled true sizes (each of ``symbols`` at it) that their value ranges and every guard
    on them alone admit."""
    guards = shape_env_guards(shape_env)
    key = ("admitted", symbols, id(shape_env), len(guards))
    if key in cache:
        return cache[key]
    own = [g for g in guards if g.free_symbols and g.free_symbols <= set(symbols)]
    ranges = value_ranges(shape_env)
    out = []
    for n in _samples(symbols, cache["admits"]):
        if any(x in ranges and not (ranges[x].lower <= n <= ranges[x].upper) for x in symbols):
            continue
        if all(_holds(g, {x: n for x in symbols}, sym_to_value) for g in own):
            out.append(n)
    cache[key] = tuple(out)
    return cache[key]


def _samples(symbols, admits) -> list:
    """The sizes ``symbols`` (one sequence's lengths) are tried at (``Admits.samples``)."""
    out = set(_SAMPLES)
    for x in symbols:
        if x in admits:
            out |= set(admits[x].samples())
    return sorted(out)


def _canonical_form(expr, admitted, buckets, bucket):
    if len(admitted) < 3 or expr.is_Symbol:
        return expr
    symbols = expr.free_symbols
    sizes = sorted(set(admitted) | {bucket(n) for n in admitted})
    try:
        values = [int(sym_to_value(expr, {x: n for x in symbols})) for n in sizes]
    except Exception:  # noqa: BLE001 - not evaluable: kept as it is
        return expr
    slope = (values[-1] - values[0]) // (sizes[-1] - sizes[0]) if sizes[-1] != sizes[0] else 0
    offset = values[0] - slope * sizes[0]
    if (slope == 0 or len(symbols) == 1) and all(v == slope * n + offset for n, v in zip(sizes, values)):
        form = slope * next(iter(symbols)) + offset if slope else sympy.Integer(offset)
        return expr if sympy.expand(form - expr) == 0 else form
    if not expr.args or expr.is_Atom:
        return expr
    args = [_canonical_form(a, admitted, buckets, bucket) if not _static(a) else a for a in expr.args]
    if all(a is b for a, b in zip(args, expr.args)):
        return expr
    try:
        return expr.func(*args)
    except Exception:  # noqa: BLE001
        return expr


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
    """Some atom is symbolic and not invariant (``assume_invariant_sizes``): the dim has padding."""
    return any(not _static(a) and not _invariant(a) for a in atoms)


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
    ga, gb = _prefix_groups(a), _prefix_groups(b)
    if len(ga) == len(gb) and all(_same_size(x, y) for x, y in zip(ga, gb)):
        return True  # blocks real on prefixes of one size ((2, t // 4, 4) and (2, t), t a multiple of 4)
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
    """Layout after a view: consecutive atoms grouped to the new dims; static atoms may split.

    A tensor with no padded dim (static and invariant atoms only: Mamba2's chunks, after the
    tokens were padded to whole chunks) holds eager's values everywhere, so any view of it
    does, at sizes the bucket shares with the true ones: a fresh layout, as long as no new dim
    is padded. Its atoms need not line up with the view (a chunk count the graph knows to be 1
    and views away, which sympy cannot see)."""
    if not _padded_layout(layout):
        fresh = layout_of_shape(out_shape)
        if not _padded_layout(fresh):
            return fresh
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
        while not _same_size(have, want):
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
    after it, up to the first that makes ``want * c`` the atom (deepseek_v4's ``[t // 4, 4, 32]``
    of ``4 (t // 4)``: ``c`` is 4), when ``want * c`` is ``atom`` and ``want`` is the smaller
    (else the view merges atoms). Mamba2's tokens padded to a multiple of the chunk are viewed
    as chunks so: ``t + (c - t % c) % c`` as ``(t + ...) // c`` chunks of ``c``. The real
    region of a multiple of ``c`` is whole chunks, the prefix of ``want``. Sympy rarely proves
    the product (``FloorDiv``), so it is assumed and checked at each call; ``c`` is returned (a
    size expression where the graph writes the chunk as one). ``c`` must hold no padding (static,
    or the same at the bucket): a prefix of ``s t`` is not ``t`` rows of ``s`` at the bucket."""
    c = sympy.Integer(1)
    for size in rest:
        if not isinstance(size, int):
            c = c * _expr(size) if c == 1 else c  # bamba's chunk is A // (A // 256), not a literal 256
            break
        c *= size
        if _same_size(want * c, atom):
            break  # the chunk is these dims; the next are atoms of their own
    if c == 1 or _static(atom) or _static(want) or not want.free_symbols <= atom.free_symbols \
            or not _smaller(want, atom) or _padded((c,)):
        return None  # a padded c (a prefix of s t viewed as [t, s]) is not whole chunks at the bucket
    if not _same_size(want * c, atom) and not _assume_equal((want * c,), (atom,)):
        return None
    return c


def _smaller(a, b) -> bool:
    """``a < b`` at sampled lengths (every symbol at 37, at 129)."""
    try:
        return all(int(sym_to_value(a, dict.fromkeys(a.free_symbols | b.free_symbols, n))) <
                   int(sym_to_value(b, dict.fromkeys(a.free_symbols | b.free_symbols, n))) for n in (37, 129))
    except Exception:  # noqa: BLE001 - not evaluable: not known smaller
        return False


def _same_size(a, b) -> bool:
    """Sizes sympy proves equal, or equal in the forms the graph's guards give them (``_canonical``:
    ``4 * (t // 4)`` is ``t`` where a guard makes ``t`` a multiple of 4; checked at each call)."""
    if sympy.simplify(a - b) == 0:
        return True
    shape_env = _SHAPE_ENV.get()
    return sympy.simplify(_canonical(a, shape_env) - _canonical(b, shape_env)) == 0


def _prefix_groups(atoms: Atoms) -> list:
    """``atoms`` as blocks each real on a prefix: a symbolic atom with the static ones after it as
    one size (``(2, t // 4, 4)`` -> ``[2, 4 (t // 4)]``)."""
    groups: list = []
    for a in atoms:
        if groups and _static(a):
            groups[-1] = groups[-1] * a
        else:
            groups.append(a)
    return groups


def prefix_atoms(atoms: Atoms):
    """``atoms`` as one atom when the real region is a prefix of the dim (no symbolic atom after
    the first: ``(s, 2)`` holds its ``2 * s`` real elements first), else None."""
    atoms = _norm(atoms)
    if all(_static(a) for a in atoms[1:]):
        return (_dim_expr(atoms),) if atoms else atoms
    return None


def _padded_layout(lay) -> bool:
    return lay is not None and any(_padded(a) for a in lay)


def shape_key(val) -> tuple:
    """A tensor's sizes as sympy expressions or ints: a forward output's against its tangent's."""
    return tuple(size.node.expr if isinstance(size, torch.SymInt) else int(size) for size in val.shape)


def merged_input(val, atoms=None):
    """An input tensor with a dim of merged padded size (``2 t``), or ``atoms`` of one as blocks
    (``(2, t)``: a true-size input is exact in any layout; a view of ``[2, t]`` merged it so)."""
    if atoms is None:
        return isinstance(val, torch.Tensor) and any(len(a) == 1 and a[0].is_Mul and _padded(a)
                                                     for a in layout_of_shape(val.shape))
    if len(atoms) == 1 and atoms[0].is_Mul and _padded(atoms):
        for a, b in assumed_products().values():
            if sympy.expand(a * b - atoms[0]) == 0:
                return _norm((a, b))  # the view the guards came from: a rows of b
        return _norm(tuple(sorted(atoms[0].args, key=lambda a: (bool(a.free_symbols), str(a)))))
    return atoms
