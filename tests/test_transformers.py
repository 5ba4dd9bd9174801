"""Hugging Face models built from tiny configs (random weights, no download) against eager."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")

import neuron_compile  # noqa: E402

VOCAB = 128


def tiny_config(name):
    common = dict(vocab_size=VOCAB, max_position_embeddings=128)
    if name == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=VOCAB,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if name == "bert":
        return transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=128, hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0, **common)
    return transformers.AutoConfig.for_model(
        name, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, **common)


def build(name):
    torch.manual_seed(0)
    cfg = tiny_config(name)
    if name == "bert":
        return transformers.BertForMaskedLM(cfg)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_training_step_matches_eager(compiled, model, ids=None, inputs=None, atol=1e-5):
    """One step through ``compiled`` (token ids ``ids`` as inputs and labels, or ``inputs``), then
    eagerly: the same loss and every gradient."""
    inputs = inputs if inputs is not None else {"input_ids": ids, "labels": ids}
    loss = compiled(**inputs).loss
    loss.backward()
    got = grads(model)
    model.zero_grad()
    ref = model(**inputs).loss
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=max(atol, 1e-5), atol=atol)
    expected = grads(model)
    assert got.keys() == expected.keys() and len(got) > 10
    for param, g in expected.items():
        torch.testing.assert_close(got[param], g, rtol=1e-3, atol=atol, msg=param)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen3", "bert"])
def test_inference_logits_loss_and_gradients(name):
    model = build(name)
    ids = torch.randint(0, VOCAB, (2, 16))
    compiled = torch.compile(model, backend="neuron")

    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)

    model.train()
    assert_training_step_matches_eager(compiled, model, ids)
    kinds = {r.kind for r in neuron_compile.compile_reports()}
    assert {"inference", "forward", "backward"} <= kinds


@pytest.mark.slow
def test_five_adamw_steps_of_tiny_llama_follow_eager():
    eager = build("llama")
    model = build("llama")
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="neuron")
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (2, 16))
    ours, theirs = [], []
    for _ in range(5):
        for m, o, losses, fn in ((eager, opt_eager, theirs, eager), (model, opt, ours, compiled)):
            o.zero_grad()
            loss = fn(input_ids=ids, labels=ids).loss
            loss.backward()
            o.step()
            losses.append(loss.item())
    assert theirs[-1] < theirs[0]  # it trains
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen3", "bert"])
def test_neuron_profile_pads_matmuls_and_fuses_attention(name):
    """With the hardware's `neuron` profile: attention regions, padded matmuls, and still eager's numbers."""
    model = build(name).eval()
    ids = torch.randint(0, VOCAB, (2, 16))
    compiled = torch.compile(model, backend="neuron", options={"passes": "neuron"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)
    (report,) = [r for r in neuron_compile.compile_reports() if r.kind == "inference"]
    stats = {p.name: p for p in report.passes}
    assert stats["pad-to-multiple"].fired > 0  # 64-wide matmuls padded to the 128 partitions
    assert stats["fuse"].details["regions"].get("attention", 0) == 2  # one per layer


def test_gpt2_training_step_is_one_graph():
    # GPT2LMHeadModel's loss_function property calls logger.warning_once on every step with labels;
    # the backend has Dynamo skip it, so the step is one graph, not two after a restart
    from torch._dynamo.utils import counters

    model = build("gpt2").train()
    ids = torch.randint(0, VOCAB, (2, 16))
    counters.clear()
    assert_training_step_matches_eager(torch.compile(model, backend="neuron"), model, ids)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_training_step_with_gradient_checkpointing(name):
    # activation checkpointing (gradient_checkpointing_enable() before transformers 5) puts every
    # layer in a checkpoint higher-order op: the SDPA inside its subgraph must be rewritten too, or
    # AOTAutograd meets the fused CPU attention's backward, which torch-mlir cannot lower
    model = build(name).train()
    model.activation_checkpointing_enable()
    assert_training_step_matches_eager(torch.compile(model, backend="neuron"), model, torch.randint(0, VOCAB, (2, 16)))


def _vision_and_audio(name):
    torch.manual_seed(0)
    if name == "convnext":  # depthwise 7x7 convolutions
        model = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3, drop_path_rate=0.0))
        return model, {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}
    if name == "whisper":  # Conv1d front end
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
            d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
            max_target_positions=16, vocab_size=VOCAB, dropout=0.0, pad_token_id=1, bos_token_id=2,
            eos_token_id=3, decoder_start_token_id=2))
        return model, {"input_features": torch.randn(2, 8, 32), "labels": torch.randint(4, VOCAB, (2, 6))}
    # wav2vec2: strided Conv1d feature extractor, grouped weight-normed positional convolution, CTC loss
    model = transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        vocab_size=20, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean"))
    return model, {"input_values": torch.randn(2, 400), "labels": torch.randint(1, 20, (2, 5))}


@pytest.mark.parametrize("name", ["convnext", "whisper", "wav2vec2"])
def test_vision_and_audio_training_step(name):
    # convolutions torch-mlir has no backward for (depthwise, 1-D) and weight_norm's backward
    model, inputs = _vision_and_audio(name)
    model.train()
    assert_training_step_matches_eager(torch.compile(model, backend="neuron"), model, inputs=inputs, atol=1e-4)
