"""Shape bucketing: compiled once with dynamic shapes, called at many lengths, equal to eager.

Lengths include 1, 127, 128, 129 and one above 512. Counts: XLA compiles equal
the number of distinct buckets each graph touched.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_compile
from neuron_compile import COUNTERS
from neuron_compile.bucketing.sizes import round_up

LENGTHS = [1, 127, 128, 129, 600, 5]


def bucket_reports():
    return [r for r in neuron_compile.compile_reports() if r.signature.startswith("bucket")]


def assert_one_compile_per_bucket(length_buckets=(128, 256, 640)):
    """Every XLA compile is a distinct (graph, bucket); the graph with a symbolic length touched these."""
    touched = {(r.graph, r.signature) for r in bucket_reports()}
    assert COUNTERS["xla_compiles"] == len(touched) == len(bucket_reports())
    per_graph = {}
    for graph, signature in touched:
        per_graph.setdefault(graph, set()).add(signature)
    # Dynamo specializes a length of 1; from the second length on the length is symbolic
    widest = max(per_graph.values(), key=len)
    assert len(widest) == len(length_buckets), per_graph
    assert COUNTERS["bucketing_fallbacks"] == 0


def test_round_up_arithmetic():
    assert [round_up(n, 128) for n in (1, 127, 128, 129, 600)] == [128, 128, 128, 256, 640]
    assert [round_up(n, (64, 256, 1024)) for n in (1, 64, 65, 300, 1025)] == [64, 64, 256, 1024, 2048]


def test_options_parse_buckets(monkeypatch):
    from neuron_compile.options import Options

    assert Options.resolve({}).buckets == 128
    assert Options.resolve({"buckets": "64,512,256"}).buckets == (64, 256, 512)
    monkeypatch.setenv("NEURON_COMPILE_BUCKETS", "off")
    assert Options.resolve({}).buckets == 0
    with pytest.raises(ValueError, match="buckets"):
        Options.resolve({"buckets": "big"})


class TokenMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 48)
        self.down = nn.Linear(48, 16)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


def test_mlp_over_tokens_one_compile_per_bucket():
    model = TokenMLP()
    c = torch.compile(model, backend="neuron")
    with torch.no_grad():
        for t in LENGTHS:
            x = torch.randn(3, t, 16)
            torch.testing.assert_close(c(x), model(x))
    # t=1 compiles statically (automatic dynamic shapes needs a second length); from t=127 on
    # the sequence dim is symbolic: buckets 128, 256, 640
    assert len(bucket_reports()) == 3
    assert {r.signature.split("->")[-1] for r in bucket_reports()} == {"128", "256", "640"}
    assert COUNTERS["xla_compiles"] == 1 + 3
    assert COUNTERS["bucketing_fallbacks"] == 0


def masked_mean(x, mask):
    return (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), x.mean(dim=1)


def softmax_over_sequence(x):
    return x.softmax(dim=1), torch.log_softmax(x, dim=1).amax(dim=1)


@pytest.mark.parametrize("fn", [masked_mean, softmax_over_sequence])
def test_reductions_over_the_padded_dim_see_their_identity(fn):
    c = torch.compile(fn, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x = torch.randn(2, t, 8) + 3.0  # non-zero mean: padding zeros would bias a mean
        args = (x,) if fn is softmax_over_sequence else (x, (torch.rand(2, t) > 0.3).float() + 0.01)
        for got, want in zip(c(*args), fn(*args)):
            torch.testing.assert_close(got, want)
    assert_one_compile_per_bucket()


class CausalSelfAttention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


def test_causal_self_attention_inference_and_training():
    model = CausalSelfAttention()
    c = torch.compile(model, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x = torch.randn(2, t, 32)
        model.zero_grad()
        out = c(x)
        out.square().mean().backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        ref = model(x)
        ref.square().mean().backward()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)
    graphs = {r.graph for r in bucket_reports()}
    assert any(g.endswith("forward") for g in graphs) and any(g.endswith("backward") for g in graphs)
    # dynamic=True marks batch and length symbolic: both are bucketed (batch 2 -> 128)
    assert_one_compile_per_bucket()


def test_cumsum_is_exact_in_place_and_flip_falls_back_to_exact_shapes():
    def prefix(x):
        return torch.cumsum(x, dim=1) * 2  # prefix sums never read the padded tail: bucketed

    def reverse(x):
        return torch.flip(x, dims=[1]).cumsum(1)  # flip moves padding to the front: exact shapes

    cp = torch.compile(prefix, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x = torch.randn(2, t)
        torch.testing.assert_close(cp(x), prefix(x))
    assert_one_compile_per_bucket()

    neuron_compile.reset()
    torch._dynamo.reset()
    cr = torch.compile(reverse, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x = torch.randn(2, t)
        torch.testing.assert_close(cr(x), reverse(x))
    assert COUNTERS["bucketing_fallbacks"] >= 1
    fallbacks = [r for r in neuron_compile.compile_reports() if not r.signature.startswith("bucket")]
    # the symbolic graph compiles once per exact length it sees (127, 128, 129, 600, 5)
    assert len([r for r in fallbacks if r.signature]) == 5


TINY = {
    "gpt2": dict(vocab_size=128, n_embd=32, n_layer=1, n_head=2, n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0),
    "llama": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256),
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TINY))
def test_transformers_causal_lm_one_executable_per_bucket(arch):
    """Issue 21: a Hugging Face causal LM with dynamic=True at 6 lengths over 2 buckets, inference
    and a training step, equal to eager, one executable per bucket per graph (the mask functions
    index position ids with aranges; the loss is a cross-entropy over shifted, padded labels)."""
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    cfg = transformers.AutoConfig.for_model(arch, **TINY[arch], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    c = torch.compile(model, backend="neuron", dynamic=True)
    for t in [37, 64, 100, 129, 200, 250]:
        ids = torch.randint(0, 128, (2, t))
        torch._dynamo.mark_static(ids, 0)  # the length is what changes here
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(c(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        model.train()
        model.zero_grad()
        loss = c(input_ids=ids, labels=ids).loss
        loss.backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        ref = model(input_ids=ids, labels=ids).loss
        ref.backward()
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name], p.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert COUNTERS["bucketing_fallbacks"] == 0
    per_graph = {}
    for graph, signature in {(r.graph, r.signature) for r in bucket_reports()}:
        per_graph.setdefault(graph, set()).add(signature)
    # an inference graph, a forward and a backward, each compiled once per bucket (128, 256)
    kinds = sorted(g.rsplit(".", 1)[-1] for g in per_graph)
    assert kinds == ["backward", "forward", "inference"], per_graph
    assert all(len(s) == 2 for s in per_graph.values()), per_graph
    assert COUNTERS["xla_compiles"] == len(bucket_reports()) == 6


def test_a_size_only_the_backward_reads_as_a_value():
    # adaptive_avg_pool2d(x, 1)'s backward divides by H * W, sizes the backward graph gets as values
    # (not from a tensor it pads); the bucketing interpreter had no true value for them (KeyError)
    def fn(x):
        return F.adaptive_avg_pool2d(x, 1) * 3

    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    for shape in [(2, 3, 10, 9), (3, 3, 7, 7), (4, 2, 11, 3)]:
        x = torch.randn(*shape, requires_grad=True)
        twin = x.detach().clone().requires_grad_()
        weight = torch.randn(shape[0], shape[1], 1, 1)
        out = compiled(x)
        (out * weight).sum().backward()
        want = fn(twin)
        (want * weight).sum().backward()
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x.grad, twin.grad)
