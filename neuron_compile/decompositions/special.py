"""Special functions as elementwise ATen ops: ATen's own algorithms, evaluated with torch ops.

torch-mlir lowers none of torch.special's Bessel functions, ndtri, erfcx,
log_ndtr, airy_ai, nor aten.erfc; torch's own references for them call prims
that do not lower either. ATen computes them with Cephes' Chebyshev and
rational approximations (ATen/native/Math.h); the same coefficients
(``_cephes.py``, extracted from Math.h) and the same branches are evaluated
here with ``where`` selecting each element's branch, in the input's float
precision as eager does (half types in float32).

erfc, erfcx and log_ndtr are not Cephes in ATen (erfcx is Faddeeva's
100-piece Chebyshev table): here erfc(x) = 1 - erf(x) in float64 where that
keeps float32's relative precision (x < 3), and a continued fraction for
erfcx(x) = exp(x^2) erfc(x) beyond, both checked against eager in the tests.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import register_decomposition

from ._cephes import CEPHES

aten = torch.ops.aten

SPECIAL: dict = {}


def _special(op):
    return register_decomposition(op, registry=SPECIAL)


def _compute_dtype(x: torch.Tensor):
    if x.dtype in (torch.float16, torch.bfloat16) or not x.dtype.is_floating_point:
        return torch.float32
    return x.dtype


def _unary(fn):
    """Evaluate fn in the compute dtype; the result in eager's dtype (floats keep theirs, integers float32)."""
    def decomposition(x):
        if x.dtype.is_complex:
            return NotImplemented
        out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
        x = x.to(_compute_dtype(x))
        out = fn(x)
        return torch.where(torch.isnan(x), x, out.to(x.dtype)).to(out_dtype)  # NaN in, NaN out
    return decomposition


def _chbevl(x, coeffs):
    b0, b1, b2 = torch.full_like(x, coeffs[0]), torch.zeros_like(x), torch.zeros_like(x)
    for c in coeffs[1:]:
        b2 = b1
        b1 = b0
        b0 = x * b1 - b2 + c
    return 0.5 * (b0 - b2)


def _polevl(x, coeffs):
    ans = torch.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        ans = ans * x + c
    return ans


def _safe(x, ok, fill=1.0):
    """x where ok, else a harmless value (keeps the branch that is not taken finite)."""
    return torch.where(ok, x, fill)


# --------------------------------------------------------------------------- modified Bessel


_I0 = CEPHES["modified_bessel_i0_forward"]
_I1 = CEPHES["modified_bessel_i1_forward"]
_K0 = CEPHES["modified_bessel_k0_forward"]
_K1 = CEPHES["modified_bessel_k1_forward"]


def _i0e(x):
    ax = x.abs()
    small = ax <= 8
    far = _safe(ax, ~small, 16.0)
    return torch.where(small, _chbevl(ax / 2 - 2, _I0["A"]), _chbevl(32 / far - 2, _I0["B"]) / far.sqrt())


def _i1e(x):
    ax = x.abs()
    small = ax <= 8
    far = _safe(ax, ~small, 16.0)
    out = torch.where(small, _chbevl(ax / 2 - 2, _I1["A"]) * ax, _chbevl(32 / far - 2, _I1["B"]) / far.sqrt())
    return torch.where(x < 0, -out, out)


def _i0(x):
    return x.abs().exp() * _i0e(x)


def _i1(x):
    return x.abs().exp() * _i1e(x)


def _k_common(x, small_value, large_scaled, scaled):
    """k0/k1 (scaled: times exp(x)) with eager's x == 0 -> inf and x < 0 -> NaN."""
    small = x <= 2
    near = _safe(x, small & (x > 0), 1.0)
    far = _safe(x, ~small, 4.0)
    low = small_value(near)
    high = large_scaled(far)
    if scaled:
        low = low * near.exp()
    else:
        high = high * (-far).exp()
    out = torch.where(small, low, high)
    out = torch.where(x == 0, math.inf, out)
    return torch.where(x < 0, math.nan, out)


