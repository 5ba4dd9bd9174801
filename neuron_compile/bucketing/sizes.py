"""The sizes a bucketed graph runs at: which bucket each size symbol takes at a call, and the size
arithmetic the analysis and the call share.

``round_up`` is the bucket policy (next multiple, or next entry of a list); ``bucket_within`` caps
it at the last size a graph's guards admit (``Admits``: Dynamo traced a graph only for the sizes
its guards admit, and a Python loop over a chunk count guards the count); ``buckets_within`` gives
one call's buckets, the symbols of one length alike and a symbol that is a static multiple of
another (``size_multiples``) at that multiple of its bucket. ``sym_to_value`` evaluates a size
expression on ints or on the 0-d true-size tensors inside a graph. Pure functions of sizes and
guards: no layouts, no graph.
"""

from __future__ import annotations

import sympy
import torch

from .shape_env import guards as shape_env_guards, value_ranges


class NotBucketable(Exception):
    """The analysis could not prove bucketing exact for this graph."""


# true sizes an atom is tried at before it is taken for invariant (each call checks the one it has)
_SAMPLES = (1, 2, 3, 5, 8, 16, 17, 31, 37, 63, 64, 65, 100, 127, 128, 129, 200, 250, 255, 256, 257, 300, 383, 384,
            385, 511, 512, 513, 640, 767, 768, 769, 1000, 1023, 1024, 1025, 1500, 2047, 2048, 2049, 3000, 4095,
            4096, 4097, 8191, 8192, 8193)


def _holds(guard, env, value) -> bool:
    """A guard at ``env``; True where it cannot be evaluated (guards only narrow the samples)."""
    try:
        if guard is sympy.true or guard is sympy.false:
            return bool(guard)
        if isinstance(guard, sympy.And):
            return all(_holds(g, env, value) for g in guard.args)
        if isinstance(guard, sympy.Or):
            return any(_holds(g, env, value) for g in guard.args)
        if isinstance(guard, sympy.Not):
            return not _holds(guard.args[0], env, value)
        if isinstance(guard, sympy.core.relational.Relational):
            lhs, rhs = value(guard.lhs, env), value(guard.rhs, env)
            return {"==": lhs == rhs, "!=": lhs != rhs, "<": lhs < rhs, "<=": lhs <= rhs, ">": lhs > rhs,
                    ">=": lhs >= rhs}[guard.rel_op]
    except Exception:  # noqa: BLE001 - a guard it cannot evaluate does not narrow
        return True
    return True


