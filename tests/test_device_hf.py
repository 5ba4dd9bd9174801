"""Hugging Face scripts, unchanged, on the ``neuron`` device: loading, saving, and ``generate``.

Each test runs the same calls on CPU and compares: weights after a save and
load, tokens from ``generate`` (greedy and seeded sampling). ``generate`` with
a static cache compiles the forward by itself on ``neuron`` (transformers'
``_valid_auto_compile_criteria`` lists the device) through ``torch.compile``'s
default backend, which sends neuron graphs to ours.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from neuron_compile import report
from neuron_compile.device import op_queue

transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
pytestmark = pytest.mark.slow


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=128, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_from_pretrained_onto_the_device_and_save_pretrained_from_it(tmp_path):
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    cpu = transformers.GPT2LMHeadModel(cfg).eval()
    cpu.save_pretrained(tmp_path / "cpu")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "cpu", device_map="neuron")
    assert model.device.type == "neuron"
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as on CPU
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        assert_close(model(ids.to("neuron")).logits.cpu(), cpu(ids).logits)
    # save_pretrained tells tied from distinct weights by storage address: each parameter has its own
    model.save_pretrained(tmp_path / "neuron")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neuron")
    for (name, want), got in zip(cpu.state_dict().items(), again.state_dict().values()):
        assert_close(got, want, msg=name)
    assert again.lm_head.weight is again.transformer.wte.weight


def test_generate_with_a_static_cache_compiles_by_itself_and_gives_cpu_tokens():
    cpu = _llama()
    model = _llama().to("neuron")
    ids = torch.randint(2, 128, (1, 5))
    kwargs = dict(max_new_tokens=6, cache_implementation="static")
    want = cpu.generate(ids, do_sample=False, **kwargs)
    torch._dynamo.reset()
    graphs, reports = torch._dynamo.utils.counters["stats"]["unique_graphs"], len(report.compile_reports())
    got = model.generate(ids.to("neuron"), do_sample=False, **kwargs)
    assert got.device.type == "neuron" and got.cpu().tolist() == want.tolist()
    # Dynamo captured the forward and our backend compiled it (the device's eager ops report "eager")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert "inference" in {r.kind for r in report.compile_reports()[reports:]}
    # the same call again reuses every executable (once what the first started building in the background,
    # its attention as one op: whole_ops, is built)
    op_queue.wait_for_builds()
    lowerings, compiles = report.COUNTERS["lowerings"], report.COUNTERS["xla_compiles"]
    assert model.generate(ids.to("neuron"), do_sample=False, **kwargs).cpu().tolist() == want.tolist()
    assert (report.COUNTERS["lowerings"], report.COUNTERS["xla_compiles"]) == (lowerings, compiles)
    # seeded sampling draws the CPU generator's numbers
    torch.manual_seed(3)
    want = cpu.generate(ids, do_sample=True, top_k=20, **kwargs)
    torch.manual_seed(3)
    got = model.generate(ids.to("neuron"), do_sample=True, top_k=20, **kwargs)
    assert got.cpu().tolist() == want.tolist()