def _k0(x, scaled=False):
    return _k_common(x, lambda t: _chbevl(t * t - 2, _K0["A"]) - (0.5 * t).log() * _i0(t),
                     lambda t: _chbevl(8 / t - 2, _K0["B"]) / t.sqrt(), scaled)


def _k1(x, scaled=False):
    return _k_common(x, lambda t: (0.5 * t).log() * _i1(t) + _chbevl(t * t - 2, _K1["A"]) / t,
                     lambda t: _chbevl(8 / t - 2, _K1["B"]) / t.sqrt(), scaled)


for _op, _fn in ((aten.i0, _i0), (aten.special_i0e, _i0e), (aten.special_i1, _i1), (aten.special_i1e, _i1e),
                 (aten.special_modified_bessel_i0, _i0), (aten.special_modified_bessel_i1, _i1),
                 (aten.special_modified_bessel_k0, _k0), (aten.special_modified_bessel_k1, _k1),
                 (aten.special_scaled_modified_bessel_k0, lambda x: _k0(x, True)),
                 (aten.special_scaled_modified_bessel_k1, lambda x: _k1(x, True))):
    _special(_op)(_unary(_fn))


# --------------------------------------------------------------------------- Bessel of the first and second kind


_J0 = CEPHES["bessel_j0_forward"]
_J1 = CEPHES["bessel_j1_forward"]
_Y0 = CEPHES["bessel_y0_forward"]
_Y1 = CEPHES["bessel_y1_forward"]
_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_PIO4 = 0.785398163397448309615660845819875721
_3PIO4 = 2.356194490192344928846982537459627163
_2_OVER_PI = 0.636619772367581343075535053490057448


def _asymptotic(x, table, phase, cos_first, w):
    """Cephes' x > 5 form: (P cos(x - phase) -/+ 5/x Q sin(x - phase)) sqrt(2/(pi x))."""
    p = _polevl(w, table["PP"]) / _polevl(w, table["PQ"])
    q = _polevl(w, table["QP"]) / _polevl(w, table["QQ"])
    if cos_first:  # j: p cos - 5/x q sin
        value = p * torch.cos(x - phase) - 5 / x * q * torch.sin(x - phase)
    else:  # y: p sin + 5/x q cos
        value = p * torch.sin(x - phase) + 5 / x * q * torch.cos(x - phase)
    return value * _SQRT_2_OVER_PI / x.sqrt()


def _j0(x):
    x = x.abs()
    small = x <= 5
    far = _safe(x, ~small, 10.0)
    z = x * x
    near = (z - 5.78318596294678452118e+00) * (z - 3.04712623436620863991e+01) * _polevl(z, _J0["RP"]) \
        / _polevl(z, _J0["RQ"])
    near = torch.where(x < 0.00001, 1 - z / 4, near)
    return torch.where(small, near, _asymptotic(far, _J0, _PIO4, True, 25 / (far * far)))


def _j1(x):
    sign = torch.where(x < 0, -1.0, 1.0).to(x.dtype)
    x = x.abs()
    small = x <= 5
    far = _safe(x, ~small, 10.0)
    z = x * x
    near = _polevl(z, _J1["RP"]) / _polevl(z, _J1["RQ"]) * x * (z - 1.46819706421238932572e+01) \
        * (z - 4.92184563216946036703e+01)
    return sign * torch.where(small, near, _asymptotic(far, _J1, _3PIO4, True, (5 / far) * (5 / far)))


def _y0(x):
    small = x <= 5
    near_x = _safe(x, small & (x > 0), 1.0)
    far = _safe(x, ~small, 10.0)
    z = near_x * near_x
    near = _polevl(z, _Y0["YP"]) / _polevl(z, _Y0["YQ"]) + _2_OVER_PI * near_x.log() * _j0(near_x)
    near = torch.where(x == 0, -math.inf, torch.where(x < 0, math.nan, near))
    return torch.where(small, near, _asymptotic(far, _Y0, _PIO4, False, 25 / (far * far)))


