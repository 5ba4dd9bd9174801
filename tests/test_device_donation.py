"""Buffer donation on the ``neuron`` device: an eager op that overwrites storages of 1 MiB or more
(``ops.DONATE_BYTES``) writes them in place, XLA taking their buffers (``tf.aliasing_output``), except a
storage it reads at another shape; a buffer another storage or the kept constants also hold is copied for
the writer first, never taken."""

from __future__ import annotations

import copy
import textwrap

import pytest
import torch

from neuron_compile.device import ops
from neuron_compile.device.storage import data_of

N = ops.DONATE_BYTES // 4 * 2  # float32 elements: twice the threshold


def _address(t: torch.Tensor) -> int:
    return data_of(t).buffer.unsafe_buffer_pointer()


def test_a_large_in_place_op_writes_its_storage_in_place():
    x, y = torch.randn(N), torch.randn(N)
    a, b = x.to("neuron"), y.to("neuron")
    for _ in range(3):
        before = _address(a)
        a.add_(b, alpha=0.5)
        x.add_(y, alpha=0.5)
        assert _address(a) == before, "the result went to a new buffer: not donated"
        torch.testing.assert_close(a.cpu(), x, rtol=0, atol=0)
    small = torch.randn(1000, device="neuron")
    before = _address(small)
    small.mul_(2)
    assert _address(small) != before, "below DONATE_BYTES the result is a new buffer"


def test_a_buffer_held_elsewhere_is_copied_not_taken():
    """Storages share a buffer (buffers are immutable): the kept zeros of ``torch.zeros``, a storage's clone
    (``copy.deepcopy``). Taking it for one storage's write would delete the other's data."""
    z1, z2 = torch.zeros(N, device="neuron"), torch.zeros(N, device="neuron")
    assert data_of(z1).buffer is data_of(z2).buffer  # the kept constant
    z1.add_(1.0)
    assert torch.equal(z2.cpu(), torch.zeros(N)) and torch.equal(z1.cpu(), torch.ones(N))
    a = torch.randn(N, device="neuron")
    kept = copy.deepcopy(a)
    expected = kept.cpu()
    a.mul_(3)
    torch.testing.assert_close(kept.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(a.cpu(), expected * 3)
    before = _address(a)
    a.mul_(3)  # held by ``a`` alone now: taken
    assert _address(a) == before


@pytest.mark.parametrize("made", ["moved", "zeros on the device"])
def test_a_cache_updated_in_place_by_index_copy(made):
    """A static KV cache's update: ``index_copy_`` of one position into a 2 MiB cache, step after step. The
    cache made on the device (transformers' ``StaticCache``: ``torch.zeros(..., device=...)``) holds the
    kept zeros at its own shape, so the op reads it as its buffer and takes it in place (flat, it was read
    reshaped and never donated)."""
    cpu = torch.zeros(2, 4, 1024, 64)
    dev = cpu.to("neuron") if made == "moved" else torch.zeros(2, 4, 1024, 64, device="neuron")
    for step in range(4):
        k = torch.randn(2, 4, 1, 64)
        position = torch.tensor([step])
        before = _address(dev)
        dev.index_copy_(2, position.to("neuron"), k.to("neuron"))
        cpu.index_copy_(2, position, k)
        if step:  # the first write copies the buffer it shared with the kept zeros
            assert _address(dev) == before
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)


def test_adamw_writes_its_large_parameters_in_place():
    """AdamW's step writes parameters and moments, all read at their buffers' shapes, all donated: the
    moments' storages start as ``zeros_like``'s shared constant at the moment's shape (held flat and read
    reshaped, XLA ran the step slower with them donated, so they were not). The values are CPU's."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(512, 1024)
    dev = copy.deepcopy(cpu).to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, dev)]
    x = torch.randn(8, 512)
    for step in range(3):
        before = _address(dev.weight)
        state = opts[1].state.get(dev.weight)
        moment = _address(state["exp_avg"]) if state else None
        for model, opt, inp in ((cpu, opts[0], x), (dev, opts[1], x.to("neuron"))):
            model(inp).square().mean().backward()
            opt.step()
            opt.zero_grad()
        assert _address(dev.weight) == before, step
        if moment is not None:
            assert _address(opts[1].state[dev.weight]["exp_avg"]) == moment, step
    for p, q in zip(cpu.parameters(), dev.parameters()):
        # Adam turns gradients' float noise into steps of about lr where a gradient is near 0
        torch.testing.assert_close(q.cpu(), p, rtol=1e-3, atol=1e-4)


def test_pjrt_copies_a_donated_buffer_while_a_dlpack_export_lives():
    """What the pins rest on (jaxlib's PJRT CPU client, the device's: asynchronous where ops are queued): a
    parameter marked ``tf.aliasing_output`` is taken (deleted) after the call, unless a DLPack export of it is
    alive: then it is copied, and kept."""
    from jaxlib import _jax

    from neuron_compile.runtime.executor import XlaExecutable, _device, _from_capsule, dlpack_buffer

    n = 1024
    text = (f"module {{\n  func.func @main(%arg0: tensor<{n}xf32> {{tf.aliasing_output = 0 : i32}}, "
            f"%arg1: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n"
            f"    %0 = stablehlo.add %arg0, %arg1 : tensor<{n}xf32>\n    return %0 : tensor<{n}xf32>\n  }}\n}}")
    donating = XlaExecutable.compile(text)
    plain = XlaExecutable.compile(text.replace(" {tf.aliasing_output = 0 : i32}", ""))
    one = dlpack_buffer(torch.ones(n), _device())  # on the device's client
    owned = plain.run_buffers([one, one])[0]  # a buffer XLA owns: 2.0
    out = donating.run_buffers([owned, one])[0]
    assert owned.is_deleted() and not out.is_deleted()
    held = plain.run_buffers([one, one])[0]
    view = _from_capsule(_jax.buffer_to_dlpack_managed_tensor(held))
    out = donating.run_buffers([held, one])[0]
    assert not held.is_deleted() and torch.equal(view, torch.full((n,), 2.0))
    assert torch.equal(_from_capsule(_jax.buffer_to_dlpack_managed_tensor(out)), torch.full((n,), 3.0))


def test_the_donating_kernel_is_keyed_and_found_again_by_a_new_process(tmp_path, cold_then_warm):
    script = textwrap.dedent(f"""
        import json, torch
        from neuron_compile.device import ops
        from neuron_compile.device.storage import data_of
        a = torch.arange({N}, dtype=torch.float32).to("neuron")
        b = torch.ones({N}, device="neuron")
        a.add_(b)
        before = data_of(a).buffer.unsafe_buffer_pointer()
        a.add_(b)
        print(json.dumps({{"in_place": data_of(a).buffer.unsafe_buffer_pointer() == before,
                          "ok": bool(torch.equal(a.cpu(), torch.arange({N}, dtype=torch.float32) + 2)),
                          "traced": ops.COUNTS["op_compiles"], "index_hits": ops.COUNTS["index_hits"]}}))
    """)
    first, second = cold_then_warm(script, tmp_path / "cache")
    assert first["in_place"] and first["ok"] and first["traced"] >= 1
    assert second["in_place"] and second["ok"] and second["traced"] == 0 and second["index_hits"] >= 1, second
    from neuron_compile.runtime.artifact import read_artifact
    from neuron_compile.runtime.cache import ArtifactCache

    donated = [read_artifact(e["path"]).manifest.get("donated") for e in ArtifactCache(tmp_path / "cache").entries()]
    assert [[0, 0]] in donated, donated  # the add_'s storage (parameter 0) is its result 0
