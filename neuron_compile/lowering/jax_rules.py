"""JAX rules for the ATen ops Torch-MLIR cannot lower, registered by ATen op packet.

Torch-MLIR lowers no complex type and no iterative LAPACK routine, so FFTs,
SVD, eigendecompositions and a few special functions stop a graph at the
``torch-backend`` stage. JAX (a dependency already: jaxlib runs our
executables) has StableHLO lowerings for all of them: ``stablehlo.fft``,
LAPACK custom calls that jaxlib registers with the very XLA CPU client we
compile on, and ``stablehlo.while`` loops. ``splice`` picks the nodes these
rules take, lowers them with JAX and joins the result to Torch-MLIR's.

``@rule(packets...)`` registers a rule in ``RULES`` (a rule for one overload,
``aten.view.dtype``, takes its nodes from its packet's); with ``always`` (the
default) its packets go into ``ALWAYS``, the ops Torch-MLIR never lowers,
which always take the JAX path; the others (views, arithmetic...) take it
only on a complex operand or result. A rule is written against the ATen
signature and gets the node's fake output (``out``) first; its results are
checked against that output's shapes, and cast to its dtypes
(``splice._conform``), so a rule cannot silently change a type. Sections:
FFT, complex numbers, linear algebra (LDL in ``jax_ldl``), special functions.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch

aten = torch.ops.aten

# packet -> rule(out, *args, **kwargs)
RULES: dict[object, Callable] = {}
# packets Torch-MLIR never lowers: always through JAX
ALWAYS: set[object] = set()


def rule(*packets, always: bool = True):
    """Register a JAX rule for ATen op packets (``always``: Torch-MLIR has no lowering for them)."""
    def register(fn):
        for packet in packets:
            RULES[packet] = fn
            if always:
                ALWAYS.add(packet)
        return fn

    return register


# --------------------------------------------------------------------------- dtypes


def _np_dtype(dtype: torch.dtype):
    import jax.numpy as jnp

    return jnp.dtype(_ELEMENT_NAME[dtype])


_ELEMENT_NAME = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.uint64: "uint64", torch.uint32: "uint32", torch.uint16: "uint16", torch.bool: "bool",
    torch.complex64: "complex64", torch.complex128: "complex128",
}


def _dims(dim, ndim: int) -> list[int]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % ndim for d in dims] if ndim else dims


# --------------------------------------------------------------------------- rules: FFT

# torch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n, whatever the direction.
# numpy's norm names say which direction is scaled.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@rule(aten._fft_r2c)
def _fft_r2c(out, x, dim, normalization, onesided):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    if onesided:
        return jnp.fft.rfftn(x, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.fftn(x, axes=axes, norm=_FORWARD_NORM[normalization])


@rule(aten._fft_c2c)
def _fft_c2c(out, x, dim, normalization, forward):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    if forward:
        return jnp.fft.fftn(x, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(x, axes=axes, norm=_INVERSE_NORM[normalization])


@rule(aten._fft_c2r)
def _fft_c2r(out, x, dim, normalization, last_dim_size):
    import jax.numpy as jnp

    axes = _dims(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(x, s=sizes, axes=axes, norm=_INVERSE_NORM[normalization])


# --------------------------------------------------------------------------- rules: complex numbers


@rule(aten._conj, aten.conj_physical, aten._conj_physical, aten.conj)
def _conj(out, x):
    import jax.numpy as jnp

    return jnp.conj(x)


@rule(aten.complex)
def _complex(out, real, imag):
    import jax.lax as lax

    import jax.numpy as jnp

    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@rule(aten.polar)
def _polar(out, magnitude, angle):
    import jax.lax as lax

    import jax.numpy as jnp

    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@rule(aten.view_as_complex)
def _view_as_complex(out, x):
    import jax.lax as lax

    return lax.complex(x[..., 0], x[..., 1])


# Ops that Torch-MLIR lowers, except on complex tensors: these rules only take nodes that touch one.


def _register_complex_rules():
    def binary(fn):
        def apply(out, a, b, alpha=1):
            return fn(a, b if alpha == 1 else b * alpha)
        return apply

    def unary(name):
        def apply(out, x):
            import jax.numpy as jnp

            return getattr(jnp, name)(x)
        return apply

    for packet, fn in ((aten.add, operator.add), (aten.sub, operator.sub), (aten.mul, operator.mul),
                       (aten.div, operator.truediv), (aten.eq, operator.eq), (aten.ne, operator.ne)):
        RULES[packet] = binary(fn)
    for name in ("negative", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "reciprocal", "sign", "angle",
                 "square", "isnan", "isinf", "isfinite"):
        RULES[getattr(aten, {"negative": "neg", "sign": "sgn"}.get(name, name))] = unary(name)


@rule(aten.clone, torch.ops.prims.clone, aten.alias, aten.lift_fresh_copy, always=False)
def _identity(out, x, **kwargs):
    return x


@rule(aten._to_copy, always=False)
def _to_copy(out, x, **kwargs):
    import jax.numpy as jnp

    return jnp.asarray(x).astype(_np_dtype(out.dtype))


@rule(torch.ops.prims.convert_element_type, always=False)
def _convert(out, x, dtype):
    return x.astype(_np_dtype(dtype))


@rule(aten.view.dtype)
def _view_dtype(out, x, dtype):
    # a bitcast (torch-mlir lowers only a narrowing or same-size one), through the bytes of the last
    # dimension: little-endian, ATen's byte order on the host and XLA's bitcast_convert's. A bool is
    # a byte of 0 or 1, a complex number its real and imaginary parts
    import jax.numpy as jnp
    from jax import lax

    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    elif jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], -1)
    if x.dtype != jnp.uint8:
        x = lax.bitcast_convert_type(x, jnp.uint8)  # a last dimension of bytes where wider
    lead = tuple(out.shape[:-1])
    raw = x.reshape(lead + (-1,))
    target = _np_dtype(dtype)
    plain = {jnp.dtype(jnp.bool_): jnp.dtype(jnp.uint8), jnp.dtype(jnp.complex64): jnp.dtype(jnp.float32),
             jnp.dtype(jnp.complex128): jnp.dtype(jnp.float64)}.get(target, target)
    if plain.itemsize > 1:
        result = lax.bitcast_convert_type(raw.reshape(lead + (-1, plain.itemsize)), plain)
    else:
        result = lax.bitcast_convert_type(raw, plain)
    if target == jnp.bool_:
        result = result != 0
    elif plain != target:
        result = lax.complex(result[..., 0::2], result[..., 1::2])
    return result.reshape(tuple(out.shape))


@rule(aten.view, aten._unsafe_view, aten.reshape, always=False)
def _reshape(out, x, shape):
    return x.reshape(tuple(out.shape))


@rule(aten.permute, always=False)
def _permute(out, x, dims):
    return x.transpose(_dims(dims, x.ndim))


@rule(aten.t, always=False)
def _t(out, x):
    return x.T


@rule(aten.transpose, always=False)
def _transpose(out, x, a, b):
    import jax.numpy as jnp

    return jnp.swapaxes(x, a, b)


@rule(aten.expand, always=False)
def _expand(out, x, size, **kwargs):
    import jax.numpy as jnp

    return jnp.broadcast_to(x, tuple(out.shape))


@rule(aten.unsqueeze, aten.squeeze, always=False)
def _to_shape(out, x, *args):
    return x.reshape(tuple(out.shape))


@rule(aten.slice, always=False)
def _slice(out, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, min(end, x.shape[dim]) if end is not None else None, step)
    return x[tuple(index)]


@rule(aten.select, always=False)
def _select(out, x, dim, index):
    import jax.numpy as jnp

    return jnp.take(x, index, axis=dim)


@rule(aten.cat, always=False)
def _cat(out, tensors, dim=0):
    import jax.numpy as jnp

    return jnp.concatenate([t for t in tensors if t.size or t.ndim != 1], axis=dim)


@rule(aten.roll, always=False)
def _roll(out, x, shifts, dims=()):
    import jax.numpy as jnp

    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@rule(aten.flip, always=False)
def _flip(out, x, dims):
    import jax.numpy as jnp

    return jnp.flip(x, axis=tuple(dims))


@rule(aten.where, always=False)
def _where(out, condition, a, b):
    import jax.numpy as jnp

    return jnp.where(condition, a, b)


@rule(aten.full_like, aten.full, aten.fill, aten.scalar_tensor, aten.new_full, always=False)
def _full(out, *args, **kwargs):
    # a complex fill value (``x.fill_(1 + 2j)``): Torch-MLIR's importer takes no complex scalar
    import jax.numpy as jnp

    value = args[1] if len(args) > 1 else args[0]
    if hasattr(value, "shape"):  # fill.Tensor: a 0-d tensor
        value = jnp.asarray(value).reshape(())
    return jnp.full(tuple(out.shape), value, dtype=_np_dtype(out.dtype))


@rule(aten.sum, always=False)
def _sum(out, x, dim=None, keepdim=False, dtype=None):
    # ``dim=[]`` sums every dim, as None does (``sum.dim_IntList``'s schema; ``t.sum()`` of a complex tensor
    # comes here so): not an empty axis tuple, which sums nothing
    return x.sum(axis=tuple(_dims(dim, x.ndim)) if dim else None, keepdims=keepdim)


@rule(aten.mean, always=False)
def _mean(out, x, dim=None, keepdim=False, dtype=None):
    # a complex mean (Torch-MLIR lowers no complex sum): the sum divided by the count, as CPU's mean
    return x.mean(axis=tuple(_dims(dim, x.ndim)) if dim else None, keepdims=keepdim)


@rule(aten.mm, aten.bmm, aten.matmul, always=False)
def _matmul(out, a, b):
    import jax.numpy as jnp

    return jnp.matmul(a, b)


_register_complex_rules()


@rule(aten.pow, always=False)
def _pow(out, a, b):
    # CPU's complex pow takes these exponents by their own functions (PowKernel.cpp), not exp(b * log(a))
    import jax.numpy as jnp

    special = {0.5: jnp.sqrt, 2: lambda x: x * x, 3: lambda x: x * x * x, -0.5: lambda x: 1 / jnp.sqrt(x),
               -1: lambda x: 1 / x, -2: lambda x: 1 / (x * x)}
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b in special:
        return special[b](a)
    return jnp.power(a, b)


@rule(aten.view_as_real, aten.view_as_real_copy, always=False)
def _view_as_real(out, x):
    import jax.numpy as jnp

    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@rule(aten.real, always=False)
def _real(out, x):
    import jax.numpy as jnp

    return jnp.real(x)


@rule(aten.imag, always=False)
def _imag(out, x):
    import jax.numpy as jnp

    return jnp.imag(x)


# --------------------------------------------------------------------------- rules: linear algebra
# LAPACK through jaxlib's custom calls (gesdd, syevd, geev), registered with the XLA CPU client we run on;
# LDL (sytrf/sytrs, which jaxlib lacks) written out in jax_ldl.py.


def _empty_like(out):
    import jax.numpy as jnp

    return jnp.zeros(tuple(out.shape), _np_dtype(out.dtype))


@rule(aten._linalg_svd)
def _linalg_svd(out, a, full_matrices=False, compute_uv=True, driver=None):
    import jax.numpy as jnp

    if not compute_uv:
        return _empty_like(out[0]), jnp.linalg.svd(a, compute_uv=False), _empty_like(out[2])
    return tuple(jnp.linalg.svd(a, full_matrices=full_matrices))


@rule(aten._linalg_eigh)
def _linalg_eigh(out, a, UPLO="L", compute_v=True):
    import jax.numpy as jnp

    # torch reads one triangle only: no symmetrizing
    values, vectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else _empty_like(out[1]))


@rule(aten.linalg_eig)
def _linalg_eig(out, a):
    import jax.numpy as jnp

    return tuple(jnp.linalg.eig(a))


@rule(aten.linalg_pinv)
def _linalg_pinv(out, a, *args, **kwargs):
    """ATen's linalg_pinv (LinearAlgebra.cpp) for its four overloads: SVD (or eigh when hermitian),
    singular values under max(atol, rtol * largest) dropped."""
    import jax.numpy as jnp

    hermitian = kwargs.pop("hermitian", False)
    if args and isinstance(args[-1], bool):
        *args, hermitian = args
    if "rcond" in kwargs or (len(args) == 1 and "atol" not in kwargs and "rtol" not in kwargs):
        atol, rtol = 0.0, kwargs.get("rcond", args[0] if args else None)  # (rcond, hermitian) overloads
        given_atol = True
    else:
        atol = kwargs.get("atol", args[0] if args else None)
        rtol = kwargs.get("rtol", args[1] if len(args) > 1 else None)
        given_atol = atol is not None
        atol = 0.0 if atol is None else atol
    real = jnp.finfo(a.dtype).dtype
    atol = jnp.asarray(atol, real)
    if rtol is None:
        default = jnp.asarray(jnp.finfo(real).eps * max(a.shape[-1], a.shape[-2]), real)
        rtol = jnp.where(atol > 0, jnp.zeros((), real), default) if given_atol else default
    rtol = jnp.asarray(rtol, real)
    if a.size == 0:
        return _empty_like(out)
    if not hermitian:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        largest = s[..., :1]
        tol = jnp.maximum(atol[..., None], rtol[..., None] * largest)
        inverse = jnp.where(s > tol, 1 / s, 0).astype(a.dtype)
        return jnp.matmul(jnp.conj(jnp.swapaxes(vh, -1, -2)) * inverse[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))
    s, u = jnp.linalg.eigh(a, symmetrize_input=False)
    magnitude = jnp.abs(s)
    tol = jnp.maximum(atol[..., None], rtol[..., None] * magnitude.max(axis=-1, keepdims=True))
    inverse = jnp.where(magnitude > tol, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(u * inverse[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))


@rule(aten.linalg_ldl_factor_ex)
def _ldl_factor_ex(out, a, *, hermitian=False, check_errors=False):
    from .jax_ldl import ldl_factor_ex

    return tuple(ldl_factor_ex(a, hermitian=hermitian))


@rule(aten.linalg_ldl_solve)
def _ldl_solve(out, ld, pivots, b, *, hermitian=False):
    from .jax_ldl import ldl_solve

    return ldl_solve(ld, pivots, b, hermitian=hermitian)


@rule(aten.linalg_solve_triangular)
def _linalg_solve_triangular(out, a, b, *, upper, left=True, unitriangular=False):
    """``stablehlo.triangular_solve``: XLA's own op, any size (the unrolled substitution it replaces
    made one step per row: lara_mini's 64-row UT systems took minutes to compile)."""
    import jax.numpy as jnp
    from jax import lax

    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if a.size == 0 or b.size == 0:
        return _empty_like(out)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@rule(aten.linalg_matrix_exp)