def _y1(x):
    small = x <= 5
    near_x = _safe(x, small & (x > 0), 1.0)
    far = _safe(x, ~small, 10.0)
    z = near_x * near_x
    near = near_x * (_polevl(z, _Y1["YP"]) / _polevl(z, _Y1["YQ"])) \
        + _2_OVER_PI * (_j1(near_x) * near_x.log() - 1 / near_x)
    near = torch.where(x == 0, -math.inf, torch.where(x < 0, math.nan, near))
    return torch.where(small, near, _asymptotic(far, _Y1, _3PIO4, False, (5 / far) * (5 / far)))


def _spherical_j0(x):
    z = x * x
    series = 1 + z * (-1 / 6 + z * (1 / 120 + z * (-1 / 5040 + z * (1 / 362880 + z * (-1 / 39916800
                                                                                       + z * (1 / 6227020800))))))
    far = _safe(x, x.abs() >= 0.5, 1.0)
    out = torch.where(x.abs() < 0.5, series, torch.sin(far) / far)
    return torch.where(torch.isinf(x), 0.0, out)


for _op, _fn in ((aten.special_bessel_j0, _j0), (aten.special_bessel_j1, _j1), (aten.special_bessel_y0, _y0),
                 (aten.special_bessel_y1, _y1), (aten.special_spherical_bessel_j0, _spherical_j0)):
    _special(_op)(_unary(_fn))


# --------------------------------------------------------------------------- Airy Ai


_AIRY = CEPHES["airy_ai_forward"]


def _airy_ai(x):
    # x < -2.09: the oscillating asymptotic form
    neg = _safe(x, x < -2.09, -4.0)
    zeta_neg = -2.0 * neg * (-neg).sqrt() / 3.0
    z = 1.0 / zeta_neg
    zz = z * z
    t = zeta_neg + 0.25 * math.pi
    left = 5.64189583547756286948e-01 / (-neg).sqrt().sqrt() * (
        torch.sin(t) * (1.0 + zz * _polevl(zz, _AIRY["AFN"]) / _polevl(zz, _AIRY["AFD"]))
        - torch.cos(t) * (z * _polevl(zz, _AIRY["AGN"]) / _polevl(zz, _AIRY["AGD"])))
    # x >= 2.09: the decaying asymptotic form
    pos = _safe(x, x >= 2.09, 4.0)
    zeta = 2.0 * pos * pos.sqrt() / 3.0
    right = 5.64189583547756286948e-01 * (_polevl(1.0 / zeta, _AIRY["AN"]) / _polevl(1.0 / zeta, _AIRY["AD"])) \
        / (2.0 * pos.sqrt().sqrt() * zeta.exp())
    # between: the power series (ATen iterates to float epsilon; 40 terms converge for |x| < 2.09)
    mid = _safe(x, (x >= -2.09) & (x < 2.09), 0.0)
    cube = mid * mid * mid
    f, g, m, n = torch.ones_like(mid), mid, torch.ones_like(mid), mid
    k = 1.0
    for _ in range(40):
        m = m * cube
        k += 1.0
        m = m / k
        n = n * cube
        k += 1.0
        n = n / k
        m = m / k
        f = f + m
        k += 1.0
        n = n / k
        g = g + n
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = torch.where(x < -2.09, left, torch.where(x >= 2.09, right, series))
    out = torch.where(x > 103.892, 0.0, out)
    return torch.where(torch.isinf(x), math.nan, out)


_special(aten.special_airy_ai)(_unary(_airy_ai))


# --------------------------------------------------------------------------- ndtri


_NDTRI = CEPHES["calc_ndtri"]
_EXP_M2 = 0.13533528323661269189


def _ndtri(y0):
    flip = y0 > 1 - _EXP_M2
    y = torch.where(flip, 1 - y0, y0)
    # central: |y - 0.5| <= 3/8
    c = y - 0.5
    c2 = c * c
    central = (c + c * (c2 * _polevl(c2, _NDTRI["P0"]) / _polevl(c2, _NDTRI["Q0"]))) * 2.50662827463100050242
    # tails
    ty = _safe(y, (y > 0) & (y <= _EXP_M2), _EXP_M2)
    x = torch.sqrt(-2.0 * ty.log())
    x0 = x - x.log() / x
    z = 1.0 / x
    x1 = torch.where(x < 8.0, z * _polevl(z, _NDTRI["P1"]) / _polevl(z, _NDTRI["Q1"]),
                     z * _polevl(z, _NDTRI["P2"]) / _polevl(z, _NDTRI["Q2"]))
    tail = x0 - x1
    tail = torch.where(flip, tail, -tail)
    out = torch.where(y > _EXP_M2, central, tail)
    out = torch.where(y0 == 0, -math.inf, torch.where(y0 == 1, math.inf, out))
    return torch.where((y0 < 0) | (y0 > 1), math.nan, out)


