"""Ops Torch-MLIR cannot lower, lowered by JAX and spliced into one module (neuron_compile/lowering/splice.py, jax_rules.py).

Every test compiles with fallback off, compares with eager, and checks that the
graph went through the splice (the ``jax`` stage ran) into one XLA executable.
"""

import pytest
import torch

import neuron_compile
from neuron_compile.report import COUNTERS


def _compiled(fn, *args, **kwargs):
    out = torch.compile(fn, backend="neuron", fullgraph=True)(*args, **kwargs)
    reports = neuron_compile.compile_reports()
    assert any("jax" in r.stages for r in reports), [r.stages for r in reports]
    assert not any(r.fallback for r in reports)
    return out


def test_fft_between_lowered_ops_matches_eager():
    """Torch-MLIR ops before and after a JAX-lowered FFT: three parts, one executable."""
    x = torch.randn(4, 6, 16)

    def fn(x):
        spectrum = torch.fft.rfft(torch.tanh(x) * 2, dim=-1, norm="ortho")
        power = torch.view_as_real(spectrum).square().sum(-1)  # complex -> real inside the graph
        return power.softmax(-1), torch.fft.irfft(spectrum, n=16, dim=-1)

    got = _compiled(fn, x)
    for a, b in zip(got, fn(x)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert COUNTERS["xla_compiles"] == 1


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_complex_inputs_and_outputs(norm):
    """Complex tensors cross the executor's boundary both ways; every normalization matches."""
    x = torch.randn(3, 8, 5, dtype=torch.complex64)

    def fn(x):
        return torch.fft.fftn(x, dim=(0, 2), norm=norm), torch.fft.ifft2(x, norm=norm).conj() * 2

    got = _compiled(fn, x)
    for a, b in zip(got, fn(x)):
        assert a.dtype == torch.complex64
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_complex128_elementwise_round_trip():
    """A graph of complex128 elementwise ops: JAX lowers all of it; dtypes kept, values eager's."""
    x = torch.randn(3, 4, dtype=torch.complex128)

    def fn(x):
        return x * 2 + 1j, x.conj(), x.abs(), torch.view_as_real(x)

    for got, ref in zip(_compiled(fn, x), fn(x)):
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got, ref)


def test_fft_training_gradients_match_eager():
    """The backward graph holds FFTs of complex gradients: lowered the same way."""
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16)

    def loss(w, x):
        return torch.fft.rfft(x @ w, dim=-1).abs().sum()

    compiled = torch.compile(loss, backend="neuron")
    got = compiled(w, x)
    got.backward()
    grad, w.grad = w.grad, None
    ref = loss(w, x)
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad, w.grad, rtol=1e-4, atol=1e-4)
    assert sum(1 for r in neuron_compile.compile_reports() if "jax" in r.stages) == 2  # forward and backward


