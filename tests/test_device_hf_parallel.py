"""Hugging Face's tensor-parallel recipe on ``neuron`` under torchrun, unchanged: TRL's ``SFTTrainer`` with
transformers' ``DistributedConfig(tp_size=2)`` in ``model_init_kwargs``, ``torch_compile=True``, packing and
``pad_to_multiple_of=128``, no Accelerate configuration and no variable.

Each rank works on ``neuron:<LOCAL_RANK>`` (one device per local rank, ``runtime/devices.py``); accelerate sees
``MULTI_NEURON`` (``device/_accelerate_hooks.py``). Losses and grad norms must equal a single CPU process on the
same global batch (with tp only, every rank sees the whole batch), and the saved checkpoint loads on CPU with a
plain ``from_pretrained`` and gives the CPU run's logits.

What the script states beyond the CUDA recipe: ``bf16=False`` (TRL's default bf16 runs on the device too,
``device/_accelerate_hooks.py``, but float32 keeps the CPU comparison exact). No ``device_map``: TRL sets
``device_map=None`` itself for ``MULTI_GPU`` only, and our hook does the same for a multi-process neuron run
(transformers refuses tensor parallelism with a device map).

Also diffusers' tensor-parallel Flux (``enable_parallelism``) on neuron, eager and compiled, against CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("trl", reason="trl is a test extra (the Hugging Face tests)")

RECIPE = '''
import json, os, sys
import datasets, torch, transformers, trl
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers.distributed import DistributedConfig

folder, model_dir, fsdp = sys.argv[1], sys.argv[2], int(sys.argv[3])
world = int(os.environ.get("WORLD_SIZE", "1"))
vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 256)}}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                                 eos_token="</s>")
g = torch.Generator().manual_seed(0)
texts = [" ".join(f"w{int(i)}" for i in torch.randint(3, 256, (int(n),), generator=g))
         for n in torch.randint(20, 90, (64,), generator=g)]  # full batches: no uneven last batch
parallel = {"model_init_kwargs": {"distributed_config": DistributedConfig(tp_size=2, fsdp_size=fsdp)}}
config = trl.SFTConfig(output_dir=folder + "/out", max_steps=2, logging_steps=1,
                       per_device_train_batch_size=2 * (fsdp if world == 1 else 1),  # the same global batch
                       learning_rate=1e-3, packing=True, max_length=256, pad_to_multiple_of=128,
                       torch_compile=world > 1, use_cpu=world == 1, bf16=False, report_to=[], save_strategy="no",
                       seed=0, disable_tqdm=True, **(parallel if world > 1 else {}))
trainer = trl.SFTTrainer(model=model_dir, args=config, train_dataset=datasets.Dataset.from_dict({"text": texts}),
                         processing_class=tokenizer)
trainer.train()
trainer.save_model(folder + "/final")
rank = int(os.environ.get("RANK", "0"))
collectives = {}  # how the compiled graphs' collectives ran: compiled into the executable, or eagerly
if world > 1:
    import neuron_compile
    for report in neuron_compile.compile_reports():
        for how, count in (report.as_dict().get("collectives") or {}).items():
            collectives[how] = collectives.get(how, 0) + count
with open(f"{folder}/rank{rank}.json", "w") as f:
    json.dump({"logs": [[h["loss"], h["grad_norm"]] for h in trainer.state.log_history if "loss" in h],
               "device": str(next(trainer.model.parameters()).device),
               "distributed_type": str(trainer.accelerator.distributed_type),
               "compile_backend": str(trainer.args.torch_compile_backend), "collectives": collectives}, f)
'''


def _runs(root, launch, fsdp: int):
    """The recipe on ``2 * fsdp`` ranks on neuron, and as one CPU process on the same global batch."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=False)
    Qwen3ForCausalLM(config).save_pretrained(root / "model")
    (root / "neuron").mkdir()
    ranks = tuple(range(2 * fsdp))
    neuron = launch(root / "neuron", RECIPE, args=(root / "model", fsdp), env={"ACCELERATE_TORCH_DEVICE": None},
                    timeout=1800, ranks=ranks, nproc=len(ranks))
    cpu = root / "cpu"
    cpu.mkdir()
    (cpu / "worker.py").write_text(RECIPE)
    # the reference: one CPU process, eager, our device not even loaded
    done = subprocess.run([sys.executable, str(cpu / "worker.py"), str(cpu), str(root / "model"), str(fsdp)],
                          capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
                                                       "WORLD_SIZE": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return root, neuron, json.loads((cpu / "rank0.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch_two_ranks):
    return _runs(tmp_path_factory.mktemp("tp"), launch_two_ranks, fsdp=1)


def _check_losses(neuron, cpu):
    for rank, result in enumerate(neuron):
        assert result["device"] == f"neuron:{rank}"  # each rank on neuron:<LOCAL_RANK>
        assert result["distributed_type"] == "DistributedType.MULTI_NEURON"
        assert len(result["logs"]) == 2
        assert_close(torch.tensor(result["logs"]), torch.tensor(cpu["logs"]), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_trl_sft_with_tensor_parallel_trains_on_neuron_as_one_cpu_process(runs):
    _, neuron, cpu = runs
    _check_losses(neuron, cpu)
    for result in neuron:
        # the tensor-parallel graphs' collectives (over the whole world) ran inside the executables, none
        # eagerly through the host (a 2-D mesh's subgroups still run eagerly: README)
        assert result["collectives"].get("compiled", 0) > 0 and not result["collectives"].get("eager"), result


@pytest.mark.slow
def test_the_tensor_parallel_checkpoint_loads_on_cpu_with_the_cpu_runs_logits(runs):
    from transformers import AutoModelForCausalLM

    root, _, _ = runs
    ids = torch.randint(3, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(root / side / "final")(ids).logits for side in ("neuron", "cpu")]
    assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_trl_sft_with_tensor_parallel_and_fsdp_on_four_ranks_trains_as_one_cpu_process(tmp_path_factory,
                                                                                      launch_two_ranks):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tp_fsdp")
    _, neuron, cpu = _runs(root, launch_two_ranks, fsdp=2)
    _check_losses(neuron, cpu)
    for result in neuron:  # the tp dim's collectives (a subgroup of the 2 x 2 mesh) ran in the executables
        assert result["collectives"].get("compiled", 0) > 0 and not result["collectives"].get("eager"), result
    ids = torch.randint(3, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(root / side / "final")(ids).logits for side in ("neuron", "cpu")]
    assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


FLUX_TP = '''
import json, os, sys
import torch, torch.distributed as dist
from diffusers import FluxTransformer2DModel
from diffusers.models._modeling_parallel import TensorParallelConfig
import neuron_compile

dist.init_process_group("neuron")
rank = dist.get_rank()
torch.manual_seed(0)
kw = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
          joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
reference = FluxTransformer2DModel(**kw).eval()
g = torch.Generator().manual_seed(1)
inputs = dict(hidden_states=torch.randn(1, 16, 4, generator=g), encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
              pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.5]),
              img_ids=torch.randn(16, 3, generator=g), txt_ids=torch.zeros(8, 3))
model = FluxTransformer2DModel(**kw).eval()
model.load_state_dict(reference.state_dict())
model.to("neuron")
model.enable_parallelism(config=TensorParallelConfig(tp_degree=2))
on_device = {k: v.to("neuron") for k, v in inputs.items()}
with torch.no_grad():
    expected = reference(**inputs).sample
    eager = model(**on_device).sample.cpu()
    compiled = torch.compile(model, backend="neuron")(**on_device).sample.cpu()
collectives = {}
for report in neuron_compile.compile_reports():
    for how, count in (report.as_dict().get("collectives") or {}).items():
        collectives[how] = collectives.get(how, 0) + count
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump({"expected": expected.tolist(), "eager": eager.tolist(), "compiled": compiled.tolist(),
               "collectives": collectives}, f)
'''


@pytest.mark.slow
def test_diffusers_tensor_parallel_flux_on_neuron_matches_cpu_with_its_collectives_compiled(tmp_path, launch_two_ranks):
    """Diffusers' ``enable_parallelism(TensorParallelConfig(tp_degree=2))`` on a Flux transformer moved to neuron
    (its mesh on neuron), eager and compiled, against the unsharded model on CPU; compiled, its collectives run
    inside the executables (none eagerly through the host)."""
    pytest.importorskip("diffusers", reason="diffusers is a test extra (the Hugging Face tests)")
    for result in launch_two_ranks(tmp_path, FLUX_TP, timeout=600):
        expected = torch.tensor(result["expected"])
        assert_close(torch.tensor(result["eager"]), expected, rtol=1e-5, atol=1e-5)
        assert_close(torch.tensor(result["compiled"]), expected, rtol=1e-5, atol=1e-5)
        assert result["collectives"].get("compiled", 0) > 0 and not result["collectives"].get("eager"), result
