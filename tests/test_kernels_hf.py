"""Hugging Face's ``kernels`` library and transformers' ``KernelConfig`` with our local kernel repository:
a tiny Llama's RMSNorm layers swapped for ``neuron::rms_norm`` (no download), its attention on
``neuron::attention`` (``attn_implementation="neuron"``), compiled against the unchanged model eagerly."""

from __future__ import annotations

import pytest
import torch

import neuron_compile

pytest.importorskip("kernels", reason="Hugging Face kernels is in the test extra")
transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")


def _llama(attn_implementation: str):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                      attn_implementation=attn_implementation)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _served():
    return sorted(k["kernel"] for r in neuron_compile.compile_reports() for k in r.kernels)


def test_kernelize_with_the_local_repository(monkeypatch):
    from kernels import Mode

    from neuron_compile.kernels import hf
    from neuron_compile.kernels.attention import register_transformers_attention

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the Hub
    reference = _llama("sdpa")
    model = _llama(register_transformers_attention())
    ids = torch.randint(0, 64, (2, 8))
    hf.kernelize(model, device="neuron", mode=Mode.INFERENCE)
    assert model.model.norm.forward.__func__ is not type(model.model.norm).forward  # the layer was swapped
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(model(ids).logits, expected)  # eagerly: the ops' own implementations
        torch.testing.assert_close(torch.compile(model, backend="neuron")(ids).logits, expected)
    assert _served() == ["neuron::attention"] + ["neuron::rms_norm"] * 3


def test_kernel_config_on_the_neuron_device(monkeypatch):
    from neuron_compile.kernels import hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reference = _llama("sdpa")
    ids = torch.randint(0, 64, (2, 8))
    model = _llama("sdpa").to("neuron")
    hf.kernelize(model, kernel_config=hf.kernel_config())  # local paths resolve for the model's device
    with torch.no_grad():
        out = torch.compile(model)(ids.to("neuron")).logits.cpu()
        torch.testing.assert_close(out, reference(ids).logits)
    assert _served().count("neuron::rms_norm") == 3
