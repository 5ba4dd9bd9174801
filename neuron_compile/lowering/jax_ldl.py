"""LAPACK's Bunch-Kaufman LDL^T (?sytf2, ?sytrs, uplo='L') written in JAX.

``torch.linalg.ldl_factor(_ex)`` and ``torch.linalg.ldl_solve`` call LAPACK
?sytrf / ?sytrs on CPU; neither Torch-MLIR nor JAX has a lowering for them.
Written here with ``jax.numpy`` / ``jax.lax`` only (static shapes, pivots and
pivot decisions as data inside ``lax.while_loop``), they lower to plain
StableHLO and reproduce eager: the same pivot choices (alpha = (1+sqrt(17))/8,
first-index ties as i?amax), the same symmetric interchanges, the same rank-1
and rank-2 updates, and LAPACK's 1-based pivots (negative for 2x2 blocks).
For the sizes torch tests (n below LAPACK's block size of 64) ?sytrf runs the
unblocked ?sytf2, which is what is reproduced; only the lower triangle of the
input is read and, as torch does, the strictly upper triangle of LD is zero.
Real dtypes only: for them ``hermitian=True`` is the same factorization.
"""

from __future__ import annotations

import numpy as np


def _batched(fn, batch_shape, *args):
    """Apply a 2-D ``fn`` over flattened leading batch dims of ``args``."""
    import jax

    nb = int(np.prod(batch_shape, dtype=np.int64))
    flat = [x.reshape((nb,) + x.shape[len(batch_shape):]) for x in args]
    outs = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda o: o.reshape(tuple(batch_shape) + o.shape[1:]), outs)


def _sytf2_lower(a):
    """?sytf2 ('L') on one n x n matrix: returns (LD, pivots int32, info int32)."""
    import jax.numpy as jnp
    from jax import lax

    n = a.shape[-1]
    dt = a.dtype
    alpha = jnp.asarray((1 + np.sqrt(np.asarray(17, dt))) / np.asarray(8, dt), dt)
    idx = jnp.arange(n)
    row, col = idx[:, None], idx[None, :]
    lower = row >= col

    def fmax(a, b):  # Fortran MAX as compiled (maxsd): b unless a > b, so a NaN `a` is dropped
        return jnp.where(a > b, a, b)

    def iamax(v, mask):  # i?amax: first index of the largest |v| (MKL: a NaN is largest)
        av = jnp.where(mask, jnp.abs(v), -1)
        i = jnp.argmax(av)
        return i, jnp.where(mask.any(), av[i], 0)

    def step(state):
        A, piv, info, k = state
        absakk = jnp.abs(A[k, k])
        imax, colmax = iamax(A[:, k], idx > k)
        zero = fmax(absakk, colmax) == 0  # singular column (MKL does not test a NaN diagonal here)
        # largest off-diagonal entry in row/column imax of the trailing block
        rowmax = iamax(A[imax, :], (idx >= k) & (idx < imax))[1]
        rowmax = jnp.where(imax < n - 1, fmax(rowmax, iamax(A[:, imax], idx > imax)[1]), rowmax)
        keep_k = zero | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        one_at_imax = jnp.abs(A[imax, imax]) >= alpha * rowmax
        kp = jnp.where(keep_k, k, imax)
        kstep = jnp.where(keep_k | one_at_imax, 1, 2)
        kk = k + kstep - 1

        # symmetric interchange of kk and kp inside the trailing block A[k:, k:]
        p = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        full = jnp.where(lower, A, A.T)
        perm = full[p][:, p]
        trail = lower & (col >= k)
        A = jnp.where(trail, perm, A)

        # 1x1 pivot: A22 += x (-x/d)^T as ?syr does, then the column times 1/d (MKL has no
        # small-pivot branch; XLA flushes subnormals, so |d| < tiny cannot arise here anyway)
        akk = A[k, k]
        x = jnp.where(idx > k, A[:, k], 0)
        d11 = 1 / akk
        l1 = x * d11
        upd1 = A + x[:, None] * (-d11 * x)[None, :]
        A1 = jnp.where(trail & (col > k), upd1, A)
        A1 = jnp.where((col == k) & (row > k), l1[:, None], A1)

        # 2x2 pivot: rank-2 update with the inverse of the 2x2 block
        k1 = jnp.minimum(k + 1, n - 1)
        d21 = A[k1, k]
        e11 = A[k1, k1] / d21
        e22 = akk / d21
        t = 1 / (e11 * e22 - 1)
        d21 = t / d21
        m = idx > k + 1
        c0 = jnp.where(m, A[:, k], 0)
        c1 = jnp.where(m, A[:, k1], 0)
        wk = d21 * (e11 * c0 - c1)
        wkp1 = d21 * (e22 * c1 - c0)
        upd2 = A - c0[:, None] * wk[None, :] - c1[:, None] * wkp1[None, :]
        A2 = jnp.where(lower & (col > k + 1), upd2, A)
        A2 = jnp.where((col == k) & m[:, None], wk[:, None], A2)
        A2 = jnp.where((col == k + 1) & m[:, None], wkp1[:, None], A2)

        A = jnp.where(zero, A, jnp.where(kstep == 1, A1, A2))
        code = (kp + 1).astype(jnp.int32)
        piv = jnp.where(kstep == 1, jnp.where(idx == k, code, piv),
                        jnp.where((idx == k) | (idx == k + 1), -code, piv))
        info = jnp.where((info == 0) & zero, (k + 1).astype(jnp.int32), info)
        return A, piv, info, k + kstep

    init = (jnp.tril(a), jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.asarray(0))
    A, piv, info, _ = lax.while_loop(lambda s: s[3] < n, step, init)
    return A, piv, info


