"""Special functions (neuron_compile/decompositions/special.py), compiled, against eager.

One graph evaluates every function on a grid that crosses each branch point of
ATen's approximations (|x| = 0.5, 2, 2.09, 5, 8, the continued fraction's switch
at 3) plus 0, +-inf and NaN.
"""

import torch

S = torch.special
FUNCTIONS = {
    "i0": torch.i0, "i0e": S.i0e, "i1": S.i1, "i1e": S.i1e,
    "modified_bessel_i0": S.modified_bessel_i0, "modified_bessel_i1": S.modified_bessel_i1,
    "modified_bessel_k0": S.modified_bessel_k0, "modified_bessel_k1": S.modified_bessel_k1,
    "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0, "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
    "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1, "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1,
    "spherical_bessel_j0": S.spherical_bessel_j0, "airy_ai": S.airy_ai,
    "erfc": torch.erfc, "erfcx": S.erfcx, "log_ndtr": S.log_ndtr,
}


def _grid():
    edges = torch.tensor([0.0, -0.0, 0.5, 2.0, 2.09, 3.0, 5.0, 8.0, 26.7, 104.0, 1e-6, float("inf"), float("nan")])
    return torch.cat([torch.linspace(-30, 30, 1201), edges, -edges])


def test_special_functions_match_eager():
    x = _grid()

    def fn(x):
        return {name: f(x) for name, f in FUNCTIONS.items()}

    got = torch.compile(fn, backend="neuron", fullgraph=True)(x)
    ref = fn(x)
    for name in FUNCTIONS:
        # airy_ai oscillates at x << 0 where float32's sin of a large phase differs by ~1e-6 absolute
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)


def test_ndtri_matches_eager():
    p = torch.cat([torch.linspace(0, 1, 1001), torch.tensor([1e-30, 1e-20, 1e-10, 1 - 1e-7, 0.135, 0.865, -0.1, 1.1,
                                                           float("nan")])])
    got = torch.compile(S.ndtri, backend="neuron", fullgraph=True)(p)
    torch.testing.assert_close(got, S.ndtri(p), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_integer_and_bfloat16_inputs_keep_eagers_dtype():
    def fn(i, h):
        return S.i0e(i), S.i1e(h), torch.erfc(h)

    i = torch.arange(-5, 6)
    h = torch.linspace(-4, 4, 33).to(torch.bfloat16)
    got = torch.compile(fn, backend="neuron", fullgraph=True)(i, h)
    ref = fn(i, h)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=1.6e-2, atol=1e-2)


def test_chebyshev_polynomials_match_eager():
    # degrees below, at and above ATen's recurrence thresholds (6 for T, 8 for U, V, W),
    # negative and fractional degrees (truncated), x inside, on and outside [-1, 1], NaN
    x = torch.cat([torch.linspace(-3, 3, 61), torch.tensor([1.0, -1.0, 0.0, 0.5, float("nan")])])
    grid_x, grid_n = torch.meshgrid(x, torch.arange(-2.0, 20.0) + 0.3, indexing="ij")
    names = [f"{shift}chebyshev_polynomial_{kind}" for kind in "tuvw" for shift in ("", "shifted_")]

    def fn(x, n):
        return {name: getattr(S, name)(x, n) for name in names}

    got = torch.compile(fn, backend="neuron", fullgraph=True)(grid_x, grid_n)
    ref = fn(grid_x, grid_n)
    for name in names:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-4, equal_nan=True, msg=name)