def _matrix_exp(out, a):
    import jax.scipy.linalg

    return jax.scipy.linalg.expm(a)


# --------------------------------------------------------------------------- rules: special functions


def _operands(out, *values):
    """Tensor or Python-number operands in the result's dtype, broadcast to one shape."""
    import jax.numpy as jnp

    return jnp.broadcast_arrays(*(jnp.asarray(v, _np_dtype(out.dtype)) for v in values))


@rule(aten.igamma)
def _igamma(out, a, x):
    import jax.lax as lax

    return lax.igamma(*_operands(out, a, x))


@rule(aten.igammac)
def _igammac(out, a, x):
    import jax.lax as lax

    return lax.igammac(*_operands(out, a, x))


@rule(aten.special_zeta)
def _zeta(out, x, q):
    import jax.lax as lax
    import jax.numpy as jnp

    x, q = _operands(out, x, q)
    # Cephes (ATen): a pole at every non-positive integer q, where XLA's zeta gives NaN
    pole = (q <= 0) & (q == jnp.floor(q)) & (x > 1)
    return jnp.where(pole, jnp.inf, lax.zeta(x, q))


@rule(aten.hash_tensor)
def _hash_tensor(out, x, dim=(), *, keepdim=False, mode=0):
    # ATen's mode 0: the XOR of each element's 64-bit pattern (floats as float64, integers as int64)
    import jax.lax as lax
    import jax.numpy as jnp

    if mode != 0:
        raise NotImplementedError(f"hash_tensor mode {mode}")
    wide = x.astype(jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    axes = tuple(_dims(dim, x.ndim)) if dim else tuple(range(x.ndim))
    hashed = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return hashed.reshape(tuple(out.shape))


@rule(aten.frexp)
def _frexp(out, x):
    import jax.numpy as jnp

    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent


def _three_term(x, n, first, step, *, limit=None):
    """ATen's loop ``p, q = q, step(k, p, q)`` for k = 1 .. n-1 from (1, first), per element of
    x and n (already broadcast), as one ``stablehlo.while`` running to the largest degree. Returns
    q at each element's degree (1 for degree 0), and the degree as an integer tensor for the
    caller's special cases."""
    import jax.lax as lax
    import jax.numpy as jnp

    n = jnp.where(jnp.isfinite(n), n, -1).astype(jnp.int64)  # ATen truncates the degree to int64
    stop = jnp.max(n, initial=0)
    if limit is not None:
        stop = jnp.minimum(stop, limit)

    def body(state):
        k, p, q = state
        active = k < n
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    _, _, q = lax.while_loop(lambda s: s[0] < stop, body, (jnp.int64(1), jnp.ones_like(x), first(x)))
    return jnp.where(n == 0, 1, q).astype(x.dtype), n


def _hermite_limit(dtype) -> int:
    import jax.numpy as jnp

    return 128 if jnp.dtype(dtype).itemsize <= 4 else 512  # ATen's getHermitianLimit


@rule(aten.special_hermite_polynomial_h)
def _hermite_h(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    limit = _hermite_limit(x.dtype)
    value, n = _three_term(x, n, lambda x: x + x, lambda k, p, q: (x + x) * q - (k + k) * p, limit=limit)
    return jnp.where(n < 0, 0, jnp.where(n > limit, jnp.nan, value))


@rule(aten.special_hermite_polynomial_he)
def _hermite_he(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    limit = _hermite_limit(x.dtype)
    value, n = _three_term(x, n, lambda x: x, lambda k, p, q: x * q - k * p, limit=limit)
    return jnp.where(n < 0, 0, jnp.where(n > limit, jnp.nan, value))


@rule(aten.special_laguerre_polynomial_l)
def _laguerre_l(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    value, n = _three_term(x, n, lambda x: 1 - x, lambda k, p, q: ((k + k + (1 - x)) * q - k * p) / (k + 1))
    return jnp.where(n < 0, 0, jnp.where(jnp.abs(x) == 0, 1, value))


@rule(aten.special_legendre_polynomial_p)
def _legendre_p(out, x, n):
    import jax.numpy as jnp

    x, n = _operands(out, x, n)
    value, n = _three_term(x, n, lambda x: x, lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1))
    at_one = jnp.where((x > 0) | (n % 2 == 0), 1, -1)
    return jnp.where(n < 0, 0, jnp.where(jnp.abs(x) == 1, at_one, value))
