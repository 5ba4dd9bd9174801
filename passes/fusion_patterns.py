"""Fusion patterns: which ops of a block form one kernel, and of what kind.

Each pattern is (anchor op name, matcher). A matcher takes the block's
``BlockGraph``, the anchor's index and the set of already claimed ops, and
returns ``(kind, region)`` or None ("no match"). Patterns run in the order of
``PATTERNS``: larger kernels first, so attention claims its matmuls before the
matmul-epilogue pattern sees them. Every region returned is disjoint from
``claimed`` and convex, counting each region claimed before it as one op
(``BlockGraph.claim``), so the composites never depend on each other in a
cycle.

attention  (anchor: the dot_general computing probs @ V)
    scores = Q K^T ; [scale] ; [mask] ; softmax = exp(s - max) / sum ; out = P V.
    Region: every op on a path from the QK^T dot_general to the PV one, which
    must include a max-reduce, an exponential and a sum-reduce and no other
    matmul, plus feeders (Q/K/V reshapes and transposes, the mask broadcast).
layer_norm / rms_norm  (anchor: rsqrt)
    rsqrt(mean(d*d) + eps) * d [* w] [+ b] with d = x - mean(x) (layer norm)
    or d = x (RMS norm). Region: every op on a path from x to the last
    epilogue op, plus feeders.
matmul_epilogue / conv_epilogue  (anchor: dot_general / convolution)
    the op plus the elementwise ops that consume it (bias add, activation,
    scale, residual add), grown while every other operand comes from outside
    the region and does not depend on it.
elementwise  (anchor: any elementwise op)
    a connected, convex group of at least two elementwise ops.
"""
from __future__ import annotations

from typing import Callable, Optional

from torch_mlir import ir

from .dataflow import OUTSIDE, BlockGraph
from .stablehlo_ops import CONSTANTS, ELEMENTWISE, LAYOUT

Match = Optional[tuple[str, set]]
PASS_THROUGH = LAYOUT | {"stablehlo.convert", "stablehlo.slice", "stablehlo.pad"}
SOFTMAX_BODY = ELEMENTWISE | PASS_THROUGH | CONSTANTS | {"stablehlo.reduce"}


def reduce_kind(op) -> Optional[str]:
    """'max' / 'add' for a stablehlo.reduce with that body, else None."""
    if op.name != "stablehlo.reduce":
        return None
    body = list(op.regions[0].blocks[0].operations)
    names = {b.name for b in body[:-1]}
    if names == {"stablehlo.maximum"}:
        return "max"
    if names == {"stablehlo.add"}:
        return "add"
    return None


def _finish(g: BlockGraph, kind: str, core: set, claimed: set) -> Match:
    if core & claimed:
        return None
    region = g.absorb_feeders(core, claimed)
    if not g.is_convex(region):
        region = core
        if not g.is_convex(region):
            return None
    return kind, region


# ----------------------------------------------------------------- attention


def _nearest_dot_above(g: BlockGraph, value: ir.Value, budget: int = 64) -> Optional[int]:
    """Closest dot_general that ``value`` depends on, walking back through
    softmax-like ops only."""
    start = g.producer(value)
    if start is None:
        return None
    frontier, seen = [start], {start}
    while frontier and budget > 0:
        budget -= 1
        nxt = []
        for i in frontier:
            if g.name(i) == "stablehlo.dot_general":
                return i
            if g.name(i) not in SOFTMAX_BODY:
                continue
            for p in g.producers(i):
                if p not in seen:
                    seen.add(p)
                    nxt.append(p)
        frontier = sorted(nxt, reverse=True)
    return None


def match_attention(g: BlockGraph, d2: int, claimed: set) -> Match:
    op = g.ops[d2]
    d1 = _nearest_dot_above(g, op.operands[0])
    if d1 is None:
        return None
    core = g.between(d1, d2)
    inner = core - {d1, d2}
    if any(g.name(i) not in SOFTMAX_BODY for i in inner):
        return None
    kinds = [reduce_kind(g.ops[i]) for i in inner if g.name(i) == "stablehlo.reduce"]
    has_exp = any(g.name(i) == "stablehlo.exponential" for i in inner)
    if not (has_exp and "max" in kinds and "add" in kinds):
        return None
    # The values dot 2 reads through its rhs (V) must not come out of dot 1.
    v = g.producer(op.operands[1])
    if v is not None and v in core:
        return None
    return _finish(g, "attention", core, claimed)


# ----------------------------------------------------------------- normalization


def _single_user_chain(g: BlockGraph, i: int, names) -> int:
    """Follow sole users of op i while they are in ``names``; last op reached."""
    while True:
        users = g.users(i)
        if len(users) != 1 or users[0] == OUTSIDE or g.name(users[0]) not in names:
            return i
        i = users[0]