def test_svd_eigh_pinv_match_eager():
    """LAPACK through jaxlib's custom calls. Singular vectors are compared through what they
    determine (the reconstruction, the projector), never by sign."""
    a = torch.randn(5, 7, 4)
    sym = a @ a.mT + torch.eye(7)

    def fn(a, sym):
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        values, vectors = torch.linalg.eigh(sym)
        return u, s, vh, values, vectors, torch.linalg.pinv(a), torch.linalg.pinv(sym, hermitian=True)

    u, s, vh, values, vectors, pinv, pinv_h = _compiled(fn, a, sym)
    ref = fn(a, sym)
    torch.testing.assert_close(s, ref[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(u @ torch.diag_embed(s) @ vh, a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(values, ref[3], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(vectors @ torch.diag_embed(values) @ vectors.mT, sym, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pinv, ref[5], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pinv_h, ref[6], rtol=1e-4, atol=1e-4)


def test_ldl_factor_and_solve_match_eager():
    """LAPACK's Bunch-Kaufman sytf2/sytrs written in JAX (jax_ldl.py): the same pivots, 1x1 and
    2x2 blocks, the same factor; the matrices are indefinite, and one has a zero diagonal."""
    a = torch.randn(3, 6, 6)
    a = a + a.mT
    a[1].diagonal().zero_()  # forces 2x2 pivots
    b = torch.randn(3, 6, 2)

    def fn(a, b):
        ld, pivots, info = torch.linalg.ldl_factor_ex(a)
        return ld, pivots, info, torch.linalg.ldl_solve(ld, pivots, b)

    got, ref = _compiled(fn, a, b), fn(a, b)
    assert (ref[1] < 0).any(), "the test matrices should need 2x2 pivots"
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2], ref[2], rtol=0, atol=0)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[3], ref[3], rtol=1e-4, atol=1e-4)


def test_polynomials_with_a_tensor_degree_match_eager():
    """Hermite, Laguerre and Legendre with a per-element degree: one while loop to the largest,
    with ATen's special cases (negative degree, |x| = 1 and x = 0, Hermite's limit of 128)."""
    # no NaN in x: eager's vectorized Laguerre and Legendre return a neighbour's value for it
    x = torch.tensor([-1.0, -0.5, 0.0, 0.3, 1.0, 1.7, 2.5, -3.0, 0.9, 0.25])
    n = torch.tensor([3.0, 0.0, 5.0, -1.0, 7.0, 1.0, 12.0, 4.0, 200.0, 2.0])
    special = torch.special

    def fn(x, n):
        return (special.hermite_polynomial_h(x, n), special.hermite_polynomial_he(x, n),
                special.laguerre_polynomial_l(x, n), special.legendre_polynomial_p(x, n))

    for got, ref in zip(_compiled(fn, x, n), fn(x, n)):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_igamma_and_zeta_poles_match_eager():
    a = torch.tensor([0.7, 1.0, 1.5, 2.0, 3.0, 2.5, 4.0, 0.5])
    x = torch.tensor([0.5, 2.0, 0.3, -1.5, -2.0, 0.0, 1.7, 5.0])

    def fn(a, x):
        return torch.igamma(a, x.abs()), torch.igammac(a, x.abs()), torch.special.zeta(a, x)

    for got, ref in zip(_compiled(fn, a, x), fn(a, x)):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_spliced_graph_is_cached_and_served_from_disk(fresh_cache):
    """The spliced module is an ordinary artifact: a second process-like start hits the disk."""
    x = torch.randn(8, 32)

    def fn(x):
        return torch.fft.rfft(x).abs() + 1

    first = torch.compile(fn, backend="neuron")(x)
    assert COUNTERS["misses"] == 1 and COUNTERS["xla_compiles"] == 1
    torch._dynamo.reset()
    neuron_compile.reset()  # the memory level too: what a new process sees
    second = torch.compile(fn, backend="neuron")(x)
    assert COUNTERS["disk_hits"] == 1 and COUNTERS["xla_compiles"] == 0 and COUNTERS["lowerings"] == 0
    torch.testing.assert_close(first, fn(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_op_without_a_rule_still_names_itself():
    """complex32 has no JAX type: the graph fails in Torch-MLIR with the usual error."""
    x = torch.randn(4, 4)
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x.to(torch.complex32), backend="neuron", fullgraph=True)(x)
    from neuron_compile.lowering import LoweringError, exception_chain

    errors = [e for e in exception_chain(info.value) if isinstance(e, LoweringError)]
    assert errors and "convert_element_type" in (errors[0].op or "")


def test_hash_tensor_matches_eager():
    """uint64 results: the XOR of each element's 64-bit pattern, over all or some dims."""
    x = torch.randn(5, 7)

    def fn(x):
        return torch.hash_tensor(x), torch.hash_tensor(x, dim=1, keepdim=True), torch.hash_tensor(x.long() * 1000)

    for got, ref in zip(_compiled(fn, x), fn(x)):
        assert got.dtype == torch.uint64
        assert torch.equal(got, ref)


def test_scalar_constant_beside_a_spliced_op():
    """A ``torch.tensor(scalar)`` constant (a ``get_attr`` in AOTAutograd's graph; FlexAttention's dense
    kernel has one) in a graph that JAX lowers a part of: the splice's parent graph held it and failed
    ("unexpected node _tensor_constant0"); it is now a ``full`` of the group that reads it. TorchTitan
    0.3's blocks (complex RoPE and FlexAttention in one graph) hit it."""
    x, angles = torch.randn(4, 8), torch.randn(4, 4)

    def fn(x, angles):
        rotated = torch.view_as_complex(x.reshape(4, 4, 2)) * torch.polar(torch.ones_like(angles), angles)
        y = torch.view_as_real(rotated).flatten(-2)
        return torch.where(y > 0, y, torch.tensor(-float("inf"))) + torch.tensor(0.5)

    torch.testing.assert_close(_compiled(fn, x, angles), fn(x, angles))
