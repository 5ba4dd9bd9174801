"""Accelerate and gloo groups on the ``neuron`` device under torchrun.

* Accelerate recognises ``neuron`` (``neuron_compile/device/_accelerate_hooks.py``): the facts about
  accelerate's source that the one patched function relies on are checked here, so an accelerate
  release that changes them fails by name; AWS's ``torch_neuronx``, where importable, keeps
  accelerate's own answer.
* Two ranks (one torchrun launch): ``init_process_group("gloo")`` then DDP and FSDP2 on neuron tensors
  against the same on CPU (gloo serves neuron tensors through host copies, ``device/collectives/staged.py``),
  then ``Accelerator()`` with no configuration and no variable: ``MULTI_NEURON``, two processes, ``neuron:<LOCAL_RANK>``,
  and a prepared model trained with the parameters a single CPU process gets on the global batch.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from torch.testing import assert_close

accelerate = pytest.importorskip("accelerate", reason="accelerate is an optional extra (the Hugging Face tests)")

from neuron_compile.device import _accelerate_hooks  # noqa: E402


def test_accelerate_finds_the_device_through_the_one_function_we_patch(monkeypatch):
    from accelerate.utils import imports

    assert getattr(imports.is_neuron_available, "_neuron_compile", False)
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "neuron")
    assert imports.is_neuron_available() is True
    assert imports.get_torch_accelerator_backend() == ("neuron", torch.neuron)
    # not named, one process: accelerate's own answer for this machine (no AWS package: no neuron), as
    # before we were installed; under torchrun (WORLD_SIZE > 1) the device is found as CUDA would be
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert imports.is_neuron_available() is False
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert imports.is_neuron_available() is True
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert imports.is_neuron_available() is False


_CPU_TRAINER = textwrap.dedent("""
    import torch
    from torch import nn
    from transformers import Trainer, TrainingArguments

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": ((self.l(x).squeeze(-1) - labels) ** 2).mean()}

    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(8)]
    model = M()
    args = TrainingArguments(output_dir="OUT", report_to=[], max_steps=2, per_device_train_batch_size=4,
                             save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    print("DEVICES", args.device, trainer.accelerator.device, next(model.parameters()).device)
""")


@pytest.mark.slow
def test_a_cpu_trainer_script_stays_on_cpu(tmp_path):
    """Installing the package changes nothing for a script that does not ask for the device (before the
    variable gated the patch, accelerate chose neuron and transformers CPU: MixedDeviceError in addmm)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ACCELERATE_TORCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", _CPU_TRAINER.replace("OUT", str(tmp_path))], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DEVICES cpu cpu cpu" in done.stdout, done.stdout


def test_the_facts_about_accelerate_the_patch_relies_on():
    """Each assertion is one thing accelerate does today; if a release changes it, the patch must be revisited."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, imports
    from accelerate.utils.constants import TORCH_DISTRIBUTED_BACKENDS

    original = inspect.getsource(imports.is_neuron_available.__wrapped__)
    assert 'find_spec("torch_neuronx")' in original  # why it says False without AWS's package
    backend = inspect.getsource(imports.get_torch_accelerator_backend)
    assert '"neuron": is_neuron_available' in backend and "is_neuron_available()" in backend
    prepare = inspect.getsource(PartialState._prepare_backend)
    assert "get_torch_accelerator_backend()" in prepare and 'f"MULTI_{device_type.upper()}"' in prepare
    assert TORCH_DISTRIBUTED_BACKENDS["neuron"] == "neuron"  # init_process_group("neuron"): ours
    assert DistributedType("MULTI_NEURON") is DistributedType.MULTI_NEURON
    set_device = inspect.getsource(PartialState.set_device)
    assert 'device in ("hpu", "neuron")' in set_device and "device_module.current_device()" in set_device


def test_aws_torch_neuronx_keeps_accelerates_own_answer(monkeypatch):
    fake = types.SimpleNamespace(is_neuron_available=lambda check_device=False: ("accelerate's", check_device))
    _accelerate_hooks.patch(fake)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "neuron")
    assert fake.is_neuron_available() is True  # no torch_neuronx here: our device answers
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_neuronx" else real_find_spec(name, *a))
    assert fake.is_neuron_available(True) == ("accelerate's", True)


def test_import_torch_imports_no_accelerate_and_patches_it_when_it_comes():
    code = textwrap.dedent("""
        import sys, torch
        assert "accelerate" not in sys.modules and "jax" not in sys.modules
        from accelerate.utils import imports
        assert imports.is_neuron_available._neuron_compile
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def test_transformers_allows_bf16_on_the_device_through_the_one_function_we_patch():
    """``TrainingArguments(bf16=True)`` (TRL's default off CPU) on our device: allowed where the run is on
    neuron (``ACCELERATE_TORCH_DEVICE=neuron``; torchrun likewise), refused as before for a CPU script, and
    the facts the patch relies on: transformers re-exports the function from ``import_utils`` and
    ``TrainingArguments`` reads it by that name."""
    transformers = pytest.importorskip("transformers")
    from transformers import training_args
    from transformers.utils import import_utils

    assert getattr(import_utils.is_torch_bf16_gpu_available, "_neuron_compile", False)
    assert training_args.is_torch_bf16_gpu_available is import_utils.is_torch_bf16_gpu_available
    assert "not is_torch_bf16_gpu_available()" in inspect.getsource(training_args)  # the bf16 check
    code = textwrap.dedent("""
        import sys, torch, transformers
        try:
            args = transformers.TrainingArguments(output_dir=sys.argv[1], bf16=True, report_to=[])
            print("allowed", args.device)
        except ValueError as e:
            print("refused", e)
    """)
    for named, want in (("neuron", "allowed neuron"), (None, "refused Your setup doesn't support bf16/gpu")):
        env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_TORCH_DEVICE", "WORLD_SIZE")}
        if named:
            env["ACCELERATE_TORCH_DEVICE"] = named
        done = subprocess.run([sys.executable, "-c", code, "/tmp/unused"], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.stdout.startswith(want), (done.stdout, done.stderr[-3000:])


def test_aws_torch_neuronx_keeps_transformers_own_bf16_answer(monkeypatch):
    fake = types.SimpleNamespace(is_torch_bf16_gpu_available=lambda: "transformers'")
    _accelerate_hooks.patch_transformers(fake)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "neuron")
    assert fake.is_torch_bf16_gpu_available() is True
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_neuronx" else real_find_spec(name, *a))
    assert fake.is_torch_bf16_gpu_available() == "transformers'"


def test_the_facts_about_trl_the_device_map_patch_relies_on():
    """TRL defaults ``device_map="auto"`` off CPU and sets None first for multi-GPU runs only: when it names
    MULTI_NEURON too (or stops defaulting), the hook's TRL patch is no longer needed."""
    trl_utils = pytest.importorskip("trl.trainer.utils", reason="trl is a test extra (the Hugging Face tests)")
    from trl.trainer import sft_trainer

    loader = trl_utils.create_model_from_path
    assert getattr(loader, "_neuron_compile", False) and sft_trainer.create_model_from_path is loader
    assert 'kwargs["device_map"] = None if PartialState().device.type in ("cpu", "mps") else "auto"' in \
        inspect.getsource(loader.__wrapped__)
    trainer = inspect.getsource(sft_trainer.SFTTrainer.__init__)
    assert 'distributed_type in ["MULTI_GPU", "DEEPSPEED"]' in trainer and "MULTI_NEURON" not in trainer


def test_trl_loads_a_model_without_a_device_map_in_a_multi_process_neuron_run(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(create_model_from_path=lambda model_id, **kwargs: calls.append(kwargs))
    _accelerate_hooks.patch_trl(fake)
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    fake.create_model_from_path("model")  # torchrun: TRL's multi-GPU choice
    fake.create_model_from_path("model", device_map="auto")  # the script's own choice stays
    monkeypatch.setenv("WORLD_SIZE", "1")
    fake.create_model_from_path("model")  # one process: TRL's own default
    real_find_spec = importlib.util.find_spec
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_neuronx" else real_find_spec(name, *a))
    fake.create_model_from_path("model")  # AWS's stack: TRL as it is
    assert calls == [{"device_map": None}, {"device_map": "auto"}, {}, {}]


WORKER = textwrap.dedent('''
    import json, os, sys, traceback
    import torch, torch.distributed as dist
    import torch.nn.functional as F

    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    results = {}


    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))


    def batches(seed):
        torch.manual_seed(seed)
        return [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(3)]  # the global batch; rank r: half r


    def train(model, device, shard=True):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in batches(7):
            if shard:
                x, y = x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]
            opt.zero_grad()
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses


    def params(model):
        return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().reshape(-1).tolist()
                for p in model.parameters()]


    def gloo():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        found = {"backend": dist.get_backend()}
        device = torch.device("neuron", torch.neuron.current_device())
        for kind in ("ddp", "fsdp2"):
            for where in ("neuron", "cpu"):
                torch.manual_seed(0)
                model = MLP().to(device if where == "neuron" else "cpu")
                if kind == "ddp":
                    step_model = DDP(model)
                else:
                    mesh = init_device_mesh(where, (2,))
                    for layer in (model.fc1, model.fc2, model):
                        fully_shard(layer, mesh=mesh)
                    step_model = model
                losses = train(step_model, device if where == "neuron" else "cpu")
                found[f"{kind}_{where}"] = [losses, params(model), str(next(model.parameters()).device)]
        dist.destroy_process_group()
        return found


    def accelerate():
        from accelerate import Accelerator
        acc = Accelerator()
        found = {"type": str(acc.distributed_type), "processes": acc.num_processes, "device": str(acc.device),
                 "backend": dist.get_backend()}
        torch.manual_seed(0)
        model = MLP()
        reference = MLP()
        reference.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        losses = []
        for x, y in batches(7):
            x, y = x[4 * rank:4 * rank + 4].to(acc.device), y[4 * rank:4 * rank + 4].to(acc.device)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            losses.append(acc.gather(loss.detach()[None]).cpu().tolist())
        found["losses"] = losses
        found["params"] = params(acc.unwrap_model(model))
        found["param_device"] = str(next(acc.unwrap_model(model).parameters()).device)
        # one CPU process on the global batch: what DDP's averaged gradients must give
        train(reference, "cpu", shard=False)
        found["cpu_params"] = params(reference)
        return found


    for name in ("gloo", "accelerate"):
        try:
            results[name] = globals()[name]()
        except Exception:
            results[name] = {"exception": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
''')


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, launch_two_ranks):
    return launch_two_ranks(tmp_path_factory.mktemp("ranks"), WORKER, env={
        "ACCELERATE_TORCH_DEVICE": None,  # under torchrun accelerate finds the device by itself
        "NEURON_DEVICE_COUNT": None,  # by default one device per local rank (torchrun's LOCAL_WORLD_SIZE)
    })


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_a_gloo_group_trains_neuron_tensors_as_cpu_ones(two_ranks, kind):
    for rank, result in enumerate(two_ranks):
        found = result["gloo"]
        assert "exception" not in found, f"rank {rank}:\n{found['exception']}"
        assert found["backend"] == "gloo"
        (losses, params, device), (cpu_losses, cpu_params, _) = found[f"{kind}_neuron"], found[f"{kind}_cpu"]
        assert device == f"neuron:{rank}"  # each rank on neuron:<LOCAL_RANK>
        assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
        for p, q in zip(params, cpu_params):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    assert two_ranks[0]["gloo"][f"{kind}_neuron"][0] != two_ranks[1]["gloo"][f"{kind}_neuron"][0]


@pytest.mark.slow
def test_accelerate_runs_multi_process_on_neuron_under_torchrun(two_ranks):
    for rank, result in enumerate(two_ranks):
        found = result["accelerate"]
        assert "exception" not in found, f"rank {rank}:\n{found['exception']}"
        assert found["type"] == "DistributedType.MULTI_NEURON" and found["processes"] == 2
        assert found["device"] == found["param_device"] == f"neuron:{rank}" and found["backend"] == "neuron"
        for p, q in zip(found["params"], found["cpu_params"]):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    assert two_ranks[0]["accelerate"]["losses"] == two_ranks[1]["accelerate"]["losses"]  # gathered from both