def _is_side_input(g: BlockGraph, value: ir.Value) -> bool:
    """A per-channel parameter or constant: broadcast_in_dim of a lower-rank
    value, or a constant."""
    p = g.producer(value)
    if p is None:
        return False
    name = g.name(p)
    if name in CONSTANTS:
        return True
    if name == "stablehlo.broadcast_in_dim":
        src = g.ops[p].operands[0]
        return ir.RankedTensorType(src.type).rank < ir.RankedTensorType(value.type).rank or (
            g.producer(src) is not None and g.name(g.producer(src)) in CONSTANTS
        )
    return False


def match_normalization(g: BlockGraph, r: int, claimed: set) -> Match:
    # rsqrt -> broadcast/reshape/convert -> multiply(d, .)
    b = _single_user_chain(g, r, PASS_THROUGH)
    users = g.users(b)
    if len(users) != 1 or users[0] == OUTSIDE or g.name(users[0]) != "stablehlo.multiply":
        return None
    m = users[0]
    mop = g.ops[m]
    other = [v for v in mop.operands if g.producer(v) != b]
    if len(other) != 1:
        return None
    d = other[0]
    kind, x = "rms_norm", d
    dp = g.producer(d)
    if dp is not None and g.name(dp) == "stablehlo.subtract":
        # layer norm: d = x - broadcast(mean(x)); the mean is a reduction
        # that does not itself depend on the rsqrt
        mean = g.producer(g.ops[dp].operands[1])
        if (
            mean is not None
            and not g.reaches(r, mean)
            and g.nearest_above(mean, ("stablehlo.reduce",)) is not None
        ):
            kind, x = "layer_norm", g.ops[dp].operands[0]
    # epilogue: [convert] [* broadcast(w)] [+ broadcast(b)]
    y = m
    for name in ("stablehlo.convert", "stablehlo.multiply", "stablehlo.add"):
        users = g.users(y)
        if len(users) != 1 or users[0] == OUTSIDE or g.name(users[0]) != name:
            continue
        u = users[0]
        if name != "stablehlo.convert" and not any(
            _is_side_input(g, v) for v in g.ops[u].operands if g.producer(v) != y
        ):
            continue
        y = u
    # core: ops on a path from x to y (x itself stays outside)
    xp = g.producer(x)
    seeds = g.value_users(x)
    seeds = [s for s in seeds if s != OUTSIDE]
    core = g.forward(seeds, limit=y) & g.backward([y], floor=min(seeds, default=y))
    if xp is not None:
        core.discard(xp)
    if r not in core or not any(g.name(i) == "stablehlo.reduce" for i in core):
        return None
    if any(g.name(i) not in SOFTMAX_BODY for i in core):
        return None
    return _finish(g, kind, core, claimed)


# ----------------------------------------------------------------- matmul epilogue

EPILOGUE = ELEMENTWISE | {"stablehlo.reshape", "stablehlo.slice", "stablehlo.convert"}


def match_matmul_epilogue(g: BlockGraph, d: int, claimed: set) -> Match:
    """dot_general or convolution + its elementwise consumers."""
    region = {d}
    grew = True
    while grew:
        grew = False
        for u in sorted({u for i in region for u in g.users(i)} - region - claimed - {OUTSIDE}):
            if g.name(u) not in EPILOGUE:
                continue
            trial = region | {u}
            if g.is_convex(trial):
                region = trial
                grew = True
    if not any(g.name(i) in ELEMENTWISE for i in region):
        return None
    kind = "conv_epilogue" if g.name(d) == "stablehlo.convolution" else "matmul_epilogue"
    return _finish(g, kind, region, claimed)


# ----------------------------------------------------------------- elementwise


def match_elementwise(g: BlockGraph, seed: int, claimed: set) -> Match:
    region = {seed}
    frontier = [seed]
    while frontier:
        i = frontier.pop()
        for j in sorted(set(g.producers(i)) | set(g.users(i)) - {OUTSIDE}):
            if j in region or j in claimed or g.name(j) not in ELEMENTWISE:
                continue
            trial = region | {j}
            if g.is_convex(trial):
                region = trial
                frontier.append(j)
    if sum(g.name(i) in ELEMENTWISE for i in region) < 2:
        return None
    return _finish(g, "elementwise", region, claimed)


# (kind, anchor predicate, matcher), in priority order.
PATTERNS: list[tuple[str, Callable[[str], bool], Callable[[BlockGraph, int, set], Match]]] = [
    ("attention", lambda n: n == "stablehlo.dot_general", match_attention),
    ("normalization", lambda n: n == "stablehlo.rsqrt", match_normalization),
    (
        "matmul_epilogue",
        lambda n: n in ("stablehlo.dot_general", "stablehlo.convolution"),
        match_matmul_epilogue,
    ),
    ("elementwise", lambda n: n in ELEMENTWISE, match_elementwise),
]
