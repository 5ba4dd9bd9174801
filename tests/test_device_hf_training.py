"""Hugging Face training scripts, unchanged, on the ``neuron`` device: transformers' ``Trainer`` (eager
and ``torch_compile=True``), TRL's ``SFTTrainer`` with packing, a PEFT LoRA model, and an
``Accelerator`` loop. Each runs the same script on CPU and compares the logged losses (and the
weights it trained). What they ask of the device beyond ops: fused AdamW (Trainer's default
``adamw_torch_fused``), ``Tensor.pin_memory`` for the current accelerator (``dataloader_pin_memory``),
``torch.neuron.get_device_properties`` (TRL), ``torch.save``/``load`` of optimizer state (checkpoints).

What picks the device is the one line a script (or its shell) adds: ``ACCELERATE_TORCH_DEVICE=neuron``.
accelerate's ``PartialState`` reads it, and ``TrainingArguments`` falls back to it (their own
detection of "neuron" looks for the ``torch_neuronx`` package, which we are not). accelerate's
state is a process-wide singleton: each run here starts from a fresh one, as a new process would.

All tests build the same tiny Llama at the same shapes: the first pays for compiling each eager op
once, the others find most kernels already built.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra")

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

# one row of 128 tokens a step: the shape of SFTTrainer's packed batches (pad_to_multiple_of=128)
VOCAB, SEQ, ROWS = 128, 128, 4


def _model():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _rows():
    ids = torch.randint(3, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


@pytest.fixture
def on(monkeypatch):
    """``on(device)``: what a script does to train on ``device``, and a fresh accelerate state."""
    from accelerate.state import AcceleratorState, GradientState

    def select(device):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        if device == "cpu":
            monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
        else:
            monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", device)

    yield select
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _losses(trainer):
    history = [h for h in trainer.state.log_history if "loss" in h]
    return torch.tensor([[h["loss"], h["grad_norm"]] for h in history])


def _weights(model, only=None):
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if only is None or only in k}


def _train(device, on, tmp_path, steps=3, **arguments):
    on(device)
    model = _model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / device), per_device_train_batch_size=1, max_steps=steps, logging_steps=1,
        learning_rate=1e-3, report_to=[], save_strategy="no", seed=0, disable_tqdm=True, **arguments)
    assert args.device.type == device
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows())
    trainer.train()
    assert next(model.parameters()).device.type == device
    return _losses(trainer), _weights(model)


def test_trainer_eager_losses_and_weights_as_on_cpu(on, tmp_path):
    """Trainer's defaults: fused AdamW, a linear learning-rate decay, gradient clipping, pinned
    dataloader memory."""
    got, got_weights = _train("neuron", on, tmp_path)
    want, want_weights = _train("cpu", on, tmp_path)
    assert len(got) == 3
    assert_close(got, want)
    assert_close(got_weights, want_weights)


def test_trainer_with_activation_checkpointing_and_gradient_accumulation(on, tmp_path):
    """The forward recomputed in the backward (``torch.utils.checkpoint``), two micro-batches a step."""
    arguments = {"activation_checkpointing": True, "gradient_accumulation_steps": 2}
    got, got_weights = _train("neuron", on, tmp_path, steps=2, **arguments)
    want, want_weights = _train("cpu", on, tmp_path, steps=2, **arguments)
    assert len(got) == 2
    assert_close(got, want)
    assert_close(got_weights, want_weights)


def test_trainer_resumes_a_checkpoint_saved_on_the_device_as_on_cpu(on, tmp_path):
    """A checkpoint written from the device (safetensors weights, optimizer and scheduler state, RNG
    state) and resumed into a fresh model continues with CPU's losses and weights."""
    results = {}
    for device in ("neuron", "cpu"):
        on(device)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / device), per_device_train_batch_size=1, max_steps=4, logging_steps=1,
            learning_rate=1e-3, report_to=[], save_strategy="steps", save_steps=2, seed=0, disable_tqdm=True)
        transformers.Trainer(model=_model(), args=args, train_dataset=_rows()).train()
        on(device)
        model = _model()
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows())
        trainer.train(resume_from_checkpoint=str(tmp_path / device / "checkpoint-2"))
        assert trainer.state.global_step == 4 and next(model.parameters()).device.type == device
        results[device] = _losses(trainer), _weights(model)
    assert len(results["neuron"][0]) == 4
    assert_close(results["neuron"], results["cpu"])


