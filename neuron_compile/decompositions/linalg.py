"""Dense linear algebra as unrolled ATen ops, for the small matrices torch-mlir cannot lower.

torch-mlir has no StableHLO lowering for any LAPACK-backed op (LU, Cholesky,
triangular solves, QR...): OpInfo's linalg entries, and user code that
inverts or solves a small system, failed with does-not-lower. Every size is
static in the graphs we lower, so the textbook algorithms unroll into plain
elementwise, matmul and gather ops, one step per column:

* LU with partial pivoting (LAPACK getrf's pivot choice: the first largest
  magnitude in the column), and on it solve, inverse, det, slogdet, lu_unpack,
  lu_solve;
* Cholesky (column by column, potrf's order), triangular solves inside them (substitution);
* Householder QR with LAPACK's reflector convention (dlarfg: beta = -sign(alpha) * norm).

The cost grows with the matrix side (one step per column), so matrices wider
than ``MAX_SIDE`` are left to the op (it then fails to lower, loudly). Errors
LAPACK reports through ``info`` are computed as LAPACK does (first zero pivot,
first non-positive Cholesky pivot); ``_linalg_check_errors`` cannot raise inside
a compiled graph, so a singular input gives inf/NaN where eager would raise.
Real dtypes only: complex inputs keep the op.
"""

from __future__ import annotations

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

LINALG: dict = {}
MAX_SIDE = 64


def _linalg(op):
    return register_decomposition(op, registry=LINALG)


def _supported(*tensors) -> bool:
    for t in tensors:
        if t.dtype.is_complex or not t.dtype.is_floating_point:
            return False
        if t.dim() >= 2 and max(t.shape[-2], t.shape[-1]) > MAX_SIDE:
            return False
    return True


def _empty(*tensors) -> bool:
    # Zero-size matrices: the algorithms' gathers and diagonals do not lower on them
    # (StableHLO gather with slice size 1 on a 0-dim); their results are constants.
    return any(t.numel() == 0 for t in tensors)


def _zeros(shape, like, dtype=None):
    return torch.zeros(list(shape), dtype=dtype or like.dtype, device=like.device)


def _ar(n, like, dtype=torch.int64):
    return torch.arange(n, dtype=dtype, device=like.device)


def _eye(m, n, like):
    return (_ar(m, like).unsqueeze(-1) == _ar(n, like).unsqueeze(0)).to(like.dtype)


def _batch(*shapes):
    return list(torch.broadcast_shapes(*[tuple(s) for s in shapes]))


# --------------------------------------------------------------------------- LU


def _lu(a: torch.Tensor):
    """(LU, perm, pivots0) of a [..., m, n]: rows ``perm`` of a equal L @ U; pivots0 are 0-based row swaps."""
    m, n = a.shape[-2], a.shape[-1]
    batch = list(a.shape[:-2])
    if _empty(a):
        perm = _ar(m, a).expand(batch + [m]) if m and all(batch) else _zeros(batch + [m], a, torch.int64)
        return a.clone(), perm, _zeros(batch + [min(m, n)], a, torch.int64)
    rows = _ar(m, a)
    cols = _ar(n, a)
    perm = rows.expand(batch + [m])
    pivots = []
    for k in range(min(m, n)):
        column = a[..., :, k].abs().masked_fill(rows < k, -1.0)
        p = column.argmax(-1)  # first largest magnitude at or below the diagonal, as isamax
        pivots.append(p)
        pk = p.unsqueeze(-1)
        swapped = torch.where(rows == k, pk, torch.where(rows == pk, k, rows))  # [..., m]
        a = torch.gather(a, -2, swapped.unsqueeze(-1).expand(batch + [m, n]))
        perm = torch.gather(perm, -1, swapped)
        pivot = a[..., k, k].unsqueeze(-1)  # [..., 1]
        below = rows > k
        # getf2 skips the scaling when the pivot is zero (then the column below is zero too)
        factor = torch.where(below & (pivot != 0), a[..., :, k] / torch.where(pivot != 0, pivot, 1), 0.0)
        update = factor.unsqueeze(-1) * a[..., k, :].unsqueeze(-2)
        a = a - update * (cols > k).to(a.dtype)
        a = torch.where(below.unsqueeze(-1) & (cols == k), factor.unsqueeze(-1), a)
    pivots0 = torch.stack(pivots, -1) if pivots else torch.zeros(batch + [0], dtype=torch.int64, device=a.device)
    return a, perm, pivots0


