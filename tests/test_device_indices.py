"""Several ``neuron`` devices per process, as CUDA has several GPUs: ``neuron:i`` on PJRT device ``i``.

``torch.neuron.device_count()`` is ``NEURON_DEVICE_COUNT``, else torchrun's ``LOCAL_WORLD_SIZE`` (one
device per local rank), else 1 (``runtime/devices.py``). The checks that need two devices run in a fresh interpreter
(the PJRT client takes its device count when it starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def _run(snippet: str, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(snippet)], capture_output=True, text=True,
                          timeout=timeout, env=environ)


def test_the_count_follows_the_variable_then_torchrun_then_one(monkeypatch):
    from neuron_compile.runtime.devices import local_device_count

    monkeypatch.delenv("NEURON_DEVICE_COUNT", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_device_count() == 1 == torch.neuron.device_count()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # under torchrun: one device per local rank
    assert torch.neuron.device_count() == 4 == torch.accelerator.device_count()
    monkeypatch.setenv("NEURON_DEVICE_COUNT", "3")
    assert torch.neuron.device_count() == 3
    monkeypatch.setenv("NEURON_DEVICE_COUNT", "zero")
    with pytest.raises(ValueError, match="NEURON_DEVICE_COUNT='zero'"):
        torch.neuron.device_count()


def test_a_bad_index_is_an_error_at_the_call_that_names_it(monkeypatch):
    monkeypatch.delenv("NEURON_DEVICE_COUNT", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for call in (lambda: torch.accelerator.set_device_index(1), lambda: torch.neuron.set_device(1),
                 lambda: torch.neuron.set_device("neuron:1"), lambda: torch.empty(2, device="neuron:1"),
                 lambda: torch.ones(2).to("neuron:1"), lambda: torch.neuron.device(1)):
        with pytest.raises(RuntimeError, match=r"neuron device 1 is out of range: this process has 1 neuron device "
                                               r"\(neuron:0\); NEURON_DEVICE_COUNT"):
            call()
    assert torch.accelerator.current_device_index() == torch.neuron.current_device() == 0
    torch.accelerator.set_device_index(0)
    torch.neuron.set_device(-1)  # a negative index is a no-op, as on CUDA
    assert torch.neuron.current_device() == 0


TWO_DEVICES = """
    import io, torch
    from torch.testing import assert_close
    from neuron_compile.device import storage
    from neuron_compile.device.opkernel import COUNTS

    assert torch.neuron.device_count() == torch.accelerator.device_count() == 2
    # set_device, torch.accelerator and current_device agree
    torch.accelerator.set_device_index(1)
    assert torch.neuron.current_device() == torch.accelerator.current_device_index() == 1
    torch.neuron.set_device(0)
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron", 1)  # the current device
    with torch.neuron.device(1):
        assert torch.zeros(3, device="neuron").device == torch.device("neuron", 1)
    assert torch.neuron.current_device() == 0 and torch.zeros(1, device="neuron").device.index == 0

    # neuron:1's data lives on PJRT device 1, and every op result stays there
    a = torch.randn(4, 3)
    x1 = a.to("neuron:1")
    y = (x1 * 2 + 1).relu().sum(0)
    assert x1.device == y.device == torch.device("neuron", 1)
    assert storage.data_of(y).buffer.device.id == 1 and storage.data_of(x1).buffer.device.id == 1
    assert_close(y.cpu(), (a * 2 + 1).relu().sum(0))

    # copies between neuron:0 and neuron:1
    x0 = x1.to("neuron:0")
    assert x0.device.index == 0 and storage.data_of(x0).buffer.device.id == 0
    assert_close(x0.cpu(), a)
    z = torch.empty(4, 3, device="neuron:1")
    z.copy_(x0 + 1)
    assert z.device.index == 1 and storage.data_of(z).buffer.device.id == 1
    assert_close(z.cpu(), a + 1)

    # mixed indices raise as on CUDA
    try:
        x0 + x1
    except RuntimeError as error:
        assert "Expected all tensors to be on the same device" in str(error) and "neuron:1" in str(error), error
    else:
        raise AssertionError("neuron:0 + neuron:1 did not raise")

    # training on neuron:1: a module, autograd and an optimizer, against CPU
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.load_state_dict(ref.state_dict())
    model.to("neuron:1")
    assert all(p.device.index == 1 for p in model.parameters())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    for step in range(2):
        for m, opt, dev in ((ref, opts[0], "cpu"), (model, opts[1], "neuron:1")):
            loss = m(a.to(dev)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(ref.parameters(), model.parameters()):
        assert q.device.index == 1
        assert_close(q.cpu(), p)

    # a compiled graph on neuron:1 runs on device 1 and gives neuron:1 tensors, no host copy
    compiled = torch.compile(lambda t: (t.sin() * 3).sum(1), backend="neuron")
    before = COUNTS["host_copies"]
    out = compiled(x1)
    assert out.device.index == 1 and storage.data_of(out).buffer.device.id == 1
    assert COUNTS["host_copies"] == before
    assert_close(out.cpu(), (a.sin() * 3).sum(1))

    # checkpoints load onto either device
    buffer = io.BytesIO()
    torch.save(x1, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="neuron:1")
    assert loaded.device.index == 1
    assert_close(loaded.cpu(), a)
    print("OK")
"""


def test_two_devices_in_one_process():
    result = _run(TWO_DEVICES, {"NEURON_DEVICE_COUNT": "2"})
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout[-3000:] + result.stderr[-6000:]


def test_under_torchrun_with_a_device_per_local_rank_the_current_device_is_the_local_rank():
    result = _run("""
        import torch
        assert torch.neuron.device_count() == 2
        assert torch.neuron.current_device() == 1  # the local rank, where it names a device
        torch.neuron.set_device(1)   # what transformers does with LOCAL_RANK
        x = torch.arange(4.0).to(torch.device("neuron", 1)) * 2
        assert x.device == torch.device("neuron", 1) and x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]

        # no index names the current device, as on CUDA, on every path that moves data there (torch's C++
        # asked the Python device guard, which answers 0: x.to("neuron") was labelled neuron:0, its next op raised)
        c = torch.arange(3.0)
        moved = {
            "to": c.to("neuron"), "to(device)": c.to(torch.device("neuron")),
            "to(device=, dtype=)": c.to(device="neuron", dtype=torch.float64), "neuron()": c.neuron(),
            "tensor": torch.tensor([0.0, 1.0, 2.0], device="neuron"), "as_tensor": torch.as_tensor(c, device="neuron"),
            "asarray": torch.asarray(c, device="neuron"), "Module.to": torch.nn.Linear(3, 3).to("neuron").weight[0],
            "new_tensor": x.new_tensor([0.0, 1.0, 2.0]), "zeros": torch.zeros(3, device="neuron"),
        }
        for name, t in moved.items():
            assert t.device == torch.device("neuron", 1), (name, t.device)
            assert (t + x[:3].to(t.dtype)).device.index == 1, name   # the next op runs (it raised)
        assert c.to("neuron:0").device.index == 0   # a named index stays what it names
        with torch.device("meta"):   # a device context still reaches torch.tensor (transformers reads it so)
            assert torch.tensor([]).device.type == "meta" and torch.as_tensor([1.0]).device.type == "meta"
        import torch._dynamo.testing
        counter = torch._dynamo.testing.CompileCounter()   # Dynamo traces through the wrappers: one frame
        traced = torch.compile(lambda t: t * torch.tensor(2.0, device="neuron") + t.new_tensor([1.0, 2.0, 3.0]),
                               backend=counter)(torch.ones(3, device="neuron"))
        assert counter.frame_count == 1 and traced.device.index == 1 and traced.cpu().tolist() == [3.0, 4.0, 5.0]
        torch.neuron.set_device(0)
        assert c.to("neuron").device.index == 0 and x.new_tensor([1.0]).device.index == 1  # new_tensor: x's device
        print("OK")
    """, {"NEURON_DEVICE_COUNT": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-4000:]