@pytest.mark.parametrize("backend", ["neuron", None])
def test_trainer_torch_compile(on, tmp_path, backend):
    """``torch_compile=True`` with ``torch_compile_backend="neuron"``, and with none named: Trainer then
    asks for Inductor, and a graph on neuron tensors goes to the neuron backend."""
    from neuron_compile import compile_reports

    named = {"torch_compile_backend": backend} if backend else {}
    before = len(compile_reports())
    got, got_weights = _train("neuron", on, tmp_path, torch_compile=True, **named)
    # the device's eager ops report too (kind "eager"): the model's own graphs are forward and backward
    kinds = {r.kind for r in compile_reports()[before:]}
    assert {"forward", "backward"} <= kinds, f"the model went through torch.compile's neuron backend: {kinds}"
    want, want_weights = _train("cpu", on, tmp_path)
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_close(got_weights, want_weights, rtol=1e-4, atol=1e-5)


def test_sft_trainer_with_packing_pads_to_a_multiple_of_128(on, tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is a test extra")
    trl = pytest.importorskip("trl", reason="trl is a test extra")
    tokenizer = _tokenizer()
    words = [f"w{i}" for i in range(3, VOCAB)]
    generator = torch.Generator().manual_seed(2)
    texts = [" ".join(words[j] for j in torch.randint(0, len(words), (int(n),), generator=generator))
             for n in torch.randint(3, 12, (12,), generator=generator)]
    dataset = datasets.Dataset.from_dict({"text": texts})
    results = {}
    for device in ("neuron", "cpu"):
        on(device)
        model = _model()
        # bf16=False, as on CPU: SFTConfig's default bf16=True passes transformers' check only on devices it
        # knows (is_torch_bf16_gpu_available; its neuron branch wants torch_neuronx)
        config = trl.SFTConfig(output_dir=str(tmp_path / device), packing=True, pad_to_multiple_of=128, max_length=32,
                               per_device_train_batch_size=2, max_steps=2, logging_steps=1, learning_rate=1e-3,
                               bf16=False, report_to=[], save_strategy="no", seed=0, disable_tqdm=True)
        trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        batch = next(iter(trainer.get_train_dataloader()))
        assert batch["input_ids"].shape[-1] % 128 == 0 and "position_ids" in batch  # packed, padding-free
        trainer.train()
        assert next(model.parameters()).device.type == device
        results[device] = _losses(trainer), _weights(model)
    assert len(results["neuron"][0]) == 2
    assert_close(results["neuron"], results["cpu"])


def _tokenizer():
    """A word-level tokenizer built in memory (no download): ``w3`` ... ``w127`` are ids 3 ... 127."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>")


def test_peft_lora_trains_its_adapters_as_on_cpu(on, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is a test extra")
    results = {}
    for device in ("neuron", "cpu"):
        on(device)
        model = peft.get_peft_model(_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / device), per_device_train_batch_size=1, max_steps=3, logging_steps=1,
            learning_rate=1e-2, report_to=[], save_strategy="no", seed=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows())
        trainer.train()
        lora = _weights(model, only="lora_")
        assert len(lora) == 4 and all(v.device.type == "cpu" for v in lora.values())
        results[device] = _losses(trainer), lora, _weights(model, only="base_layer")
    assert_close(results["neuron"], results["cpu"])
    assert any(v.abs().sum() > 0 for k, v in results["neuron"][1].items() if "lora_B" in k)  # B starts at 0


def test_accelerator_places_model_optimizer_and_batches_on_the_device(on):
    from accelerate import Accelerator

    results = {}
    for device in ("neuron", "cpu"):
        on(device)
        accelerator = Accelerator()
        assert accelerator.device.type == device
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(_rows(), batch_size=1, pin_memory=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        losses = []
        for step, batch in enumerate(loader):
            assert batch["input_ids"].device.type == device
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.gather(loss.detach()).cpu())
            if step == 2:
                break
        assert next(model.parameters()).device.type == device
        results[device] = torch.stack(losses), _weights(accelerator.unwrap_model(model))
    assert_close(results["neuron"], results["cpu"])
