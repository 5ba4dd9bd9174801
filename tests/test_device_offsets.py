"""Views read at run-time offsets: a slice of a resident tensor at a new offset compiles nothing.

A view that does not span its storage (``data[i:i + 5]``, a chunk of a fused
projection) reaches its op's executable as its storage's buffer plus its offset,
a 0-d input, so the offset is never part of the op's signature. Each test runs
the same code on CPU and on ``neuron`` and compares; counts are the point where
they are asserted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _WordModel(torch.nn.Module):
    """pytorch/examples word_language_model's shape, without the RNN: embed, decode, loss."""

    def __init__(self, vocab=40, width=16):
        super().__init__()
        self.encoder = torch.nn.Embedding(vocab, width)
        self.decoder = torch.nn.Linear(width, vocab)

    def forward(self, x):
        return self.decoder(torch.tanh(self.encoder(x)))


def _train(device, steps=6, bptt=5, lr=20):
    """word_language_model's loop: the corpus on the device, a batch sliced from it each step, a manual
    SGD update through ``p.data.add_``, gradients clipped. Returns the losses and the compiles per step."""
    torch.manual_seed(0)
    corpus = torch.randint(0, 40, (steps * bptt + 1, 4))
    model = _WordModel()
    data = corpus.to(device)
    model.to(device)
    losses, compiles = [], []
    for i in range(0, steps * bptt, bptt):
        before = device_ops.COUNTS["op_compiles"]
        x, y = data[i:i + bptt], data[i + 1:i + 1 + bptt].reshape(-1)
        model.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out.view(-1, out.size(-1)), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.detach().cpu())
        compiles.append(device_ops.COUNTS["op_compiles"] - before)
    return torch.stack(losses), compiles, [p.detach().cpu() for p in model.parameters()]


def test_batches_sliced_at_moving_offsets_compile_nothing_after_the_first():
    ref_losses, _, ref_params = _train("cpu")
    losses, compiles, params = _train("neuron")
    assert_close(losses, ref_losses)
    for p, ref in zip(params, ref_params):
        assert_close(p, ref)
    assert compiles[0] > 0 and compiles[1:] == [0] * (len(compiles) - 1), compiles


def test_a_slice_at_a_new_offset_reuses_the_kernel_and_reads_its_own_elements():
    base = torch.randn(64, 8)
    dev = base.to("neuron")
    ((dev[3:9] * 2).cpu())  # the first read compiles
    compiles = device_ops.COUNTS["op_compiles"]
    for start in (0, 1, 17, 40, 58):  # offset 0 too: a view that does not span its storage
        assert_close((dev[start:start + 6] * 2).cpu(), base[start:start + 6] * 2)
        # a strided view (a column block) at a moving offset
        assert_close(dev[start:start + 6, 2:5].sum(0).cpu(), base[start:start + 6, 2:5].sum(0))
    assert_close(torch.cat([dev[5:7], dev[1:3]]).cpu(), torch.cat([base[5:7], base[1:3]]))
    # mul at the first offset's signature served every other offset; sum and cat compiled once each
    assert device_ops.COUNTS["op_compiles"] - compiles == 2


def test_chunks_of_one_tensor_share_a_kernel():
    base = torch.randn(2, 3, 12)
    dev = base.to("neuron")
    q, k, v = dev.split(4, dim=-1)
    ref = base.split(4, dim=-1)
    compiles = device_ops.COUNTS["op_compiles"]
    for got, want in zip((q, k, v), ref):
        assert_close(got.exp().cpu(), want.exp())
    assert device_ops.COUNTS["op_compiles"] - compiles == 1


def test_writes_through_views_at_offsets_still_reach_their_storage():
    # an op that writes a storage reads its views at constant offsets (its graph writes through them);
    # a read-only operand at a moving offset in the same call is still a run-time input
    base = torch.zeros(10, 3)
    src = torch.arange(30.0).reshape(10, 3)
    dev, dev_src = base.to("neuron"), src.to("neuron")
    for start in (0, 2, 5):
        base[start:start + 2] += src[7 - start:9 - start]
        dev[start:start + 2] += dev_src[7 - start:9 - start]
        dev[start + 1].copy_(dev_src[start])
        base[start + 1].copy_(src[start])
    assert_close(dev.cpu(), base)
    dev_src[3:5].mul_(2)
    src[3:5].mul_(2)
    assert_close(dev_src.cpu(), src)
