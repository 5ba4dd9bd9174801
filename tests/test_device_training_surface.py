"""What a training script touches around the model on the ``neuron`` device, against CPU eager.

Checkpoints (``torch.load(..., map_location="neuron")`` of models and optimizer
states, then resuming), ``torch.accelerator``'s device-generic calls, recurrent
layers (LSTM, GRU, RNN), the host fallback, and a quiet first op.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _run(snippet: str, timeout: int = 240, env: dict | None = None, unset=()) -> subprocess.CompletedProcess:
    """``snippet`` in a fresh interpreter (what happens at start-up and exit is the point)."""
    environ = {name: value for name, value in {**os.environ, **(env or {})}.items() if name not in unset}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(snippet)], capture_output=True, text=True,
                          timeout=timeout, env=environ)


# --- checkpoints -----------------------------------------------------------------------------

def _trained(device: str):
    """A model and its AdamW after one step (the state holds a 0-d ``step`` per parameter)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4).to(device)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _saved(device: str) -> bytes:
    model, opt = _trained(device)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 1,
                "best_val_loss": torch.tensor(0.5)}, buffer)
    return buffer.getvalue()


def _resumed_step(checkpoint: dict, device: str):
    """nanoGPT's ``--init_from=resume``: a fresh model and optimizer take the checkpoint, then one step."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
    model.load_state_dict(checkpoint["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(checkpoint["optimizer"])
    model(torch.randn(3, 4).to(device)).square().mean().backward()
    opt.step()
    return [p.detach().cpu() for p in model.parameters()], opt.state_dict()["state"]


@pytest.mark.parametrize("saved_on", ["cpu", "neuron"])
@pytest.mark.parametrize("weights_only", [True, False])
def test_a_model_and_optimizer_checkpoint_loads_onto_neuron_and_resumes(saved_on, weights_only):
    data = _saved(saved_on)
    ref = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    got = torch.load(io.BytesIO(data), map_location="neuron", weights_only=weights_only)
    step = got["optimizer"]["state"][0]["step"]
    assert step.dim() == 0 and step.device.type == "neuron"
    assert got["best_val_loss"].device.type == "neuron" and got["iter_num"] == 1
    assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got), ref)

    ref_params, ref_state = _resumed_step(ref, "cpu")
    params, state = _resumed_step(got, "neuron")
    assert_close(params, ref_params)
    assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, state),
                 ref_state)


def test_set_onto_a_storage_with_the_default_stride_is_contiguous():
    storage = torch.arange(6.0).to("neuron").untyped_storage()
    for size in [(), (2, 2), (5,)]:
        t = torch.empty(0, device="neuron").set_(storage, 1, size)  # stride left at its default []
        ref = torch.empty(0).set_(torch.arange(6.0).untyped_storage(), 1, size)
        assert t.stride() == ref.stride()
        assert_close(t.cpu(), ref)


def test_a_storage_freed_after_its_module_is_torn_down_at_exit_says_nothing():
    # at interpreter exit Python sets a module's globals to None (names with one underscore first), and
    # a tensor that outlives that (held by a traceback, a torch module) is freed afterwards
    result = _run("""
        import torch
        from neuron_compile.device import storage
        x = torch.ones(4, device="neuron") + 1
        for name in list(vars(storage)):
            if name.startswith("_") and not name.startswith("__"):
                setattr(storage, name, None)
        del x
        print("done")
    """)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr


# --- torch.accelerator -----------------------------------------------------------------------

def test_torch_accelerator_synchronize_and_memory_functions_answer_for_neuron():
    assert torch.accelerator.current_accelerator().type == "neuron"
    torch.accelerator.synchronize()
    torch.accelerator.synchronize("neuron:0")
    x = torch.ones(1024, device="neuron") + 1
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.reset_accumulated_memory_stats()
    base = torch.accelerator.memory_allocated()
    assert base == torch.neuron.memory_allocated() >= x.numel() * 4
    y = x * 2
    assert torch.accelerator.memory_allocated() == base + 4096 == torch.accelerator.memory_reserved()
    del y
    assert torch.accelerator.memory_allocated() == base
    assert torch.accelerator.max_memory_allocated() == base + 4096 == torch.neuron.max_memory_allocated()
    assert torch.accelerator.max_memory_reserved() == base + 4096
    stats = torch.accelerator.memory_stats()
    assert stats == torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base and stats["allocated_bytes.all.peak"] == base + 4096
    assert stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"] == 0
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total == torch.neuron.get_device_properties(0).total_memory
    torch.accelerator.empty_cache()
    with pytest.raises(RuntimeError, match="out of range"):
        torch.accelerator.memory_allocated(1)


def test_torch_accelerator_empty_host_cache_does_not_crash():
    # torch's own binding segfaults for a Python backend (no host allocator): a subprocess
    result = _run("""
        import torch
        torch.ones(2, device="neuron").add_(1)
        torch.accelerator.empty_host_cache()
        print("done")
    """)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr[-2000:]


# --- recurrent layers ------------------------------------------------------------------------

@pytest.mark.parametrize("name, args", [("transpose_", (0, 1)), ("t_", ()), ("swapdims_", (1, 0)),
                                        ("as_strided_", ((3, 2), (1, 3))), ("as_strided_", ((2, 2), (1, 1), 1))])
def test_an_inplace_view_op_changes_metadata_only(name, args):
    # nn.RNN(batch_first=True) ends with output.transpose_(0, 1): the data was transposed a second time
    ref = torch.arange(6.0).reshape(2, 3) + 1
    x = (torch.arange(6.0).reshape(2, 3).to("neuron") + 1)
    assert getattr(x, name)(*args) is x
    getattr(ref, name)(*args)
    assert (x.shape, x.stride(), x.storage_offset()) == (ref.shape, ref.stride(), ref.storage_offset())
    assert_close(x.cpu(), ref)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.as_strided_((4, 4), (1, 1))


def _rnn(kind: str, **kwargs):
    torch.manual_seed(0)
    if kind in ("RNN_TANH", "RNN_RELU"):
        return torch.nn.RNN(4, 5, nonlinearity=kind[4:].lower(), **kwargs)
    return getattr(torch.nn, kind)(4, 5, **kwargs)


def _rnn_loss(module, x):
    out, hidden = module(x)
    last = hidden[0] if isinstance(hidden, tuple) else hidden
    return out.square().sum() + last.sum()


def _grads_after(module, x, step):
    loss = step(module, x)
    loss.backward()
    return [loss.detach().cpu()] + [p.grad.cpu() for p in module.parameters()]


@pytest.mark.parametrize("kind, shape", [
    (kind, dict(num_layers=2, batch_first=True, bidirectional=True, dropout=0.0))
    for kind in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")] + [("LSTM", dict(bias=False)), ("GRU", dict(bias=False))])
def test_a_recurrent_layer_trains_on_neuron_as_on_cpu(kind, shape):
    # LSTM's and GRU's cells are ATen's fused ones off the CPU (_thnn_fused_lstm_cell, _gru_cell: CUDA
    # kernels only); batch_first outputs end with an in-place transpose_
    x = torch.randn(2, 3, 4)
    ref = _grads_after(_rnn(kind, **shape), x, _rnn_loss)
    got = _grads_after(_rnn(kind, **shape).to("neuron"), x.to("neuron"), _rnn_loss)
    assert_close(got, ref)


@pytest.mark.parametrize("allow_rnn, kind", [(False, "GRU"), (True, "LSTM")])
def test_a_recurrent_layer_trains_under_torch_compile(allow_rnn, kind):
    # Dynamo skips nn.LSTM unless allow_rnn: its forward then runs eagerly inside the compiled function,
    # where C++ calls the device's kernels (Dynamo compiled their frames and failed)
    import torch._dynamo

    x = torch.randn(2, 3, 4)
    shape = dict(num_layers=2, batch_first=True, bidirectional=True)
    ref = _grads_after(_rnn(kind, **shape), x, _rnn_loss)
    with torch._dynamo.config.patch(allow_rnn=allow_rnn):
        got = _grads_after(_rnn(kind, **shape).to("neuron"), x.to("neuron"), torch.compile(_rnn_loss, backend="neuron"))
    assert_close(got, ref)


def test_word_language_model_trains_on_neuron_as_on_cpu():
    """pytorch/examples' word_language_model in small: Embedding -> LSTM -> Linear, SGD steps with
    clip_grad_norm_, the hidden state carried over (detached) from batch to batch."""
    kind = "LSTM"

    class RNNModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Embedding(20, 8)
            self.rnn = getattr(torch.nn, kind)(8, 8, 2, dropout=0.0)
            self.decoder = torch.nn.Linear(8, 20)

        def forward(self, tokens, hidden):
            output, hidden = self.rnn(self.encoder(tokens), hidden)
            return torch.log_softmax(self.decoder(output), dim=-1), hidden

    def train(device):
        torch.manual_seed(0)
        model = RNNModel().to(device)
        zeros = torch.zeros(2, 3, 8, device=device)
        hidden = (zeros, zeros) if kind == "LSTM" else zeros
        data = torch.randint(0, 20, (3, 6, 3))
        losses = []
        for tokens in data:
            tokens = tokens.to(device)
            hidden = tuple(h.detach() for h in hidden) if kind == "LSTM" else hidden.detach()
            model.zero_grad()
            output, hidden = model(tokens[:-1], hidden)
            loss = torch.nn.functional.nll_loss(output.view(-1, 20), tokens[1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-1.0)
            losses.append(loss.detach().cpu())
        return losses, [p.detach().cpu() for p in model.parameters()]

    assert_close(train("neuron"), train("cpu"))


# --- fallback="eager" for an op the CPU has no kernel for --------------------------------------

_lib = torch.library.Library("neuron_surface_test", "DEF")
_lib.define("no_lower(Tensor x) -> Tensor")  # a CPU kernel; torch-mlir will never lower it
_lib.impl("no_lower", lambda x: x.flip(0) * 3, "CompositeExplicitAutograd")
_lib.impl("no_lower", lambda x: torch.empty_like(x), "Meta")
for _name in ("cuda_only", "cuda_only_undecomposed"):  # kernels for CUDA only, as _thnn_fused_lstm_cell's
    _lib.define(f"{_name}(Tensor x) -> Tensor")
    _lib.impl(_name, lambda x: x, "CUDA")
    _lib.impl(_name, lambda x: torch.empty_like(x), "Meta")


@torch._decomp.register_decomposition(torch.ops.neuron_surface_test.cuda_only.default)
def _cuda_only(x):
    return torch.ops.neuron_surface_test.no_lower(x) + 1


def test_fallback_eager_runs_an_op_without_a_cpu_kernel_through_its_decomposition(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    x = torch.randn(3, 2)
    with pytest.warns(UserWarning, match="cuda_only"):
        got = torch.ops.neuron_surface_test.cuda_only(x.to("neuron"))
    assert got.device.type == "neuron"
    assert_close(got.cpu(), x.flip(0) * 3 + 1)


def test_an_op_that_runs_nowhere_says_so(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    with pytest.raises(NotImplementedError, match="nor on the host .*no decomposition"):
        torch.ops.neuron_surface_test.cuda_only_undecomposed(torch.randn(3, 2).to("neuron"))


# --- a quiet start -------------------------------------------------------------------------------

_FIRST_USE = """
    import torch
    m = torch.nn.Linear(2, 2).to("neuron")  # a copy to the device first: it imports jax before our client
    x = torch.ones(4, device="neuron") + 1
    import jax.numpy as jnp  # a library that makes a client of its own after ours
    jnp.zeros(2).block_until_ready()
    print(x.cpu().tolist())
"""


def test_the_first_op_prints_no_runtime_start_up_lines():
    result = _run(_FIRST_USE, unset=("TF_CPP_MIN_LOG_LEVEL", "JAX_LOGGING_LEVEL"))
    assert result.returncode == 0 and "[2.0, 2.0, 2.0, 2.0]" in result.stdout, result.stderr[-3000:]
    assert "pjrt_client" not in result.stderr and "PjRt" not in result.stderr, result.stderr[-3000:]


def test_runtime_lines_show_when_the_user_asks_for_them():
    result = _run(_FIRST_USE, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("PjRt-IFRT device count") == 2, result.stderr[-3000:]  # our client's and jax's
