"""Property tests (hypothesis) for pad-to-multiple: the size arithmetic, the
profitability rule, and pad-then-slice round trips of dot_general run on XLA
with integer data, where padding must be bit-exact."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "passes"))

from pass_models import run_xla  # noqa: E402

from neuron_compile.passes import parse_pipeline  # noqa: E402
from neuron_compile.passes.pad_to_multiple import PadPlan, padded_length, padded_shape, should_pad  # noqa: E402

sizes = st.integers(min_value=0, max_value=10_000)
multiples = st.integers(min_value=1, max_value=512)


@given(sizes, multiples)
def test_padded_length_is_the_least_multiple_not_below(n, m):
    p = padded_length(n, m)
    assert p % m == 0 and n <= p < n + m
    assert padded_length(p, m) == p  # idempotent
    assert p == math.ceil(n / m) * m


@given(st.lists(st.integers(1, 300), min_size=1, max_size=4), multiples, st.data())
def test_padded_shape_pads_only_the_named_dims(dims, m, data):
    chosen = data.draw(st.sets(st.integers(0, len(dims) - 1)))
    out = padded_shape(dims, chosen, m)
    for i, (d, o) in enumerate(zip(dims, out)):
        assert o == (padded_length(d, m) if i in chosen else d)


@given(st.integers(1, 10**6), st.integers(0, 10**6), st.floats(1.0, 100.0))
def test_should_pad_is_the_work_ratio_rule(work, extra, max_ratio):
    plan = PadPlan("dot_general", (1,), (1,), (1,), (1,), work, work + extra)
    assert should_pad(plan, max_ratio) == (extra > 0 and (work + extra) / work <= max_ratio)
    assert should_pad(plan, math.inf) == (extra > 0)


def dot_module(batch, m, k, n):
    b = [batch] if batch else []
    dims = "batching_dims = [0] x [0], " if batch else ""
    lc, rc = len(b) + 1, len(b)
    t = lambda *s: "tensor<" + "x".join(map(str, (*b, *s))) + "xi32>"  # noqa: E731
    return f"""
func.func @main(%a: {t(m, k)}, %b: {t(k, n)}) -> {t(m, n)} {{
  %0 = stablehlo.dot_general %a, %b, {dims}contracting_dims = [{lc}] x [{rc}] : ({t(m, k)}, {t(k, n)}) -> {t(m, n)}
  return %0 : {t(m, n)}
}}"""


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(0, 3),
    m=st.integers(1, 40),
    k=st.integers(1, 40),
    n=st.integers(1, 40),
    multiple=st.sampled_from([1, 3, 8, 16, 32]),
    free=st.sampled_from(["lhs", "both"]),
    seed=st.integers(0, 2**16),
)
def test_pad_then_slice_round_trip_is_exact(batch, m, k, n, multiple, free, seed):
    text = dot_module(batch, m, k, n)
    out, stats = parse_pipeline(f"pad-to-multiple{{multiple={multiple},max-ratio=inf,free-dims={free}}}").run_on_text(
        text, verify_each=True
    )
    changed = padded_length(k, multiple) != k or padded_length(m, multiple) != m or (
        free == "both" and padded_length(n, multiple) != n
    )
    assert stats[0].fired == int(changed)
    rng = np.random.default_rng(seed)
    b = (batch,) if batch else ()
    a = rng.integers(-50, 50, size=(*b, m, k), dtype=np.int32)
    w = rng.integers(-50, 50, size=(*b, k, n), dtype=np.int32)
    got = run_xla(out, [a, w])[0]
    np.testing.assert_array_equal(got, np.matmul(a, w))


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 30), n=st.integers(1, 30), j=st.integers(1, 30))
def test_chain_stays_padded_and_exact(m, k, n, j):
    text = f"""
func.func @main(%a: tensor<{m}x{k}xi32>, %b: tensor<{k}x{n}xi32>, %c: tensor<{n}x{j}xi32>) -> tensor<{m}x{j}xi32> {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{m}x{k}xi32>, tensor<{k}x{n}xi32>) -> tensor<{m}x{n}xi32>
  %1 = stablehlo.dot_general %0, %c, contracting_dims = [1] x [0] : (tensor<{m}x{n}xi32>, tensor<{n}x{j}xi32>) -> tensor<{m}x{j}xi32>
  return %1 : tensor<{m}x{j}xi32>
}}"""
    out, stats = parse_pipeline("pad-to-multiple{multiple=16,max-ratio=inf,free-dims=both}").run_on_text(text)
    if (m % 16, k % 16, n % 16) != (0, 0, 0) or j % 16:
        # at most one slice survives: the final one (none inside the chain)
        assert out.count("stablehlo.slice") <= 1
    rng = np.random.default_rng(m * 1000 + n)
    a, b, c = (rng.integers(-9, 9, size=s, dtype=np.int32) for s in [(m, k), (k, n), (n, j)])
    np.testing.assert_array_equal(run_xla(out, [a, b, c])[0], a @ b @ c)
