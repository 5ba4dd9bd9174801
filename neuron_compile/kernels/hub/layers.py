"""Layers for Hugging Face's ``kernels`` library: stateless, each forward calling a neuron_compile kernel
with the attributes of the layer it replaces."""

import torch

from neuron_compile.kernels import rms_norm  # noqa: F401 - defines torch.ops.neuron.rms_norm and its kernel


class RMSNorm(torch.nn.Module):
    """Replaces transformers' ``LlamaRMSNorm`` (``weight``, ``variance_epsilon``) and its kin."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.ops.neuron.rms_norm(hidden_states, self.weight, self.variance_epsilon)
