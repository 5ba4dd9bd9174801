"""FlexAttention on the neuron device (``neuron_compile.decompositions.flex_attention``), eager and compiled.

Values are compared with CPU eager's ``flex_attention``; gradients with a plain math reference on CPU
(scores, score_mod and mask_mod broadcast over (batch, head, q, kv), softmax, matmul), since torch 2.13
refuses FlexAttention's backward on CPU. The first tests pin the torch internals the device relies on,
so a torch upgrade that changes one fails here, by name.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from neuron_compile import traced
from neuron_compile.decompositions import flex_attention as ours
from neuron_compile.report import COUNTERS

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, H, L, E = 2, 2, 256, 16
BLOCK = 128


# ---------------------------------------------------------------- the torch internals we rely on

def test_torch_still_refuses_the_device_and_we_get_past_its_check():
    """torch's ``_validate_device`` is the check we replace; torch itself still refuses neuron (if this
    fails because torch accepts it, the replacement can go) and CPU's backward."""
    assert flex_module._validate_device is traced.flex_validate_device
    assert "_validate_device(query, key, value)" in inspect.getsource(flex_module.flex_attention)
    q = torch.zeros(1, 1, 4, 4, device="neuron")
    with pytest.raises(ValueError, match="only supported on"):
        traced.flex_checked_device(q, q, q)
    cpu = torch.zeros(1, 1, 4, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_module._validate_device(cpu, cpu, cpu)  # other devices: torch's own check, unchanged
    assert flex_module._validate_device(q, q, q) is None


def test_the_ops_dense_kernels_are_what_we_run():
    """Eager runs the forward and backward ops' CompositeExplicitAutograd kernels on neuron tensors; the
    compile path calls the forward's (``dense_kernel``) with the op's arguments."""
    import sys

    from torch._C import DispatchKey

    hop = sys.modules["torch._higher_order_ops.flex_attention"]  # the package re-exports the op under its name

    assert ours.flex_attention_op() is hop.flex_attention
    assert ours.dense_kernel() is hop.sdpa_dense
    assert list(inspect.signature(hop.sdpa_dense).parameters) == [
        "query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
        "score_mod_other_buffers", "mask_mod_other_buffers"]
    assert hop.flex_attention_backward.py_kernels[DispatchKey.CompositeExplicitAutograd] is hop.sdpa_dense_backward


def test_zeros_and_scatter_is_decomposed():
    import torch._dynamo._trace_wrapped_higher_order_op  # noqa: F401  (registers flex_lib)
    from neuron_compile.decompositions import decomposition_table

    op = torch.ops.flex_lib.zeros_and_scatter.default
    assert [a.name for a in op._schema.arguments] == ["shape", "indices", "vals"]
    assert decomposition_table()[op] is ours._zeros_and_scatter
    index, vals = torch.tensor([0, 2, 2]), torch.tensor([1.0, 2.0, 3.0])
    assert ours._zeros_and_scatter([4], [index], vals).tolist() == op([4], [index], vals).tolist() == [1, 0, 5, 0]


def test_dynamo_puts_the_op_in_the_graph_and_we_replace_it():
    from neuron_compile.decompositions.pre_autograd import decompose_before_autograd

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    q = torch.randn(1, 1, 8, 4)
    torch.compile(flex_attention, backend=capture, fullgraph=True)(q, q, q, score_mod=lambda s, b, h, i, j: s * 2)
    [gm] = graphs
    assert [n.target for n in gm.graph.nodes].count(ours.flex_attention_op()) == 1
    assert decompose_before_autograd(gm) == 1
    assert any(n.target is ours.dense_flex_attention for n in gm.graph.nodes)


# ---------------------------------------------------------------- masks and the math reference

def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(window):
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask


def documents(doc_ids):
    """Packed documents (``doc_ids``: [B, L]), causal within each."""
    def mask(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)
    return mask


def doc_ids_of(lengths):
    """[B, L] document ids: row 0 packs documents of ``lengths``, row 1 the same rolled by 7 tokens."""
    row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return torch.stack([row, row.roll(7)])


def reference(q, k, v, score_mod=None, mask_mod=None, gqa=False):
    """softmax(QK^T * scale + score_mod) with mask_mod's False as -inf, over broadcast index grids."""
    if gqa:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    b, h, i, j = (torch.arange(n).view([-1 if d == a else 1 for a in range(4)]) for d, n in enumerate(scores.shape))
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, i, j).expand(scores.shape), float("-inf"))
    return scores.softmax(-1) @ v


def _inputs(length=L, kv_heads=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, length, E, generator=g)
    k, v = (torch.randn(B, kv_heads, length, E, generator=g) for _ in range(2))
    return q, k, v


def _mods(case, bias, doc_ids):
    """(mask_mod, score_mod) of a case, reading ``bias`` [L] and ``doc_ids`` [B, L] on their device."""
    if case == "causal_bias":
        return causal, lambda score, b, h, q_idx, kv_idx: score + bias[kv_idx]
    if case == "sliding_window_gqa":
        return sliding_window(64), lambda score, b, h, q_idx, kv_idx: score - (q_idx - kv_idx) * 0.01
    if case == "documents":
        return documents(doc_ids), None
    raise KeyError(case)


CASES = ["causal_bias", "sliding_window_gqa", "documents"]


