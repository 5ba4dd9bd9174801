"""Unrolled linear algebra (neuron_compile/decompositions/linalg.py), compiled, against eager.

Each test compiles one graph with several ops in it (compiles dominate the time).
A test fails if an op stops lowering (LoweringError) or its values drift from eager's.
"""

import torch

import neuron_compile
from neuron_compile import LoweringError


def compiled(fn):
    return torch.compile(fn, backend="neuron", fullgraph=True)


def check(fn, *args, rtol=1e-4, atol=1e-4):
    ref = fn(*args)
    got = compiled(fn)(*args)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


def _well_conditioned(*shape):
    n = shape[-1]
    return torch.randn(*shape) + n * torch.eye(n) * torch.sign(torch.randn(*shape[:-2], 1, 1))


def test_lu_family_matches_eager():
    # LU pivots (getrf's: the first largest magnitude) must be eager's exactly
    a = torch.randn(2, 5, 5)
    b = torch.randn(2, 5, 3)

    def fn(a, b):
        lu, piv = torch.linalg.lu_factor(a)
        return (lu, piv, torch.linalg.lu(a[0, :3]), torch.linalg.lu(a[1, :, :4]), torch.lu_unpack(lu, piv),
                torch.linalg.lu_solve(lu, piv, b), torch.linalg.lu_solve(lu, piv, b, adjoint=True),
                torch.linalg.lu_solve(lu, piv, b.mT, left=False),
                torch.linalg.det(a), torch.linalg.slogdet(a), torch.linalg.inv_ex(a))

    check(fn, a, b)


def test_determinant_gradients_match_eager():
    """det, slogdet and logdet backward, for a row-major input and a transposed (column-major) one.
    ATen factors A^T for a row-major A and its backward solves with that LU: handing back A's own LU
    gave the transposed gradient. The factor and pivots _linalg_det returns are eager's too."""
    base = _well_conditioned(5, 5)
    for a in (base, base.mT):
        def fn(a):
            return torch.linalg.det(a) + torch.linalg.slogdet(a)[1] * 2 + torch.logdet(a @ a.mT) * 3

        got_a, ref_a = a.detach().clone().requires_grad_(True), a.detach().clone().requires_grad_(True)
        got_a = got_a if a.is_contiguous() else a.detach().mT.clone().mT.requires_grad_(True)
        ref_a = ref_a if a.is_contiguous() else a.detach().mT.clone().mT.requires_grad_(True)
        torch._dynamo.reset()
        compiled(fn)(got_a).backward()
        fn(ref_a).backward()
        assert got_a.is_contiguous() == a.is_contiguous()
        torch.testing.assert_close(got_a.grad, ref_a.grad, rtol=1e-4, atol=1e-4)
    check(lambda a: torch.ops.aten._linalg_det(a), base)


def test_solve_inverse_and_matrix_functions():
    a = _well_conditioned(3, 4, 4)
    b = torch.randn(3, 4, 2)

    def fn(a, b):
        return (torch.linalg.solve(a, b), torch.linalg.solve(a[0], b[0, :, 0]), torch.linalg.solve(a, b.mT, left=False),
                torch.linalg.inv(a), torch.inverse(a[1]), torch.linalg.matrix_power(a[2], -2),
                torch.logdet(a @ a.mT), torch.linalg.tensorsolve(a[0].reshape(2, 2, 4), b[0, :, 0].reshape(2, 2)))

    check(fn, a, b, rtol=2e-4, atol=2e-4)


def test_cholesky_and_triangular_solves():
    x = torch.randn(2, 5, 5)
    spd = x @ x.mT + torch.eye(5)
    b = torch.randn(2, 5, 3)

    def fn(spd, b):
        low = torch.linalg.cholesky(spd)
        return (low, torch.linalg.cholesky_ex(spd, upper=True), torch.cholesky(spd[0], upper=True),
                torch.cholesky_solve(b, low), torch.cholesky_solve(b, low.mT, upper=True),
                torch.cholesky_inverse(low), torch.cholesky_inverse(low.mT, upper=True),
                torch.linalg.solve_triangular(low, b, upper=False),
                torch.linalg.solve_triangular(low.mT, b.mT, upper=True, left=False),
                torch.linalg.solve_triangular(low, b, upper=False, unitriangular=True),
                torch.triangular_solve(b, spd, upper=False, transpose=True),
                torch.triangular_solve(b, spd, upper=True))

    check(fn, spd, b)


