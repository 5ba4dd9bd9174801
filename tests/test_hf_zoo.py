"""The zoo of every causal LM (benchmarks/hf_zoo.py): its tiny configs, and what it found.

- ``zoo_configs.tiny_config`` shrinks an architecture's own default config without
  breaking its structure; the architectures here broke a generic shrink (hybrid
  layer lists, sub-configs, MLA, grouped MoE routing, per-layer sizes, KV sharing).
- afmoe's "wrong logits" were ties: its router is zero-initialized, every expert
  scores the same, and CPU eager's ``topk`` picks other experts among equal
  scores than XLA's. The zoo gives all-zero weight matrices random values; a
  routing block like afmoe's then matches eager call after call.
- The zoo's own driver runs a worker per architecture and classifies the result.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import hf_zoo  # noqa: E402
import zoo_configs  # noqa: E402


@pytest.mark.parametrize("arch", [
    "blt",             # sub-configs under their own names (patcher_config, global_config), hash vocabularies
    "gemma3n_text",    # per-layer intermediate sizes, layers sharing another's KV cache
    "bailing_hybrid",  # linear + full attention layers, grouped MoE routing, num_experts_per_token
    "deepseek_v3",     # MLA: head_dim is the rotary part
    "mamba2",          # num_heads * head_dim == hidden_size * expand
    "lfm2_moe",        # no layer_types in its default
])
def test_tiny_configs_build_and_run_eagerly(arch):
    model, kwargs = hf_zoo.build(arch)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    with torch.no_grad():
        logits = model(**kwargs).logits
    assert logits.shape[:2] == kwargs["input_ids"].shape and torch.isfinite(logits).all()


def test_per_layer_lists_keep_one_layer_of_each_kind():
    cut = zoo_configs._cut_layers(["sliding", "sliding", "sliding", "full"] * 3, 12)
    assert cut == ["sliding", "full"]
    assert zoo_configs._cut_layers("M-M-M*-", 7) == "M-*"
    kw = zoo_configs.shrink({"num_hidden_layers": 6, "layer_types": ["a", "b", "c", "a", "b", "c"],
                             "mlp_types": ["dense"] * 6})
    assert kw["num_hidden_layers"] == 3 and kw["layer_types"] == ["a", "b", "c"] and kw["mlp_types"] == ["dense"] * 3
    # layer indices are not one kind per layer: llama4's moe_layers kept all 48 layers
    kw = zoo_configs.shrink({"num_hidden_layers": 48, "moe_layers": list(range(48)), "no_rope_layers": [1, 0] * 24,
                             "dense_layer_ids": [5, 11, 17]})
    assert kw["num_hidden_layers"] == 2 and kw["moe_layers"] == [0, 1] and kw["no_rope_layers"] == [1, 0]
    assert kw["dense_layer_ids"] == [1]


def test_zero_initialized_router_gets_random_values():
    model, _ = hf_zoo.build("afmoe")
    assert model.reinitialized and all("router.gate" in n for n in model.reinitialized)
    gate = model.get_submodule(model.reinitialized[0].rsplit(".", 1)[0])
    assert gate.weight.abs().min() > 0


class SigmoidTopKMoE(torch.nn.Module):
    """afmoe's routed experts: sigmoid scores, top-k with a bias, weights gathered and
    normalized, one_hot expert masks, per-expert ``where`` and ``index_add_``; an
    expert that receives no token is skipped by the mask, not by control flow."""

    def __init__(self, hidden=16, experts=8, k=2, ffn=8):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(experts), requires_grad=False)
        self.up = torch.nn.Parameter(torch.randn(experts, ffn, hidden) * 0.1)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, ffn) * 0.1)
        self.k, self.experts = k, experts

    def forward(self, x):
        scores = torch.sigmoid(self.gate(x).float())
        _, chosen = torch.topk(scores + self.bias, k=self.k, dim=1)
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, self.experts).permute(2, 1, 0)  # expert, k, token
        for e in range(self.experts):
            w = (mask[e].to(x.dtype) * weights.t()).sum(0)  # the token's weight for expert e, 0 if not routed
            h = torch.nn.functional.silu(x @ self.up[e].t()) @ self.down[e].t()
            out.index_add_(0, torch.arange(x.shape[0]), h * w[:, None])
        return out


def test_topk_routing_matches_eager_call_after_call():
    torch.manual_seed(0)
    moe = SigmoidTopKMoE()
    compiled = torch.compile(moe, backend="neuron")
    for step in range(4):
        x = torch.randn(12, 16)
        if step == 2:  # every token to the same two experts: six experts receive nothing
            moe.bias.data = torch.tensor([0, 0, 5.0, 5.0, 0, 0, 0, 0])
        torch.testing.assert_close(compiled(x), moe(x), rtol=1e-5, atol=1e-6)


def test_the_driver_classifies_a_model_that_fails_eagerly(tmp_path):
    # a name transformers does not know: does-not-build, with why, nothing compiled
    proc = subprocess.run([sys.executable, str(BENCH / "hf_zoo.py"), "--arch", "no_such_arch", "--out", str(tmp_path),
                           "--jobs", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "hf_zoo.json").read_text())["no_such_arch"]["error"]
    assert entry["inference"] == entry["training"] == "does-not-build" and "no_such_arch" in entry["error"]
    table = (tmp_path / "hf_zoo.md").read_text()
    assert "| no_such_arch | does-not-build | does-not-build |" in table
    assert "0/0" in table  # none built, none counted


@pytest.mark.slow
def test_device_mode_runs_an_architecture_through_the_scripts_own_worker():
    # save, from_pretrained(device_map="neuron"), logits, static-cache generate (compiled by
    # transformers itself), one eager training step: each against the CPU copy
    result = hf_zoo.device_worker("gpt2")
    assert (result["inference"], result["generate"], result["training"]) == ("pass", "pass", "pass"), result
    assert result["generate_compiled"] >= 1  # generate's forward went through our backend


def test_device_mode_tells_a_near_tie_from_a_wrong_token():
    from types import SimpleNamespace

    logits = torch.zeros(1, 8)
    logits[0, 3], logits[0, 5] = 1.0, 1.0 - 1e-6  # CPU picks 3; 5 scores within 1e-4 of it
    want = SimpleNamespace(sequences=torch.tensor([[7, 7, 3]]), logits=(logits,))
    assert hf_zoo._generate_verdict(SimpleNamespace(sequences=torch.tensor([[7, 7, 3]])), want) == ("pass", "")
    status, why = hf_zoo._generate_verdict(SimpleNamespace(sequences=torch.tensor([[7, 7, 5]])), want)
    assert status == "pass" and why.startswith("tie")
    logits[0, 5] = 0.5
    status, why = hf_zoo._generate_verdict(SimpleNamespace(sequences=torch.tensor([[7, 7, 5]])), want)
    assert status == "mismatch" and "device 5, CPU 3" in why


def test_device_mode_driver_writes_its_own_table(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "hf_zoo.py"), "--device", "neuron", "--arch", "no_such_arch",
                           "--out", str(tmp_path), "--jobs", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "hf_zoo_device.json").read_text())["no_such_arch"]["device"]
    assert entry["inference"] == entry["generate"] == entry["training"] == "does-not-build"
    assert "| no_such_arch | does-not-build | does-not-build |" in (tmp_path / "hf_zoo_device.md").read_text()
    assert not (tmp_path / "hf_zoo.json").exists()
