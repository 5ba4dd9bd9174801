"""The device's client dispatches asynchronously (``runtime/executor.asynchronous``): XLA computes a queue's
run while the host issues what follows; reads, ``synchronize`` and index checks still see op by op's values
and errors. Executables run on CPU tensors (``torch.compile`` on the host) keep a synchronous client."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.device import op_queue
from neuron_compile.runtime import executor


@pytest.fixture(autouse=True)
def _queue_on():
    if not op_queue.active():
        pytest.skip("eager fusion is off in this process (NEURON_COMPILE_EAGER_FUSION=0 or launch blocking)")
    yield
    torch.neuron.synchronize()


def test_dispatch_is_asynchronous_only_where_ops_are_queued(monkeypatch):
    for name in ("NEURON_COMPILE_ASYNC_DISPATCH", "NEURON_LAUNCH_BLOCKING", "NEURON_COMPILE_EAGER_FUSION"):
        monkeypatch.delenv(name, raising=False)
    assert executor.asynchronous()
    monkeypatch.setenv("NEURON_LAUNCH_BLOCKING", "1")  # every op completes where it is issued
    assert not executor.asynchronous()
    monkeypatch.setenv("NEURON_COMPILE_ASYNC_DISPATCH", "1")  # decides alone where set
    assert executor.asynchronous()
    monkeypatch.delenv("NEURON_LAUNCH_BLOCKING")
    monkeypatch.setenv("NEURON_COMPILE_EAGER_FUSION", "0")
    monkeypatch.delenv("NEURON_COMPILE_ASYNC_DISPATCH")
    assert not executor.asynchronous()


def test_synchronize_waits_until_xla_has_run_what_it_was_given():
    torch.manual_seed(0)
    a, b = torch.randn(512, 512) / 16, torch.randn(512, 512) / 16

    def chain(x, w):
        for _ in range(8):
            x = torch.tanh(x @ w)
        return x

    x, w = a.to("neuron"), b.to("neuron")
    chain(x, w).cpu()  # kernels built
    for sync in (torch.neuron.synchronize, torch.accelerator.synchronize):
        y = chain(x, w)
        op_queue.flush()  # dispatched: the client returns before XLA has run it
        sync()
        client = executor._client()
        assert executor._ASYNCHRONOUS, "the device's client dispatches synchronously in this process"
        waiting = [arr.shape for arr in client.live_arrays() if not arr.is_ready()]
        assert not waiting, f"{sync.__module__}.synchronize returned with {len(waiting)} buffers not computed"
        torch.testing.assert_close(y.cpu(), chain(a, b), rtol=1e-4, atol=1e-5)


def test_cpu_tensors_compiled_graphs_run_on_a_synchronous_client_and_see_each_calls_inputs():
    torch.manual_seed(0)

    def f(x, w):
        return torch.relu(x @ w).sum(dim=0)

    compiled = torch.compile(f, backend="neuron", dynamic=False)
    w = torch.randn(64, 32)
    for step in range(5):  # the same graph, new inputs each call, an input changed in place after each
        x = torch.randn(16, 64) + step
        out = compiled(x, w)
        expected = f(x, w)
        x.add_(100.0)  # a synchronous call has read x already: the result cannot move
        torch.testing.assert_close(out, expected)
    executor._client()
    if executor._ASYNCHRONOUS:  # how the device's client was made
        host = executor._host_client()
        assert host is not executor._client(), "CPU tensors' executables share the asynchronous client"
        assert host.live_executables(), "the graph did not run on the host client"


def test_an_index_check_deferred_to_the_queue_raises_at_the_next_read_not_at_a_donation():
    """An index a queued op computes is checked at the next synchronization. A run the host does not wait
    for (here: a large in-place write, whose kernel takes its buffer and runs the queue first) no longer
    reads the index's values, which would wait for XLA to compute them."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).to("neuron")
    ids = torch.tensor([[1, 2, 3]], device="neuron")
    big = torch.zeros(1 << 19, device="neuron")  # 2 MiB: its in-place add takes the buffer (donation)
    with torch.no_grad():
        emb(ids + 1).sum().cpu()
        big.add_(1.0)  # kernels built
        bad = emb(ids + 8).sum()  # 9, 10, 11: past the table, computed by a queued op
        runs = op_queue.COUNTS["runs"]
        big.add_(1.0)  # the queue runs (the donation): the check waits for the read
        assert op_queue.COUNTS["runs"] == runs + 1 and op_queue.pending() == 0
        with pytest.raises(IndexError, match="out of range") as info:
            bad.cpu()
    assert "bad = emb(ids + 8).sum()" in str(info.value), str(info.value)
    torch.testing.assert_close(big[:4].cpu(), torch.full((4,), 2.0))


def test_a_failure_xla_reports_at_a_read_says_how_to_find_the_op(monkeypatch):
    from neuron_compile.device import storage

    class XlaRuntimeError(RuntimeError):  # jaxlib's class, by name
        pass

    class Failed:
        def _single_device_array_to_np_array_did_copy(self):
            raise XlaRuntimeError("INTERNAL: the executable failed")

    with pytest.raises(RuntimeError, match="NEURON_LAUNCH_BLOCKING=1") as info:
        storage._host_array(Failed())
    assert isinstance(info.value.__cause__, XlaRuntimeError)
    assert "the executable failed" in str(info.value)