_special(aten.special_ndtri)(_unary(_ndtri))


def _erfinv(y):
    # ATen's calc_erfinv (Math.h): a rational first guess (central below |y| = 0.7, tail
    # above), then two Newton steps on erf; |y| = 1 is +-inf, |y| > 1 NaN.
    a = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
    b = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
    c = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
    d = (3.543889200, 1.637067800)
    y_abs = y.abs()
    z = y * y
    num = ((a[3] * z + a[2]) * z + a[1]) * z + a[0]
    dem = (((b[3] * z + b[2]) * z + b[1]) * z + b[0]) * z + 1.0
    central = y * num / dem
    t = torch.sqrt(-torch.log((1.0 - torch.clamp(y_abs, max=1.0)) / 2.0))
    num = ((c[3] * t + c[2]) * t + c[1]) * t + c[0]
    dem = (d[1] * t + d[0]) * t + 1.0
    tail = torch.copysign(num, y) / dem
    x = torch.where(y_abs <= 0.7, central, tail)
    for _ in range(2):
        x = x - (torch.erf(x) - y) / ((2.0 / math.sqrt(math.pi)) * torch.exp(-x * x))
    x = torch.where(y_abs == 1.0, torch.copysign(torch.full_like(y, math.inf), y), x)
    return torch.where(y_abs > 1.0, torch.full_like(y, math.nan), x)


_special(aten.erfinv)(_unary(lambda y: _erfinv(y.to(torch.float64)).to(y.dtype)))  # float64: Newton near +-1 cancels


# --------------------------------------------------------------------------- erfc, erfcx, log_ndtr


_CF_SWITCH = 3.0  # below: 1 - erf in float64; above: the continued fraction
_CF_DEPTH = 40
_SQRT_PI = math.sqrt(math.pi)


def _erfcx_positive(x):
    """erfcx for x >= 0 in float64: exp(x^2) (1 - erf(x)) below the switch, Laplace's continued fraction above."""
    near = _safe(x, x < _CF_SWITCH, 0.0)
    low = torch.exp(near * near) * (1.0 - torch.erf(near))
    far = _safe(x, x >= _CF_SWITCH, _CF_SWITCH)
    frac = far
    for k in range(_CF_DEPTH, 0, -1):  # x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))
        frac = far + (k / 2.0) / frac
    high = 1.0 / (_SQRT_PI * frac)
    return torch.where(x < _CF_SWITCH, low, high)


def _erfcx64(x):
    x = x.to(torch.float64)
    pos = _erfcx_positive(x.abs())
    neg = 2.0 * torch.exp(x * x) - pos  # erfcx(-a) = 2 exp(a^2) - erfcx(a)
    out = torch.where(x < 0, neg, pos)
    out = torch.where(x < -26.7, math.inf, out)
    return torch.where(torch.isnan(x), x, out)


def _erfc64(x):
    x = x.to(torch.float64)
    a = x.abs()
    far = _safe(a, a >= _CF_SWITCH, _CF_SWITCH)
    positive = torch.where(a < _CF_SWITCH, 1.0 - torch.erf(a), torch.exp(-far * far) * _erfcx_positive(far))
    return torch.where(x < 0, 2.0 - positive, positive)


def _log_ndtr(x):
    x64 = x.to(torch.float64)
    t = x64 * (1 / math.sqrt(2.0))
    low = torch.log(_erfcx64(-t) / 2) - t * t
    high = torch.log1p(-_erfc64(t) / 2)
    return torch.where(x64 < -1.0, low, high)


def _in_dtype(fn):
    def evaluate(x):
        return fn(x).to(x.dtype)
    return evaluate


