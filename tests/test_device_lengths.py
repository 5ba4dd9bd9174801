"""Lengths that grow one token at a time compile once per 128-bucket, with CPU's results.

A sampling loop without a KV cache (nanoGPT's ``sample.py``) runs the model on a sequence one token
longer each step. An op whose dim keeps changing size runs padded to the bucket of that size
(``neuron_compile/device/lengths.py``), so after the first few tokens a new token compiles nothing.
Each test runs the same code on CPU and on ``neuron`` and compares; counts are asserted where they
are the point.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from neuron_compile.device import lengths
from neuron_compile.device import ops as device_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _lengths_on(monkeypatch):
    """Growing lengths everywhere (``NEURON_COMPILE_DEVICE_LENGTHS=1``): by default only where no autograd
    graph is recorded; the tests of the default unset it."""
    monkeypatch.setenv("NEURON_COMPILE_DEVICE_LENGTHS", "1")


class _Block(torch.nn.Module):
    """nanoGPT's block: causal self-attention through a ``tril`` buffer, then a GELU MLP."""

    def __init__(self, width, heads, positions):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.c_attn, self.c_proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc, self.proj = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions)).view(1, 1, positions, positions))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class _GPT(torch.nn.Module):
    def __init__(self, vocab=50, width=48, heads=4, layers=2, positions=64):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, width), torch.nn.Embedding(positions, width)
        self.blocks = torch.nn.ModuleList(_Block(width, heads, positions) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)[:, [-1], :])


def _sample(device, tokens=40, batch=1):
    """nanoGPT sample.py's loop: logits of the last position over a temperature, softmax, multinomial
    (CPU's generator on both devices: the same draws), cat. Returns the tokens and compiles per token."""
    torch.manual_seed(0)
    model = _GPT().eval().to(device)
    idx = torch.randint(0, 50, (batch, 4)).to(device)
    compiles, snapshot = [], {}
    with torch.no_grad():
        for token in range(tokens):
            if token == 13:  # each bucketed op's kernels so far
                snapshot.update(_kernels())
            before = device_ops.COUNTS["op_compiles"]
            logits = model(idx)[:, -1, :] / 0.8
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
            compiles.append(device_ops.COUNTS["op_compiles"] - before)
    return idx.cpu(), compiles, snapshot


def _kernels() -> dict:
    return {id(f): (f.op, len(f.kernels)) for f in lengths._FAMILIES.values() if not isinstance(f, str)}


def test_sampling_40_tokens_compiles_once_per_op_per_bucket(monkeypatch):
    monkeypatch.delenv("NEURON_COMPILE_DEVICE_LENGTHS")  # the default: sampling runs under no_grad
    # a length's sighting is recorded when its signature misses: exact kernels another test compiled
    # in this process would hide some lengths (the counts below are the point)
    device_ops.clear_kernels()
    expected, _, _ = _sample("cpu")
    got, compiles, snapshot = _sample("neuron")
    assert_close(got, expected, rtol=0, atol=0)  # the same tokens: padding never reaches a value
    # exact shapes for the first lengths, then the bucketed kernels: after the first few tokens at
    # most one op compiles per length (x[:, [-1], :]'s aten.index.Tensor); every other op runs one
    # bucket's executable
    assert all(c <= 1 for c in compiles[13:]), (compiles, lengths.refused())
    assert len(snapshot) > 10, "the forward did not run bucketed"
    # from token 13 to 40 (lengths 17 to 43, one bucket) no bucketed op compiled another kernel
    after = _kernels()
    assert {k: v for k, v in after.items() if k in snapshot} == snapshot
    assert all(n <= 1 for k, (_, n) in after.items() if k not in snapshot)


def test_sampling_a_batch_matches_cpu_through_cpps_own_views(monkeypatch):
    """Two sequences at once: the ids' growing length is an inner dim of a bucket, and C++ ``embedding``
    reshapes them (a clone it ``_unsafe_view``s, past the device's ``view``: it raised before the device took
    ``_unsafe_view``), by default under no_grad."""
    monkeypatch.delenv("NEURON_COMPILE_DEVICE_LENGTHS")
    before = device_ops.COUNTS["bucketed_ops"]
    got, _, _ = _sample("neuron", tokens=14, batch=2)
    assert device_ops.COUNTS["bucketed_ops"] > before
    expected, _, _ = _sample("cpu", tokens=14, batch=2)
    assert_close(got, expected, rtol=0, atol=0)


def _train_growing(device, lengths_range=range(4, 20)):
    """A training step (forward, backward) of the nanoGPT model at each length: each parameter's gradients."""
    torch.manual_seed(0)
    model = _GPT().to(device)
    idx = torch.randint(0, 50, (2, 24)).to(device)
    grads = []
    for t in lengths_range:
        model.zero_grad()
        model(idx[:, :t]).pow(2).mean().backward()
        grads.append([p.grad.cpu().clone() for p in model.parameters()])
    return grads