def ldl_factor_ex(a, hermitian=False):
    """``torch.linalg.ldl_factor_ex(a, hermitian)`` for real ``a`` of shape (*, n, n): (LD, pivots, info)."""
    import jax.numpy as jnp

    a = jnp.asarray(a)
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    return _batched(_sytf2_lower, a.shape[:-2], a)


def ldl_factor(a, hermitian=False):
    """``torch.linalg.ldl_factor(a, hermitian)`` for real ``a``: (LD, pivots)."""
    LD, piv, _ = ldl_factor_ex(a, hermitian)
    return LD, piv


def _sytrs_lower(A, piv, B):
    """?sytrs ('L') for one factorization (A, piv) and B of shape (n, nrhs)."""
    import jax.numpy as jnp
    from jax import lax

    n = A.shape[-1]
    idx = jnp.arange(n)
    piv = piv.astype(jnp.int32)

    def swap(B, i, j):
        p = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return B[p]

    def forward(state):  # B := inv(D) inv(L) P B, interchanges applied as met
        B, k = state
        p = piv[k]
        k1 = jnp.minimum(k + 1, n - 1)
        two = p < 0
        kp = jnp.where(two, -p, p) - 1
        B = swap(B, jnp.where(two, k1, k), kp)
        B = B - jnp.where(idx > jnp.where(two, k1, k), A[:, k], 0)[:, None] * B[k][None, :]
        # 1x1
        B1 = jnp.where((idx == k)[:, None], B * (1 / A[k, k]), B)
        # 2x2
        B2 = B - jnp.where(idx > k + 1, A[:, k1], 0)[:, None] * B[k1][None, :]
        akm1k = A[k1, k]
        akm1 = A[k, k] / akm1k
        ak = A[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = B2[k] / akm1k
        bk = B2[k1] / akm1k
        B2 = jnp.where((idx == k)[:, None], ((ak * bkm1 - bk) / denom)[None, :], B2)
        B2 = jnp.where((idx == k1)[:, None], ((akm1 * bk - bkm1) / denom)[None, :], B2)
        B = jnp.where(two, B2, B1)
        return B, k + jnp.where(two, 2, 1)

    def backward(state):  # B := P^T inv(L^T) B
        B, k = state
        p = piv[k]
        two = p < 0
        below = jnp.where(idx > k, 1, 0).astype(A.dtype)
        B = jnp.where((idx == k)[:, None], B - ((below * A[:, k]) @ B)[None, :], B)
        km1 = jnp.maximum(k - 1, 0)
        B2 = jnp.where((idx == km1)[:, None], B - ((below * A[:, km1]) @ B)[None, :], B)
        B = jnp.where(two, B2, B)
        B = swap(B, k, jnp.where(two, -p, p) - 1)
        return B, k - jnp.where(two, 2, 1)

    B, _ = lax.while_loop(lambda s: s[1] < n, forward, (B, jnp.asarray(0)))
    B, _ = lax.while_loop(lambda s: s[1] >= 0, backward, (B, jnp.asarray(n - 1)))
    return B


def ldl_solve(LD, pivots, B, hermitian=False):
    """``torch.linalg.ldl_solve(LD, pivots, B, hermitian)`` for real inputs, batch dims broadcast."""
    import jax.numpy as jnp

    LD, pivots, B = jnp.asarray(LD), jnp.asarray(pivots), jnp.asarray(B)
    dt = jnp.result_type(LD, B)
    LD, B = LD.astype(dt), B.astype(dt)
    n = LD.shape[-1]
    batch = jnp.broadcast_shapes(LD.shape[:-2], pivots.shape[:-1], B.shape[:-2])
    if n == 0 or B.shape[-1] == 0:
        return jnp.zeros(batch + B.shape[-2:], dt)
    LD = jnp.broadcast_to(LD, batch + LD.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    return _batched(_sytrs_lower, batch, LD, pivots, B)
