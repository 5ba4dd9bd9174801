"""Log-gamma and its derivatives: lgamma, digamma, polygamma (trigamma), as ATen computes them.

torch-mlir lowers none of them. Each follows ATen's algorithm in the input's
precision: Lanczos' series for lgamma with the reflection formula below 1/2,
the asymptotic series (Bernoulli numbers) with recurrence for digamma, and
for polygamma of order n the Hurwitz zeta series, with the n-th derivative
of the cotangent for the reflection (``_cot_derivative``); poles give eager's
inf or NaN. They register into the core ``_ours`` registry.
"""

from __future__ import annotations

import math

import torch

from .core import _ours

aten = torch.ops.aten


_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)


def _lgamma_positive(z: torch.Tensor) -> torch.Tensor:
    """log Gamma(z) for z >= 0.5 by Lanczos (g=7, 9 terms)."""
    z = aten.sub.Tensor(z, 1)
    series = aten.full_like.default(z, _LANCZOS[0])
    for k, c in enumerate(_LANCZOS[1:], start=1):
        series = aten.add.Tensor(series, aten.div.Tensor(aten.full_like.default(z, c), aten.add.Tensor(z, k)))
    t = aten.add.Tensor(z, 7.5)
    half_log_2pi = 0.9189385332046727
    return aten.add.Tensor(aten.add.Tensor(aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(z, 0.5), aten.log.default(t)), t),
                                           half_log_2pi), aten.log.default(series))


@_ours(aten.lgamma)
def _lgamma(x: torch.Tensor):
    # torch-mlir does not lower aten.lgamma (OpInfo lgamma, mvlgamma; Poisson/Gamma losses).
    # Lanczos for x >= 0.5, the reflection log(pi / |sin(pi x)|) - lgamma(1 - x) below.
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    work = aten._to_copy.default(x, dtype=torch.float64) if x.dtype != torch.float64 else x
    small = aten.lt.Scalar(work, 0.5)
    safe = aten.where.self(small, aten.rsub.Scalar(work, 1), work)
    positive = _lgamma_positive(safe)
    sin = aten.abs.default(aten.sin.default(aten.mul.Tensor(work, math.pi)))
    reflected = aten.sub.Tensor(aten.log.default(aten.div.Tensor(aten.full_like.default(sin, math.pi), sin)), positive)
    out = aten.where.self(small, reflected, positive)
    # the poles at 0, -1, -2...: sin(pi x) is not exactly 0 there in floating point
    out = aten.where.self(_non_positive_integer(work), aten.full_like.default(out, float("inf")), out)
    return aten._to_copy.default(out, dtype=x.dtype)


def _non_positive_integer(x: torch.Tensor) -> torch.Tensor:
    return aten.logical_and.default(aten.le.Scalar(x, 0), aten.eq.Tensor(x, aten.floor.default(x)))


def _digamma_positive(z: torch.Tensor) -> torch.Tensor:
    """psi(z) for z > 0: ten recurrence steps, then the asymptotic series."""
    shift = aten.zeros_like.default(z)
    for k in range(10):
        shift = aten.add.Tensor(shift, aten.reciprocal.default(aten.add.Tensor(z, k)))
    w = aten.add.Tensor(z, 10)
    inv2 = aten.reciprocal.default(aten.mul.Tensor(w, w))
    series = aten.sub.Tensor(aten.log.default(w), aten.div.Tensor(aten.full_like.default(w, 0.5), w))
    power = inv2
    for j, b in enumerate(_BERNOULLI, start=1):
        series = aten.sub.Tensor(series, aten.mul.Tensor(power, b / (2 * j)))
        power = aten.mul.Tensor(power, inv2)
    return aten.sub.Tensor(series, shift)


@_ours(aten.digamma)
def _digamma(x: torch.Tensor):
    # torch-mlir does not lower aten.digamma (OpInfo digamma, polygamma_n_0, lgamma's
    # backward). Reflection psi(1 - x) - pi / tan(pi x) below 0.5.
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    work = aten._to_copy.default(x, dtype=torch.float64)
    small = aten.lt.Scalar(work, 0.5)
    positive = _digamma_positive(aten.where.self(small, aten.rsub.Scalar(work, 1), work))
    cot = aten.div.Tensor(aten.full_like.default(work, math.pi), aten.tan.default(aten.mul.Tensor(work, math.pi)))
    out = aten.where.self(small, aten.sub.Tensor(positive, cot), positive)
    # ATen: -inf at 0 (the reflection gives it), NaN at the negative integers (poles of either sign)
    pole = aten.logical_and.default(_non_positive_integer(work), aten.lt.Scalar(work, 0))
    out = aten.where.self(pole, aten.full_like.default(out, float("nan")), out)
    return aten._to_copy.default(out, dtype=x.dtype)


_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66)  # B2, B4, ..., B10