def test_training_on_growing_lengths_stays_exact_by_default(monkeypatch):
    """By default an op runs bucketed only where autograd records nothing and no backward runs: a training
    step at growing lengths after a sampling loop bucketed the same ops (a Hugging Face XLNet trained after a
    ``generate``) keeps exact shapes, and CPU's gradients. (Bucketed there, with ``=1``, a gradient with a
    bucket's strides reached autograd's C++ ``view``, ``ViewBackward0``, which refused it.)"""
    monkeypatch.delenv("NEURON_COMPILE_DEVICE_LENGTHS")
    _sample("neuron", tokens=16)  # the forward's ops bucketed, under no_grad
    before = device_ops.COUNTS["bucketed_ops"]
    assert_close(_train_growing("neuron"), _train_growing("cpu"), rtol=1e-4, atol=1e-5)
    assert device_ops.COUNTS["bucketed_ops"] == before


def test_reductions_over_a_growing_dim_are_exact():
    """Reductions, scans and normalizations over the padded dim see their identity in the padding."""

    def run(x):
        return (x.sum(1), x.mean(1), x.amax(1), x.softmax(1), x.log_softmax(1), x.cumsum(1), x.var(1),
                x.argmax(1), torch.cat([x, x[:, :1]], 1), F.layer_norm(x.transpose(1, 2), (x.size(1),)))

    device_ops.clear_kernels()  # every length a signature miss (its sighting recorded), whatever ran before
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)
    device_x = x.to("neuron")
    per_length = []
    for _ in range(20):  # the tensor grows on the device, one column a step (as a sampling loop's)
        count = device_ops.COUNTS["op_compiles"]
        got = run(device_x)
        for a, b in zip(got, run(x)):
            assert_close(a.cpu(), b)
        per_length.append(device_ops.COUNTS["op_compiles"] - count)
        column = torch.randn(3, 1, 4)
        x, device_x = torch.cat([x, column], 1), torch.cat([device_x, column.to("neuron")], 1)
    assert max(per_length[12:]) <= 1, per_length  # the test's own cat of a host column: once per length


def test_an_op_that_moves_data_across_the_padding_keeps_exact_shapes():
    """``flip`` along a growing dim cannot run padded (the padding would land first): it compiles per
    length, with CPU's results, and says why."""
    for t in range(5, 10):
        x = torch.randn(2, t)
        assert_close(x.to("neuron").flip(1).cpu(), x.flip(1))
    assert "aten.flip.default" in lengths.refused()


def test_a_view_the_bucket_strides_refuse_is_a_copy_and_writes_through_either_raise():
    """``scores.view(-1)`` of attention scores padded along their inner dim is taken of a dense copy
    (the bucket's strides refuse it): its values are CPU's, and a write to either tensor while both live
    raises (on CPU they alias), naming the op; once the copy is gone the base takes writes again."""
    torch.manual_seed(0)
    for t in range(5, 12):  # a length that grows: the scores end up on a bucket's storage
        q = torch.randn(1, 2, t, 8)
        device_q = q.to("neuron")
        scores, device_scores = q @ q.transpose(-2, -1), device_q @ device_q.transpose(-2, -1)
    assert not device_scores.is_contiguous()  # the bucket's strides (documented)
    flat = device_scores.view(-1)
    assert_close(flat.cpu(), scores.view(-1))
    with pytest.raises(RuntimeError, match=r"aten.add_.Tensor writes .* alias.*test_device_lengths.py"):
        flat.add_(1)
    with pytest.raises(RuntimeError, match=r"aten.mul_.Tensor .*NEURON_COMPILE_DEVICE_LENGTHS"):
        device_scores.mul_(2)
    del flat
    device_scores.mul_(2)  # no copy lives: the write has nobody to miss it
    assert_close(device_scores.cpu(), scores * 2)