def test_qr_householder_convention():
    # R's diagonal signs and the reflectors follow LAPACK's dlarfg, so Q and R equal eager's
    def fn(tall, wide, tau):
        packed, t = torch.geqrf(tall)
        return (torch.linalg.qr(tall), torch.linalg.qr(wide), torch.linalg.qr(tall, mode="complete"),
                torch.linalg.qr(tall, mode="r")[1], packed, t, torch.linalg.householder_product(tall, tau),
                torch.linalg.householder_product(packed, t))

    check(fn, torch.randn(2, 6, 4), torch.randn(3, 5), torch.randn(2, 4))


def test_empty_matrices():
    def fn(a, b, c):
        return (torch.linalg.det(a), torch.linalg.slogdet(a), torch.linalg.inv(a), torch.linalg.cholesky_ex(a),
                torch.linalg.lu(b), torch.linalg.qr(b), torch.linalg.solve(c, c[..., 0]), torch.logdet(a))

    check(fn, torch.randn(0, 0), torch.randn(5, 0), torch.randn(0, 5, 5))


def test_singular_input_gives_info_not_an_exception():
    # eager raises from _linalg_check_errors; a compiled graph cannot raise on a value, so the
    # check is dropped: inv_ex's info names the zero pivot as LAPACK's does, inv gives non-finite values
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    inverse, info = compiled(torch.linalg.inv_ex)(a)
    ref_inverse, ref_info = torch.linalg.inv_ex(a)
    assert info.item() == ref_info.item() == 3
    assert not torch.isfinite(compiled(torch.linalg.inv)(a)).all()
    chol_info = compiled(torch.linalg.cholesky_ex)(-torch.eye(3))[1]
    assert chol_info.item() == torch.linalg.cholesky_ex(-torch.eye(3))[1].item() == 1


def test_matrices_wider_than_the_unroll_limit_still_fail_loudly():
    a = torch.randn(65, 65)
    try:
        compiled(torch.linalg.det)(a)
    except Exception as exc:
        err = exc
        while err is not None and not isinstance(err, LoweringError):
            err = getattr(err, "inner_exception", None) or err.__cause__
        assert isinstance(err, LoweringError), exc
    else:
        raise AssertionError("a 65 x 65 determinant lowered: MAX_SIDE no longer guards the unrolling")


def test_ormqr_applies_geqrfs_q():
    a, c, c2 = torch.randn(2, 6, 4), torch.randn(2, 6, 3), torch.randn(2, 3, 6)
    check(lambda a, c, c2: tuple(torch.ormqr(*torch.geqrf(a), c if left else c2, left, tr)
                                 for left in (True, False) for tr in (True, False)), a, c, c2)
    a5, t5, c5 = torch.randn(5, 5), torch.rand(5), torch.randn(5, 5)  # any reflectors, as OpInfo's samples
    check(lambda a, t, c: torch.ormqr(a, t, c, False, True), a5, t5, c5)


def test_triangular_solve_at_any_size_trains():
    # lara_mini's gated delta rule solves 64-row unit-triangular systems, forward and backward:
    # one unrolled step per row took minutes to compile, and beyond 64 rows it did not lower.
    # Now stablehlo.triangular_solve (through JAX), any size, its gradient too, call after call.
    def fn(a, b):
        return (torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
                torch.linalg.solve_triangular(a.mT, b.mT, upper=True, left=False))

    f = compiled(fn)
    for n in (100, 130):
        a = (torch.randn(2, n, n) / n).tril(-1) + torch.eye(n)
        a.requires_grad_()
        b = torch.randn(2, n, 3, requires_grad=True)
        twin_a, twin_b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        got, want = f(a, b), fn(twin_a, twin_b)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        (got[0].sum() + got[1].pow(2).sum()).backward()
        (want[0].sum() + want[1].pow(2).sum()).backward()
        torch.testing.assert_close(a.grad, twin_a.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.grad, twin_b.grad, rtol=1e-4, atol=1e-4)