_special(aten.special_erfcx)(_unary(_in_dtype(_erfcx64)))
_special(aten.erfc)(_unary(_in_dtype(_erfc64)))
_special(aten.special_log_ndtr)(_unary(_in_dtype(_log_ndtr)))


# --------------------------------------------------------------------------- Chebyshev polynomials


def _chebyshev(kind: str, y, n):
    """T, U, V or W of degree trunc(n) at y, following ATen's branches.

    ATen runs the three-term recurrence for small degrees (n <= 6 for T, 8 for
    U, V, W) and for |y| > 1 at any degree, and the trigonometric closed form for
    larger degrees inside [-1, 1]. The degree is a tensor whose values the graph
    does not know, so the recurrence is unrolled to the threshold and larger
    degrees use the closed form inside [-1, 1] (as ATen) and its hyperbolic
    counterpart outside (where ATen keeps recurring: equal up to rounding).
    """
    limit = 6 if kind == "t" else 8
    n = torch.trunc(n)
    two_y = y + y
    prev = torch.ones_like(y)
    cur = {"t": y, "u": two_y, "v": two_y - 1, "w": two_y + 1}[kind]
    small = torch.where(n == 0, prev, torch.where(n == 1, cur, 0.0))
    for k in range(2, limit + 1):
        prev, cur = cur, two_y * cur - prev
        small = torch.where(n == k, cur, small)
    parity = 1 - 2 * torch.remainder(n, 2)  # (-1)^n
    inside_y = _safe(y, y.abs() < 1, 0.5)
    theta = torch.acos(inside_y)
    outside_a = _safe(y.abs(), y.abs() > 1, 2.0)
    t = torch.acosh(outside_a)
    if kind == "t":
        inside = torch.cos(n * theta)
        outside = torch.cosh(n * t) * torch.where(y < 0, parity, 1.0)
        at_one = torch.where(y > 0, 1.0, parity)
    elif kind == "u":
        inside = torch.sin((n + 1) * theta) / torch.sin(theta)
        outside = torch.sinh((n + 1) * t) / torch.sinh(t) * torch.where(y < 0, parity, 1.0)
        at_one = (n + 1) * torch.where(y > 0, 1.0, parity)
    else:
        v_out = torch.cosh((n + 0.5) * t) / torch.cosh(t / 2)
        w_out = torch.sinh((n + 0.5) * t) / torch.sinh(t / 2)
        if kind == "v":
            inside = torch.cos((n + 0.5) * theta) / torch.cos(theta / 2)
            outside = torch.where(y < 0, parity * w_out, v_out)  # V_n(-a) = (-1)^n W_n(a)
            at_one = torch.where(y > 0, 1.0, parity * (2 * n + 1))
        else:
            inside = torch.sin((n + 0.5) * theta) / torch.sin(theta / 2)
            outside = torch.where(y < 0, parity * v_out, w_out)
            at_one = torch.where(y > 0, 2 * n + 1, parity)
    large = torch.where(y.abs() < 1, inside, outside)
    out = torch.where(n <= limit, small, large)
    out = torch.where(y.abs() == 1, at_one, out)
    out = torch.where(torch.isnan(y) & (n >= 1), y, out)  # the recurrence carries NaN (degree 0 is 1)
    return torch.where(n < 0, 0.0, out)


def _polynomial(kind: str, shifted: bool):
    def decomposition(x, n):
        if not isinstance(x, torch.Tensor):
            x = torch.scalar_tensor(x, dtype=torch.result_type(n, x), device=n.device)
        if not isinstance(n, torch.Tensor):
            n = torch.scalar_tensor(n, dtype=torch.result_type(x, n), device=x.device)
        dtype = torch.result_type(x, n)
        if dtype.is_complex or not dtype.is_floating_point:
            return NotImplemented
        compute = _compute_dtype(torch.empty(0, dtype=dtype))
        x, n = x.to(compute), n.to(compute)
        y = x + x - 1 if shifted else x
        return _chebyshev(kind, y, n).to(dtype)
    return decomposition


for _kind in "tuvw":
    _special(getattr(aten, f"special_chebyshev_polynomial_{_kind}"))(_polynomial(_kind, False))
    _special(getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}"))(_polynomial(_kind, True))