def _hf_sample(device, tokens, settled=14):
    """Hugging Face GPT-2 unchanged (SDPA attention), sampled one token at a time with no cache: its
    position ids come from ``torch.arange(t, device=)`` and, through C++ SDPA's causal path, its mask
    from ``ones(t, t).tril()``; the head size (16) lies among the lengths. Returns the tokens, per token
    the kernels built (``ops._build``: traces and exact compiles) and the ops compiled (bucketed ones
    too), and each bucketed op's kernels at token ``settled``. A training step runs first (exact shapes:
    grad is recorded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(device)
    batch = torch.randint(0, 64, (2, 32)).to(device)
    model(input_ids=batch, labels=batch).loss.backward()  # a training step first, as a fine-tune then sample
    model.eval()
    idx = torch.randint(0, 64, (1, 4)).to(device)
    built, per_token, compiles, snapshot = [], [], [], {}
    original = device_ops._build

    def counted(op, *args):
        built.append(str(op))
        return original(op, *args)

    device_ops._build = counted
    try:
        with torch.no_grad():
            for token in range(tokens):
                if token == settled:
                    snapshot.update(_kernels())
                built.clear()
                before = device_ops.COUNTS["op_compiles"]
                logits = model(input_ids=idx).logits[:, -1, :]
                idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
                per_token.append(list(built))
                compiles.append(device_ops.COUNTS["op_compiles"] - before)
    finally:
        device_ops._build = original
    return idx.cpu(), per_token, compiles, snapshot


def test_hugging_face_sampling_builds_nothing_once_every_op_is_bucketed(monkeypatch):
    """A causal mask made by ``ones(t, t)`` sits in a bucket padded along both dims (a leading-dim bucket
    gave its ``tril`` a new layout and kernel each token); ``arange(t)`` into arange's empty ``out`` is
    bucketed (it was traced each token); a length equal to the head size stays bucketed (it compiled
    every op of attention at exact shapes once more, and the ops after it for the next two tokens), and a
    head size beside a length that grew to it at another call site of one signature (``q @ k.T`` and
    ``attn @ v``) stays a width: the storage of a bucketed view says which of its dims are lengths."""
    monkeypatch.delenv("NEURON_COMPILE_DEVICE_LENGTHS")
    device_ops.clear_kernels()
    lengths.forget()
    expected, _, _, _ = _hf_sample("cpu", 24)
    got, per_token, compiles, snapshot = _hf_sample("neuron", 24)
    assert_close(got, expected, rtol=0, atol=0)
    # lengths 4 to 27 (the head size 16 at token 12): nothing built or compiled from length 18 on
    assert all(not built for built in per_token[14:]), [(i, b) for i, b in enumerate(per_token) if b]
    assert not any(compiles[14:]), compiles
    assert len(snapshot) > 10, "the forward did not run bucketed"
    assert _kernels() == snapshot  # no bucketed op compiled another kernel in the bucket


_WARM_SAMPLER = '''
import json, sys, torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel
from neuron_compile.device import lengths, ops, trace
from neuron_compile.report import COUNTERS

counts = {"traces": 0, "analyses": 0}
trace_op, analyze = trace.trace_op, lengths._analyze
def counted_trace(*args, **kwargs):
    counts["traces"] += 1
    return trace_op(*args, **kwargs)
def counted_analyze(*args, **kwargs):
    counts["analyses"] += 1
    return analyze(*args, **kwargs)
trace.trace_op, lengths._analyze = counted_trace, counted_analyze

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64, attn_pdrop=0.0,
                    resid_pdrop=0.0, embd_pdrop=0.0)
model = GPT2LMHeadModel(config).eval().to("neuron")
idx = torch.randint(0, 64, (1, 4)).to("neuron")
with torch.no_grad():
    for _ in range(20):  # lengths 4 to 23: exact shapes first, then one bucket
        logits = model(input_ids=idx).logits[:, -1, :]
        idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
tokens = idx.cpu().tolist()
families = sum(not isinstance(f, str) for f in lengths._FAMILIES.values())
print(json.dumps({"tokens": tokens, "families": families, "bucketed_kernels": sum(
    len(f.kernels) for f in lengths._FAMILIES.values() if not isinstance(f, str)), "op_compiles": ops.COUNTS["op_compiles"],
    "index_hits": ops.COUNTS["index_hits"], "xla_compiles": COUNTERS["xla_compiles"], **counts}))
'''


@pytest.mark.slow
def test_a_warm_process_sampling_at_growing_lengths_traces_and_compiles_nothing(tmp_path):
    """Bucketed families (their padding analysis) and their kernels at each bucket are in the op index
    like any kernel: a second process running the same sampling loop finds them there (it traced each
    family symbolically and each bucket's kernel again, 9-54 s a run of a char-level model's sampler)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NEURON_COMPILE_DEVICE_LENGTHS", None)  # the default: sampling under no_grad runs bucketed
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _WARM_SAMPLER], env=env, capture_output=True, text=True,
                              timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["families"] > 10 and cold["analyses"] >= cold["families"] and cold["traces"] > 0, cold
    assert warm["tokens"] == cold["tokens"]
    assert warm["families"] == cold["families"] and warm["bucketed_kernels"] == cold["bucketed_kernels"], warm
    assert warm["traces"] == warm["analyses"] == warm["op_compiles"] == warm["xla_compiles"] == 0, warm
    assert warm["index_hits"] >= warm["families"] + warm["bucketed_kernels"], warm
