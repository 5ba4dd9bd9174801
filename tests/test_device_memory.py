"""``torch.neuron`` memory counters while compiled graphs run on device buffers.

The counters count the bytes of every live neuron storage's PJRT buffer, so
after a compiled training step they must account exactly for the parameters,
their gradients and nothing else, and the peak must cover what the step kept
alive at once (the activations the forward saved for the backward).
"""

from __future__ import annotations

import torch
from torch.testing import assert_close


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_max_memory_allocated_during_a_compiled_training_step():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    x = torch.randn(32, 64)
    xn = x.to("neuron")
    compiled = torch.compile(model)  # no backend named: neuron tensors go to the neuron backend
    params = _nbytes(model.parameters())
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert base == params + _nbytes([xn])
    loss = compiled(xn).pow(2).mean()
    loss.backward()
    loss_cpu = ref(x).pow(2).mean()
    loss_cpu.backward()
    assert_close(loss.cpu(), loss_cpu.detach())
    del loss
    grads = _nbytes(p.grad for p in model.parameters())
    assert grads == params
    assert torch.neuron.memory_allocated() == base + grads
    # at the peak the forward's saved activations (GELU's input and output: 32 x 256 floats each,
    # at least one of them) lived beside the parameters, the input and the first gradients
    peak = torch.neuron.max_memory_allocated()
    assert peak >= base + 32 * 256 * 4 and peak >= base + grads
    for p in model.parameters():
        p.grad = None
    assert torch.neuron.memory_allocated() == base
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), p_ref.detach())