def _lu_info(lu: torch.Tensor):
    """LAPACK's info: the 1-based index of the first zero on U's diagonal, 0 when there is none."""
    k = min(lu.shape[-2], lu.shape[-1])
    if _empty(lu):
        return torch.zeros(list(lu.shape[:-2]), dtype=torch.int32, device=lu.device)
    diag = torch.diagonal(lu, 0, -2, -1)
    index = _ar(k, lu) + 1
    first = torch.where(diag == 0, index, k + 1).amin(-1)
    return torch.where(first == k + 1, 0, first).to(torch.int32)


def _unpack(lu: torch.Tensor, perm: torch.Tensor):
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    batch = list(lu.shape[:-2])
    if _empty(lu):
        p = _eye(m, m, lu).expand(batch + [m, m]) if m and all(batch) else _zeros(batch + [m, m], lu)
        return p, _zeros(batch + [m, k], lu), _zeros(batch + [k, n], lu)
    lower = torch.tril(lu[..., :, :k], -1) + _eye(m, k, lu)
    upper = torch.triu(lu[..., :k, :])
    p = (perm.unsqueeze(-2) == _ar(m, lu).unsqueeze(-1)).to(lu.dtype)  # P[j, i] = perm[i] == j
    return p, lower, upper


def _perm_from_pivots(pivots0: torch.Tensor, m: int, like):
    """The row permutation that a sequence of 0-based LAPACK row swaps produces."""
    rows = _ar(m, like)
    perm = rows.expand(list(pivots0.shape[:-1]) + [m])
    for k in range(pivots0.shape[-1]):
        pk = pivots0[..., k].unsqueeze(-1).to(torch.int64)
        swapped = torch.where(rows == k, pk, torch.where(rows == pk, k, rows))
        perm = torch.gather(perm, -1, swapped)
    return perm


@_linalg(aten.linalg_lu_factor_ex)
def _linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot or not _supported(a):
        return NotImplemented
    lu, _, pivots0 = _lu(a)
    return lu, (pivots0 + 1).to(torch.int32), _lu_info(lu)


@_linalg(aten.linalg_lu)
def _linalg_lu(a, *, pivot=True):
    if not pivot or not _supported(a):
        return NotImplemented
    lu, perm, _ = _lu(a)
    return _unpack(lu, perm)


@_linalg(aten.lu_unpack)
def _lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    if not (unpack_data and unpack_pivots) or not _supported(lu):
        return NotImplemented
    perm = _perm_from_pivots(pivots.to(torch.int64) - 1, lu.shape[-2], lu)
    return _unpack(lu, perm)


def _tri_solve(t: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool = False):
    """X with t @ X = b for triangular t [..., n, n] and b [..., n, k] (substitution, one row per step)."""
    n = t.shape[-1]
    batch = _batch(t.shape[:-2], b.shape[:-2])
    if _empty(t, b):
        return _zeros(batch + [n, b.shape[-1]], b)
    t = t.expand(batch + [n, n])
    b = b.expand(batch + [n, b.shape[-1]])
    rows = _ar(n, t).unsqueeze(-1)
    x = torch.zeros_like(b)
    for i in (range(n - 1, -1, -1) if upper else range(n)):
        row = t[..., i:i + 1, :]  # the unsolved entries of x are still zero
        value = b[..., i:i + 1, :] - torch.matmul(row, x)
        if not unit:
            value = value / t[..., i:i + 1, i:i + 1]
        x = torch.where(rows == i, value, x)
    return x


