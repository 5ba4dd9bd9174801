"""Hugging Face's ``kernels`` library and transformers' ``KernelConfig``, with no download.

``kernels`` swaps a layer of a model (a class decorated with
``@use_kernel_forward_from_hub("RMSNorm")``, as transformers' ``LlamaRMSNorm``
is) for the layer of a kernel repository, per device type; ``neuron`` is one
of the device types it knows (``kernels.layer.repos._NeuronRepos``). We ship a
local repository (``hub/``: ``metadata.json`` and a ``layers`` module), so the
swap needs nothing from the Hub: its ``RMSNorm`` layer's forward calls
``torch.ops.neuron.rms_norm``, which our kernel serves in compiled graphs.

    from kernels import kernelize, use_kernel_mapping, Mode
    with use_kernel_mapping(neuron_compile.kernels.hf.kernel_mapping()):
        kernelize(model, device="neuron", mode=Mode.INFERENCE)

``kernelize(model)`` below does that in one call, or with a transformers
``KernelConfig`` (``kernel_config()`` names our repository; a config's local
paths resolve for the model's device, so the model must be on ``neuron``).

transformers 5.24 only uses ``kernels`` >= 0.18.2 (``is_kernels_available``);
the newest this machine's registry has is 0.17.2. With it transformers
applies no-op decorators, so its layers carry no ``kernel_layer_name`` and
``model.set_use_kernels`` refuses. ``mark_layers`` applies ``kernels``' own
``use_kernel_forward_from_hub("RMSNorm")`` to a model's RMSNorm classes, which
is what transformers does with a newer ``kernels``; ``kernelize`` then reads the
``KernelConfig`` as transformers' ``set_use_kernels`` would.
"""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent / "hub"
LAYERS = ("RMSNorm",)


def layer_repository(layer: str = "RMSNorm"):
    """``kernels.LocalLayerRepository`` of our local repository's ``layer``."""
    from kernels import LocalLayerRepository

    return LocalLayerRepository(repo_path=REPOSITORY, layer_name=layer)


def kernel_mapping(device: str = "neuron") -> dict:
    """The mapping ``kernels.use_kernel_mapping`` takes: each of our layers for ``device``, every mode."""
    return {layer: {device: layer_repository(layer)} for layer in LAYERS}


def kernel_config(layers: tuple = LAYERS):
    """transformers' ``KernelConfig`` naming our local repository (``use_local_kernel=True``)."""
    from transformers import KernelConfig

    return KernelConfig({layer: f"{REPOSITORY}:{layer}" for layer in layers}, use_local_kernel=True)


def mark_layers(model) -> list[type]:
    """Make the model's RMSNorm classes (``weight`` and ``variance_epsilon``, as ``LlamaRMSNorm``) swappable
    as ``"RMSNorm"`` by ``kernels``, as transformers' ``@use_kernel_forward_from_hub`` does with kernels
    >= 0.18.2. Returns the classes marked now."""
    from kernels import use_kernel_forward_from_hub

    marked = []
    for module in model.modules():
        cls = type(module)
        if (cls.__name__.endswith("RMSNorm") and not hasattr(cls, "kernel_layer_name")
                and hasattr(module, "weight") and hasattr(module, "variance_epsilon")):
            use_kernel_forward_from_hub("RMSNorm")(cls)
            marked.append(cls)
    return marked


def kernelize(model, *, device: str = "neuron", mode=None, kernel_config=None):
    """``kernels.kernelize`` with our local repository (or ``kernel_config``'s mapping, resolved for the model's
    device); ``mode`` defaults to training or inference as the model is. Returns the model."""
    from kernels import Mode, kernelize as kernels_kernelize, use_kernel_mapping

    mark_layers(model)
    if kernel_config is not None:
        kernel_config.sanitize_kernel_mapping(model)
        kernel_config.create_compatible_mapping(model)
        mapping = kernel_config.kernel_mapping
    else:
        mapping = kernel_mapping(device)
    mode = mode if mode is not None else (Mode.TRAINING if model.training else Mode.INFERENCE)
    with use_kernel_mapping(mapping, inherit_mapping=False):
        return kernels_kernelize(model, device=device, mode=mode)