def round_up(n: int, buckets) -> int:
    """The bucket for true size ``n``: next multiple of an int, or next entry of a sorted list."""
    if isinstance(buckets, int):
        return max(buckets, -(-n // buckets) * buckets) if n > 0 else buckets
    for b in buckets:
        if n <= b:
            return b
    step = buckets[-1]
    return -(-n // step) * step


class Admits:
    """Whether a size symbol may take a value, by the graph's value range for it and its guards
    on it alone: Dynamo traced the graph only for those. A Python loop over a chunk count (the
    gated delta rule's ``for i in range(num_chunks)``, chunks of 64) guards the count, so a graph
    admits the lengths of one count, ``(64 (n - 1), 64 n]``, and a bucket of 128 above them runs a
    graph traced for other sizes (``bucket_within``)."""

    def __init__(self, guards, lower=None, upper=None, hint=None):
        self.guards, self.lower, self.upper, self.hint = tuple(guards), lower, upper, hint
        self.memo: dict = {}  # size -> admitted

    def samples(self) -> list:
        """The sizes to try a symbol at: ``_SAMPLES``, and where its guards admit few of them (a
        graph guarded to one chunk count), those within 130 of the traced one too."""
        if self.hint is None or sum(map(self, _SAMPLES)) >= 8:
            return list(_SAMPLES)
        return sorted(set(_SAMPLES) | set(range(max(1, self.hint - 130), self.hint + 131)))

    def only(self, n: int) -> bool:
        """``n`` is the one size tried (``samples``) that the guards admit: the graph is for it alone."""
        return self.hint == n and [m for m in self.samples() if self(m)] == [n]

    def __call__(self, n: int) -> bool:
        if n not in self.memo:
            self.memo[n] = (self.lower is None or n >= self.lower) and (self.upper is None or n <= self.upper) and all(
                _holds(g, {x: n for x in g.free_symbols}, sym_to_value) for g in self.guards)
        return self.memo[n]


def _ANY(n) -> bool:
    return True


def symbol_admits(shape_env, symbols, hints) -> dict:
    """symbol -> its ``Admits`` (the guards of ``shape_env`` on it alone, its value range, the
    value in ``hints`` Dynamo traced it at)."""
    if shape_env is None:
        return {}
    guards, ranges = shape_env_guards(shape_env), value_ranges(shape_env)
    out = {}
    for x in symbols:
        r = ranges.get(x)
        lower = int(r.lower) if r is not None and r.lower.is_Integer else None  # not int_oo
        upper = int(r.upper) if r is not None and r.upper.is_Integer else None
        out[x] = Admits([g for g in guards if g.free_symbols == {x}], lower, upper, hints.get(x))
    return out


def bucket_within(n: int, buckets, admits=()) -> int:
    """The bucket of true size ``n`` in a graph that admits (``Admits``) only some sizes:
    ``round_up(n, buckets)`` where each of ``admits`` (those of the symbols at ``n``: one
    sequence's lengths, where Dynamo gave each tensor its own symbol, are bucketed alike) admits
    it, else the largest size between ``n`` and it that they all admit (``n`` itself is: the
    call passed Dynamo's guards). Where the admitted sizes are an interval ``[a, b]`` (a guarded
    chunk count), every ``n`` of one bucket gets the same one, ``min(round_up(n), b)``: one
    executable per graph and bucket."""
    b = round_up(n, buckets)
    while b > n and not all(a(b) for a in admits):
        b -= 1
    return b


def buckets_within(true_env: dict, symbols, buckets, admits: dict, multiples: dict | None = None) -> dict:
    """symbol -> its bucket (``bucket_within``), the symbols at one true size bucketed alike, and
    a symbol that is a static multiple ``c`` of another (``multiples``) at ``c`` times its bucket
    where it is one at this call."""
    out = {}
    for x in symbols:
        n = true_env[x]
        alike = [admits[y] for y in symbols if true_env[y] == n and y in admits]
        out[x] = bucket_within(n, buckets, alike)
    for x, (y, c) in (multiples or {}).items():  # at most twice its own bucket: a bound on the waste
        if true_env[x] == c * true_env[y] and c * out[y] <= 2 * out[x] and (x not in admits or admits[x](c * out[y])):
            out[x] = c * out[y]
    return out


def size_multiples(symbols, hints: dict) -> dict:
    """symbol -> (another, c): the sizes Dynamo traced at a static multiple ``c >= 2`` of another's
    (a resumed frame's flattened tokens, ``s67 = 2 t``, a symbol of their own). Each alone would
    round up to its own bucket: ``2 t`` for t = 37, 100 to 128, 256 where t's bucket is 128 both
    times, executables per pair of buckets; at ``c`` times the other's bucket it is one per bucket
    of ``t``. A bucket is any size at least the true one, so this is a policy, not an assumption:
    a call where the multiple does not hold, or where it would more than double the symbol's own
    bucket, buckets the symbol alone (``buckets_within``)."""
    out = {}
    for x in symbols:
        bases = [y for y in symbols if y != x and hints.get(y, 0) >= 16 and hints.get(x) and hints[x] % hints[y] == 0
                 and 2 <= hints[x] // hints[y] <= 8]  # a batch of lengths (of 16 or more) flattened
        if bases:
            y = min(bases, key=lambda b: (hints[b], str(b)))
            out[x] = (y, hints[x] // hints[y])
    return out


def sym_to_value(expr, env):
    """Evaluate a sympy size expression on ints, or on 0-d tensors (true sizes inside the graph)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Rational:
        return float(expr)
    if expr.is_Symbol:
        return env[expr]
    args = [sym_to_value(a, env) for a in expr.args]
    name = type(expr).__name__
    if expr.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if expr.is_Pow:
        return args[0] ** args[1]
    if name == "FloorDiv":
        return args[0] // args[1]
    if name in ("Mod", "PythonMod"):
        return args[0] % args[1]
    if name in ("Max", "Min"):
        if not any(isinstance(a, torch.Tensor) for a in args):
            return max(args) if name == "Max" else min(args)
        pick = torch.maximum if name == "Max" else torch.minimum
        out = torch.as_tensor(args[0])
        for a in args[1:]:
            out = pick(out, torch.as_tensor(a))  # true sizes are 0-d tensors: no Python comparison
        return out
    if name in ("CeilDiv", "CeilDivision"):
        return -((-args[0]) // args[1])
    if name in ("IntTrueDiv", "FloatTrueDiv"):  # sizes divided as values (batch norm's 1 / count)
        return args[0] / args[1]
    if name in ("ToFloat", "Identity"):
        return args[0] * 1.0 if name == "ToFloat" else args[0]
    if name in ("PowByNatural", "FloatPow"):
        return args[0] ** args[1]
    if name in ("CleanDiv", "IntFloorDiv"):
        return args[0] // args[1]
    if name == "TruncToInt":
        return args[0].trunc().long() if isinstance(args[0], torch.Tensor) else int(args[0])
    raise NotBucketable(f"cannot evaluate size expression {expr}")