@_ours(aten.polygamma)
def _polygamma(n: int, x: torch.Tensor):
    # torch-mlir does not lower aten.polygamma (OpInfo polygamma_n_*): n = 0 is digamma;
    # n >= 1 is (-1)^(n+1) n! zeta(n+1, x), summed directly over ten shifts and by
    # Euler-Maclaurin beyond (for x > 0; poles and negative x are left to the formula).
    # Negative x: the reflection formula, psi_n(x) = (-1)^n psi_n(1 - x) - pi d^n/dx^n cot(pi x),
    # the Hurwitz zeta series' value that ATen's Cephes zeta sums (the Euler-Maclaurin tail at
    # x + 10 alone was 0.1% off below -5); nonpositive integers are ATen's +-inf.
    if n == 0:
        return aten.digamma.default(x)
    if not x.dtype.is_floating_point:
        x = aten._to_copy.default(x, dtype=torch.get_default_dtype())
    if n == 1:
        return _trigamma(x)
    z = aten._to_copy.default(x, dtype=torch.float64)
    negative = aten.lt.Scalar(z, 0)
    pole = aten.logical_and.default(aten.le.Scalar(z, 0), aten.eq.Tensor(z, aten.floor.default(z)))
    z = aten.where.self(negative, aten.rsub.Scalar(z, 1), z)
    s = n + 1
    total = aten.zeros_like.default(z)
    for k in range(10):
        total = aten.add.Tensor(total, aten.pow.Tensor_Scalar(aten.add.Tensor(z, k), -s))
    w = aten.add.Tensor(z, 10)
    tail = aten.add.Tensor(aten.div.Tensor(aten.pow.Tensor_Scalar(w, 1 - s), s - 1),
                           aten.mul.Tensor(aten.pow.Tensor_Scalar(w, -s), 0.5))
    rising = float(s)  # s (s+1) ... (s+2j-2)
    for j, b in enumerate(_BERNOULLI, start=1):
        term = b / math.factorial(2 * j) * rising
        tail = aten.add.Tensor(tail, aten.mul.Tensor(aten.pow.Tensor_Scalar(w, -s - 2 * j + 1), term))
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    zeta = aten.add.Tensor(total, tail)
    out = aten.mul.Tensor(zeta, (-1) ** (n + 1) * math.factorial(n))
    cot = aten.reciprocal.default(aten.tan.default(aten.mul.Tensor(aten._to_copy.default(x, dtype=torch.float64),
                                                                   math.pi)))
    derivative = aten.zeros_like.default(cot)
    for power, coeff in enumerate(_cot_derivative(n)):
        if coeff:
            derivative = aten.add.Tensor(derivative, aten.mul.Tensor(aten.pow.Tensor_Scalar(cot, power), coeff))
    reflected = aten.sub.Tensor(aten.mul.Tensor(out, (-1) ** n), aten.mul.Tensor(derivative, math.pi))
    out = aten.where.self(negative, reflected, out)
    out = aten.where.self(pole, aten.full_like.default(out, (-1) ** (n + 1) * math.inf), out)
    out = aten.where.self(aten.eq.Scalar(x, math.inf), aten.full_like.default(out, math.nan), out)  # as Cephes
    return aten._to_copy.default(out, dtype=x.dtype)


def _cot_derivative(n: int) -> list:
    """Coefficients in c = cot(pi x) of d^n/dx^n cot(pi x) (d/dx c = -pi (1 + c^2))."""
    poly = [0.0, 1.0]
    for _ in range(n):
        deriv = [k * poly[k] for k in range(1, len(poly))] + [0.0]  # P'(c)
        nxt = [0.0] * (len(deriv) + 2)
        for k, a in enumerate(deriv):
            nxt[k] -= math.pi * a
            nxt[k + 2] -= math.pi * a
        poly = nxt
    return poly


def _trigamma(x: torch.Tensor):
    # ATen's calc_trigamma (Math.h), step for step in x's precision: reflection below 1/2,
    # six shifts, then the asymptotic series.
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    z = aten._to_copy.default(x, dtype=dtype)
    small = aten.lt.Scalar(z, 0.5)
    sin_pi = aten.sin.default(aten.mul.Tensor(z, math.pi))
    result = aten.where.self(small, aten.neg.default(aten.div.Tensor(aten.full_like.default(z, math.pi * math.pi),
                                                                         aten.mul.Tensor(sin_pi, sin_pi))),
                             aten.zeros_like.default(z))
    z = aten.where.self(small, aten.rsub.Scalar(z, 1), z)
    for _ in range(6):
        result = aten.add.Tensor(result, aten.reciprocal.default(aten.mul.Tensor(z, z)))
        z = aten.add.Tensor(z, 1)
    ixx = aten.reciprocal.default(aten.mul.Tensor(z, z))
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, 1.0 / 42), 1.0 / 30)
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, series), 1.0 / 6)
    series = aten.add.Tensor(aten.add.Tensor(aten.mul.Tensor(ixx, series), aten.reciprocal.default(aten.mul.Tensor(z, 2))), 1)
    result = aten.add.Tensor(result, aten.div.Tensor(series, z))
    return aten._to_copy.default(aten.where.self(small, aten.neg.default(result), result), dtype=x.dtype)