def _run(case, attention, device_mask=True):
    """One case on neuron through ``attention`` against CPU: the output against CPU eager
    flex_attention, the gradients (q, k, v and score_mod's captured bias) against the math reference.
    Returns the max abs errors."""
    gqa = case.endswith("gqa")
    q, k, v = _inputs(kv_heads=1 if gqa else H)
    bias, doc_ids = torch.randn(L) * 0.5, doc_ids_of([40, 100, 116])
    mask_mod, score_mod = _mods(case, bias, doc_ids)
    expected = flex_attention(q, k, v, score_mod=score_mod, enable_gqa=gqa,
                              block_mask=create_block_mask(mask_mod, B, None, L, L, device="cpu", BLOCK_SIZE=BLOCK))

    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    mask_mod, score_mod = _mods(case, leaves[3], doc_ids)
    grad_out = torch.randn(B, H, L, E)
    reference(*leaves[:3], score_mod, mask_mod, gqa).backward(grad_out)

    on_device = [t.to("neuron").requires_grad_() for t in (q, k, v, bias)]
    mask_mod, score_mod = _mods(case, on_device[3], doc_ids.to("neuron"))
    if device_mask:
        block_mask = create_block_mask(mask_mod, B, None, L, L, device="neuron", BLOCK_SIZE=BLOCK)
    else:  # made on CPU, moved (its mask_mod's tensors stay where they are: none here)
        block_mask = create_block_mask(mask_mod, B, None, L, L, device="cpu", BLOCK_SIZE=BLOCK).to("neuron")
    out = attention(*on_device[:3], score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)
    out.backward(grad_out.to("neuron"))

    torch.testing.assert_close(out.detach().cpu(), expected)
    errors = {"out": (out.detach().cpu() - expected).abs().max().item()}
    for name, got, want in zip("qkv", on_device, leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-5)
        errors[name] = (got.grad.cpu() - want.grad).abs().max().item()
    if case == "causal_bias":  # a sum over every (b, h, q) of a row: relative to its size
        torch.testing.assert_close(on_device[3].grad.cpu(), leaves[3].grad, rtol=1e-5, atol=1e-4)
        errors["bias"] = (on_device[3].grad.cpu() - leaves[3].grad).abs().max().item()
    else:
        assert on_device[3].grad is None
    print(case, {k: f"{e:.1e}" for k, e in errors.items()})  # the figures of docs/flex_attention.md (-s)
    return errors


@pytest.mark.parametrize("case", CASES)
def test_eager_matches_cpu(case):
    _run(case, flex_attention)


@pytest.mark.parametrize("case", CASES)
def test_compiled_matches_cpu(case):
    counter = CompileCounterWithBackend("neuron")
    _run(case, torch.compile(flex_attention, backend=counter, fullgraph=True), device_mask=case != "causal_bias")
    assert counter.frame_count == 1


def test_compiled_returns_logsumexp_as_cpu():
    q, k, v = (t.to("neuron") for t in _inputs())
    block_mask = create_block_mask(causal, B, None, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    expected, aux = flex_attention(*_inputs(), block_mask=block_mask, return_aux=AuxRequest(lse=True))
    out, got = torch.compile(flex_attention, backend="neuron")(q, k, v, block_mask=block_mask.to("neuron"),
                                                              return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(got.lse.cpu(), aux.lse)


class Attention(torch.nn.Module):
    """A user's attention layer: fused qkv projection, flex_attention on (B, H, L, E) views, output."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(H * E, 3 * H * E)
        self.out = torch.nn.Linear(H * E, H * E)

    def forward(self, x, block_mask, attend=flex_attention):
        b, length, _ = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, H, E).permute(2, 0, 3, 1, 4)  # strided views, as models make
        y = attend(q, k, v, block_mask=block_mask)
        return self.out(y.transpose(1, 2).reshape(b, length, H * E))


def test_compiled_layer_trains_with_changing_documents_and_lengths():
    """Packed documents change every step (no recompile: the document ids are an input of the graph); a
    new length compiles once more, dynamic, and a third length reuses that graph (lengths of one block
    would be a size-1 dim, which Dynamo specializes). The block masks come from
    ``torch.compile(create_block_mask)`` (TorchTitan's way: the default backend on neuron tensors is ours).
    Outputs and weight gradients as the math reference's on CPU."""
    torch.manual_seed(0)
    cpu_layer = Attention()
    layer = Attention().to("neuron")
    layer.load_state_dict(cpu_layer.state_dict())
    counter = CompileCounterWithBackend("neuron")
    compiled = torch.compile(layer, backend=counter)
    make_mask = torch.compile(create_block_mask)
    frames, mask_graphs = [], []
    for length, docs in [(256, [40, 100, 116]), (256, [128, 128]), (384, [200, 184]), (512, [10, 300, 202])]:
        x = torch.randn(B, length, H * E)
        doc_ids = doc_ids_of(docs)
        graphs = COUNTERS["graphs"]
        block_mask = make_mask(documents(doc_ids.to("neuron")), B, None, length, length, device="neuron",
                               BLOCK_SIZE=BLOCK)
        mask_graphs.append(COUNTERS["graphs"] - graphs)
        out = compiled(x.to("neuron"), block_mask)
        out.square().mean().backward()

        cpu_layer.zero_grad()
        mask_mod = documents(doc_ids)
        want = cpu_layer(x, None, attend=lambda q, k, v, block_mask: reference(q, k, v, mask_mod=mask_mod))
        want.square().mean().backward()
        torch.testing.assert_close(out.detach().cpu(), want)
        worst = 0.0
        for name, p in layer.named_parameters():
            want_grad = dict(cpu_layer.named_parameters())[name].grad
            torch.testing.assert_close(p.grad.cpu(), want_grad, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{name} at {length}: {m}")
            worst = max(worst, (p.grad.cpu() - want_grad).abs().max().item())
        print(length, f"out {(out.detach().cpu() - want).abs().max().item():.1e} weight grads {worst:.1e}")
        layer.zero_grad()
        frames.append(counter.frame_count)
    assert frames == [1, 1, 2, 2]
    assert mask_graphs == [1, 0, 1, 0]  # compiled by us, not Inductor; dynamic from the second length
