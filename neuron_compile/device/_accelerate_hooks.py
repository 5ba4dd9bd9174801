"""Accelerate and transformers see the ``neuron`` device as their own: the one place that touches their internals.

Accelerate (1.16) supports a ``neuron`` accelerator end to end: ``DistributedType.MULTI_NEURON``,
the process-group backend ``"neuron"`` (``TORCH_DISTRIBUTED_BACKENDS``), ``torch.neuron`` as the
device module. Whether it uses any of it is one function, ``accelerate.utils.imports.is_neuron_available``,
which answers False unless AWS's ``torch_neuronx`` package is importable. Under torchrun
``PartialState._prepare_backend`` then finds no accelerator (``get_torch_accelerator_backend``
returns ``(None, None)``), takes the run for ``DistributedType.NO`` with one process, and
Trainer fails with "ParallelismConfig total_size (2) does not match num_processes (1)".

``install()`` (run at ``import torch``: one entry on ``sys.meta_path``, nothing of accelerate
imported) replaces that function in ``accelerate.utils.imports`` as soon as accelerate imports it:
the replacement answers True when ``torch.neuron`` is this package's device and either the run
is launched on several processes (``WORLD_SIZE`` > 1: torchrun; transformers then takes
accelerate's device too) or the user named it (``ACCELERATE_TORCH_DEVICE=neuron``: on one process
transformers' ``TrainingArguments`` reads that variable, and without it a CPU script stays on CPU,
as before we were installed), and defers to
accelerate's own check whenever ``torch_neuronx`` is importable, so a machine with AWS's stack
is left exactly as it was. ``get_torch_accelerator_backend`` looks the function up in its module
at every call, so that one module attribute is all that changes. Then, under torchrun:

    _prepare_backend   -> DistributedType.MULTI_NEURON, backend "neuron" (ours: device/collectives/process_group.py)
    init_process_group("neuron")
    PartialState.set_device -> torch.device("neuron", torch.neuron.current_device())

(``current_device()`` is the local rank under torchrun: by default each process has one device per
local rank, ``runtime/devices.py``).
``tests/test_device_accelerate.py`` checks each of these facts about accelerate's source.

transformers has one check of the same kind: ``TrainingArguments(bf16=True)`` (TRL's default off
CPU) asks ``transformers.utils.import_utils.is_torch_bf16_gpu_available``, which knows neuron only
through ``torch_neuronx`` and so refuses bf16 on our device ("Your setup doesn't support bf16/gpu").
The same post-import hook replaces it in that module as it imports (before ``transformers.utils``
re-exports it): True when the run is on our device (``_ours``: torchrun, or
``ACCELERATE_TORCH_DEVICE=neuron``; ``torch.neuron.is_bf16_supported()``: XLA runs bfloat16), else
transformers' own answer, and always its own where ``torch_neuronx`` is importable.

TRL (1.16) loads a model named by path through ``trl.trainer.utils.create_model_from_path``, which
defaults ``device_map="auto"`` on every device but CPU and MPS; its trainers set ``device_map=None``
first for ``MULTI_GPU`` and ``DEEPSPEED`` runs only ("distributed training requires device_map=None"),
and transformers refuses tensor parallelism with a device map. The hook wraps that function as the
module imports (before the trainers import it by name): in a multi-process run on our device with no
``device_map`` in the script, ``device_map=None``, what TRL gives a multi-GPU run.
"""

from __future__ import annotations

import importlib.util
import os

from .post_import import patch_on_import

TARGET = "accelerate.utils.imports"
FUNCTION = "is_neuron_available"


def _launched() -> bool:
    """The run has several processes (torchrun: a device per rank, as with CUDA)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def _ours() -> bool:
    import torch

    named = os.environ.get("ACCELERATE_TORCH_DEVICE", "").strip()
    if not (named == "neuron" or (_launched() and not named)):
        # one process: transformers' TrainingArguments has a neuron check of its own (AWS's package again)
        # and would keep a CPU script's model on CPU while accelerate moved its batches to neuron
        # (MixedDeviceError); ACCELERATE_TORCH_DEVICE=neuron makes both choose neuron
        return False
    module = getattr(torch, "neuron", None)
    return getattr(module, "__name__", "").startswith("neuron_compile.") and module.is_available()


def patch(imports_module) -> None:
    """Make ``imports_module.is_neuron_available`` answer for our device (unless AWS's stack is there)."""
    original = getattr(imports_module, FUNCTION, None)
    if original is None or getattr(original, "_neuron_compile", False):
        return

    def is_neuron_available(check_device: bool = False) -> bool:
        if importlib.util.find_spec("torch_neuronx") is not None:
            return original(check_device)  # AWS's torch-neuronx is installed: accelerate's own answer
        return _ours()

    is_neuron_available._neuron_compile = True
    is_neuron_available.__doc__ = original.__doc__
    is_neuron_available.__wrapped__ = original
    setattr(imports_module, FUNCTION, is_neuron_available)


TRANSFORMERS_TARGET = "transformers.utils.import_utils"
BF16 = "is_torch_bf16_gpu_available"


def patch_transformers(import_utils) -> None:
    """Make ``import_utils.is_torch_bf16_gpu_available`` answer for our device (unless AWS's stack is there)."""
    original = getattr(import_utils, BF16, None)
    if original is None or getattr(original, "_neuron_compile", False):
        return

    def is_torch_bf16_gpu_available() -> bool:
        if importlib.util.find_spec("torch_neuronx") is None and _ours():
            import torch

            return torch.neuron.is_bf16_supported()
        return original()

    is_torch_bf16_gpu_available._neuron_compile = True
    is_torch_bf16_gpu_available.__doc__ = original.__doc__
    is_torch_bf16_gpu_available.__wrapped__ = original
    setattr(import_utils, BF16, is_torch_bf16_gpu_available)


TRL_TARGET = "trl.trainer.utils"
TRL_LOADER = "create_model_from_path"


def patch_trl(utils) -> None:
    """Give ``utils.create_model_from_path`` TRL's multi-GPU ``device_map`` on our device (unless AWS's stack is
    there): ``device_map=None`` when the run has several processes and the script names no device map."""
    original = getattr(utils, TRL_LOADER, None)
    if original is None or getattr(original, "_neuron_compile", False):
        return

    def create_model_from_path(model_id, *args, **kwargs):
        if "device_map" not in kwargs and _launched() and importlib.util.find_spec("torch_neuronx") is None \
                and _ours():
            kwargs["device_map"] = None  # each rank's model on its own device, as TRL does for MULTI_GPU
        return original(model_id, *args, **kwargs)

    create_model_from_path._neuron_compile = True
    create_model_from_path.__doc__ = original.__doc__
    create_model_from_path.__wrapped__ = original
    setattr(utils, TRL_LOADER, create_model_from_path)


_PATCHES = {TARGET: patch, TRANSFORMERS_TARGET: patch_transformers, TRL_TARGET: patch_trl}


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    patch_on_import(_PATCHES)