def _lu_solve(lu, perm, b, left=True, adjoint=False):
    """Solve with A = P L U given by (lu, perm): A X = B, A^H X = B, X A = B or X A^H = B."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return _lu_solve(lu, perm, b.mT, True, not adjoint).mT
    batch = _batch(lu.shape[:-2], b.shape[:-2])
    n = lu.shape[-1]
    if _empty(lu, b):
        return _zeros(batch + [n, b.shape[-1]], b)
    lower = torch.tril(lu, -1) + _eye(lu.shape[-1], lu.shape[-1], lu)
    upper = torch.triu(lu)
    perm = perm.expand(batch + [n])
    b = b.expand(batch + list(b.shape[-2:]))
    if not adjoint:  # L U X = P^T B = B[perm]
        pb = torch.gather(b, -2, perm.unsqueeze(-1).expand(batch + [n, b.shape[-1]]))
        return _tri_solve(upper, _tri_solve(lower, pb, False, True), True)
    # U^T L^T P^T X = B: X = P (L^T \ (U^T \ B)), and (P y)[perm[i]] = y[i]
    y = _tri_solve(lower.mT, _tri_solve(upper.mT, b, False), True, True)
    inverse = torch.argsort(perm, -1)
    return torch.gather(y, -2, inverse.unsqueeze(-1).expand(batch + [n, b.shape[-1]]))


@_linalg(aten.linalg_lu_solve)
def _linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    if not _supported(lu, b):
        return NotImplemented
    perm = _perm_from_pivots(pivots.to(torch.int64) - 1, lu.shape[-2], lu)
    return _lu_solve(lu, perm, b, left, adjoint)


def _is_vector_rhs(a, b):
    # torch's linalg_solve_is_vector_rhs: B is a (batch of) vector(s) when its shape is A's minus the last dim
    return b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])


@_linalg(aten._linalg_solve_ex)
def _linalg_solve_ex(a, b, *, left=True, check_errors=False):
    if not _supported(a, b):
        return NotImplemented
    lu, perm, pivots0 = _lu(a)
    vector = _is_vector_rhs(a, b)
    rhs = b.unsqueeze(-1) if vector else b
    if vector and not left:
        rhs = b.unsqueeze(-2)
    x = _lu_solve(lu, perm, rhs, left)
    if vector:
        x = x.squeeze(-1) if left else x.squeeze(-2)
    return x, lu, (pivots0 + 1).to(torch.int32), _lu_info(lu)


@_linalg(aten.linalg_inv_ex)
def _linalg_inv_ex(a, *, check_errors=False):
    if not _supported(a):
        return NotImplemented
    lu, perm, _ = _lu(a)
    n = a.shape[-1]
    if _empty(a):
        return _zeros(a.shape, a), _lu_info(lu)
    x = _lu_solve(lu, perm, _eye(n, n, a).expand(list(a.shape)))
    return x, _lu_info(lu)


def _swap_sign(pivots0, like):
    k = pivots0.shape[-1]
    swaps = (pivots0 != _ar(k, like)).to(torch.int64).sum(-1)
    return 1 - 2 * (swaps % 2).to(like.dtype)


@_linalg(aten.linalg_det)
def _linalg_det(a):
    if not _supported(a):
        return NotImplemented
    if _empty(a):
        return torch.ones(list(a.shape[:-2]), dtype=a.dtype)
    lu, _, pivots0 = _lu(a)
    return torch.diagonal(lu, 0, -2, -1).prod(-1) * _swap_sign(pivots0, a)


def _det_factor(a):
    """The matrix whose LU ATen's _linalg_det and _linalg_slogdet return: A^T when A is C-contiguous
    and real (LAPACK then reads A's memory as column-major with no copy), else A. Their backward
    solves with that LU accordingly (adjoint or not), so handing back A's LU for a C-contiguous A
    gave the transposed gradient."""
    return a.mT if a.is_contiguous() and not a.is_complex() else a


@_linalg(aten._linalg_det)
def _linalg_det_lu(a):
    if not _supported(a):
        return NotImplemented
    lu, _, pivots0 = _lu(_det_factor(a))
    if _empty(a):  # the determinant of a 0 x 0 matrix is 1
        return torch.ones(list(a.shape[:-2]), dtype=a.dtype), lu, (pivots0 + 1).to(torch.int32)
    return torch.diagonal(lu, 0, -2, -1).prod(-1) * _swap_sign(pivots0, a), lu, (pivots0 + 1).to(torch.int32)


@_linalg(aten._linalg_slogdet)
def _linalg_slogdet(a):
    if not _supported(a):
        return NotImplemented
    lu, _, pivots0 = _lu(_det_factor(a))
    if _empty(a):
        return (torch.ones(list(a.shape[:-2]), dtype=a.dtype), _zeros(a.shape[:-2], a), lu,
                (pivots0 + 1).to(torch.int32))
    diag = torch.diagonal(lu, 0, -2, -1)
    sign = torch.sign(diag).prod(-1) * _swap_sign(pivots0, a)
    logabs = diag.abs().log().sum(-1)
    return sign, logabs, lu, (pivots0 + 1).to(torch.int32)


# --------------------------------------------------------------------------- triangular


# linalg_solve_triangular itself is not decomposed: it lowers to stablehlo.triangular_solve through
# JAX (lowering/jax_rules.py), at any size and without one unrolled step per row.


@_linalg(aten.triangular_solve)
def _triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    if not _supported(a, b):
        return NotImplemented
    t = a.mT if transpose else a
    x = _tri_solve(torch.triu(t) if upper != transpose else torch.tril(t), b, upper != transpose, unitriangular)
    return x, a.clone()


# --------------------------------------------------------------------------- Cholesky


def _cholesky(a: torch.Tensor):
    """(L, info) with a = L L^T from a's lower triangle; info: the first non-positive pivot (1-based), else 0."""
    n = a.shape[-1]
    info = _zeros(a.shape[:-2], a, torch.int32)
    if _empty(a):
        return _zeros(a.shape, a), info
    rows = _ar(n, a)
    low = torch.zeros_like(a)
    for j in range(n):
        v = a[..., :, j] - torch.matmul(low, low[..., j, :].unsqueeze(-1)).squeeze(-1)  # [..., n]
        d = v[..., j]
        info = torch.where((info == 0) & ~(d > 0), j + 1, info)
        root = torch.sqrt(d).unsqueeze(-1)
        column = torch.where(rows > j, v / root, torch.where(rows == j, root, 0.0))
        low = torch.where(rows == j, column.unsqueeze(-1), low)  # column j
    return low, info


@_linalg(aten.linalg_cholesky_ex)
def _linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    if not _supported(a):
        return NotImplemented
    low, info = _cholesky(a)
    return (low.mT if upper else low), info


@_linalg(aten.cholesky)
def _cholesky_op(a, upper=False):
    if not _supported(a):
        return NotImplemented
    low, _ = _cholesky(a)
    return low.mT if upper else low


@_linalg(aten.cholesky_solve)
def _cholesky_solve(b, factor, upper=False):
    if not _supported(b, factor):
        return NotImplemented
    low = factor.mT if upper else factor
    return _tri_solve(low.mT, _tri_solve(low, b, False), True)


@_linalg(aten.cholesky_inverse)
def _cholesky_inverse(factor, upper=False):
    if not _supported(factor):
        return NotImplemented
    n = factor.shape[-1]
    return _cholesky_solve(_eye(n, n, factor).expand(list(factor.shape)), factor, upper)


# --------------------------------------------------------------------------- QR


def _geqrf(a: torch.Tensor):
    """LAPACK geqrf: R in the upper triangle, the reflectors' tails below, and tau."""
    m, n = a.shape[-2], a.shape[-1]
    if _empty(a):
        return a.clone(), _zeros(list(a.shape[:-2]) + [min(m, n)], a)
    rows = _ar(m, a)
    cols = _ar(n, a)
    taus = []
    for k in range(min(m, n)):
        x = a[..., :, k]
        alpha = x[..., k]
        tail = torch.where(rows > k, x, 0.0)
        xnorm = torch.linalg.vector_norm(tail, 2, -1)
        trivial = xnorm == 0
        beta = -torch.where(alpha >= 0, 1.0, -1.0) * torch.sqrt(alpha * alpha + xnorm * xnorm)
        safe_beta = torch.where(trivial, 1.0, beta)
        tau = torch.where(trivial, 0.0, (beta - alpha) / safe_beta)
        scale = torch.where(trivial, 0.0, 1.0 / torch.where(trivial, 1.0, alpha - beta))
        v = torch.where(rows == k, 1.0, tail * scale.unsqueeze(-1))  # [..., m], v[k] = 1, zero above
        # H = I - tau v v^T on the trailing columns
        w = torch.matmul(v.unsqueeze(-2), a).squeeze(-2)  # [..., n] = v^T a
        update = tau.unsqueeze(-1).unsqueeze(-1) * v.unsqueeze(-1) * w.unsqueeze(-2)
        a = torch.where(cols > k, a - update, a)
        new_k = torch.where(rows == k, torch.where(trivial, alpha, beta).unsqueeze(-1),
                            torch.where(rows > k, v, x.new_zeros(()) + x))
        a = torch.where(cols == k, new_k.unsqueeze(-1), a)
        taus.append(tau)
    tau = torch.stack(taus, -1) if taus else a.new_zeros(list(a.shape[:-2]) + [0])
    return a, tau


def _householder_product(a: torch.Tensor, tau: torch.Tensor, columns: int):
    """Q's first ``columns`` columns: H_1 ... H_k applied to the identity's columns (orgqr)."""
    m = a.shape[-2]
    if _empty(a) or columns == 0:
        batch = list(a.shape[:-2])
        if m and columns and all(batch):  # no reflectors: the identity's columns
            return _eye(m, columns, a).expand(batch + [m, columns])
        return _zeros(batch + [m, columns], a)
    rows = _ar(m, a)
    q = _eye(m, columns, a).expand(list(a.shape[:-2]) + [m, columns])
    for k in range(tau.shape[-1] - 1, -1, -1):
        v = torch.where(rows == k, 1.0, torch.where(rows > k, a[..., :, k], 0.0))
        w = torch.matmul(v.unsqueeze(-2), q)  # [..., 1, columns]
        q = q - tau[..., k].unsqueeze(-1).unsqueeze(-1) * v.unsqueeze(-1) * w
    return q


@_linalg(aten.geqrf)
def _geqrf_op(a):
    if not _supported(a):
        return NotImplemented
    return _geqrf(a)


@_linalg(aten.linalg_qr)
def _linalg_qr(a, mode="reduced"):
    if not _supported(a):
        return NotImplemented
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    packed, tau = _geqrf(a)
    if _empty(a):
        batch = list(a.shape[:-2])
        r = _zeros(batch + [m if mode == "complete" else k, n], a)
        return (a.new_zeros([0]) if mode == "r" else _householder_product(packed, tau, m if mode == "complete" else k)), r
    if mode == "r":
        return a.new_zeros([0]), torch.triu(packed[..., :k, :])
    if mode == "complete":
        return _householder_product(packed, tau, m), torch.triu(packed)
    return _householder_product(packed, tau, k), torch.triu(packed[..., :k, :])


@_linalg(aten.linalg_householder_product)
def _linalg_householder_product(a, tau):
    if not _supported(a, tau):
        return NotImplemented
    return _householder_product(a, tau, a.shape[-1])


@_linalg(aten.ormqr)
def _ormqr(a, tau, c, left: bool = True, transpose: bool = False):
    # Q of geqrf's reflectors (all m columns), applied to c from the left or the right, or
    # its transpose: the product LAPACK's ormqr computes without forming Q
    if not _supported(a, tau, c):
        return NotImplemented
    q = _householder_product(a, tau, a.shape[-2])
    if transpose:
        q = q.transpose(-2, -1)
    return torch.matmul(q, c) if left else torch.matmul(c, q)
