"""Compiled graphs whose saved values are conjugate views (issue 54, item 3: TorchTitan's drift).

The backward of a complex multiply ``a * b`` needs ``conj(b)``; AOTAutograd saves ``_conj(b)``, a view
of ``b`` that shares its storage and flips the conjugate bit. When ``b`` is a graph input (RoPE's
``freqs_cis``), the forward's executable returns that saved value as a view of its input
(``output_views``), and the backward's executable reads it. Both steps dropped the bit: the view was
rebuilt with ``as_strided`` alone, and a device tensor's buffer was taken without resolving it. The
gradient of every RoPE'd projection (TorchTitan's ``wq``/``wk``) was then wrong, by the size of the
gradient itself, with the loss still right; the training drifted from CPU's by 1e-4 within a few steps.
"""

from __future__ import annotations

import pytest
import torch

from neuron_compile.output_views import OutputView, find_output_views, make_view

S, D = 8, 8


def rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """TorchTitan llama3's ``apply_rotary_emb`` for one tensor."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis.view(1, S, 1, D // 2)).flatten(3).type_as(x)


def _grads(device: str, compiled: bool):
    g = torch.Generator().manual_seed(0)
    freqs = torch.polar(torch.ones(S, D // 2), torch.randn(S, D // 2, generator=g))
    x = torch.randn(2, S, 2, D, generator=g)
    weight = torch.randn(2, S, 2, D, generator=g)
    x = x.to(device).requires_grad_()
    fn = torch.compile(rope, backend="neuron", fullgraph=True) if compiled else rope
    out = fn(x, freqs.to(device))
    (out * weight.to(device)).sum().backward()
    return out.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_rope_backward_compiled_matches_eager(device):
    torch._dynamo.reset()
    want_out, want_grad = _grads("cpu", compiled=False)
    out, grad = _grads(device, compiled=True)
    torch.testing.assert_close(out, want_out)
    # before the fix: off by up to 6.8 where the gradient's largest element is 3.9
    torch.testing.assert_close(grad, want_grad)


def test_output_view_records_conjugate_bit():
    def f(b):
        return b * 2, torch.ops.aten._conj(b)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(4, dtype=torch.complex64))
    views = find_output_views(gm)
    assert views[0] is None
    assert views[1] == OutputView(True, 0, (4,), (1,), 0, None, conj=True, neg=False)
    base = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    made = make_view(base, OutputView(True, 0, (2,), (1,), 0, None, conj=True))
    assert made.is_conj() and made.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    torch.testing.assert_close(made.resolve_conj(), base.conj().resolve_conj())
