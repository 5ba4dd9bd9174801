"""Compiled graphs over ``neuron`` tensors take whatever the model puts in them.

A model on the device hands its compiled graphs more than device inputs:
constants AOTAutograd lifts out of the code (``torch.tensor([-1],
device=x.device)``: a real device tensor, which has no host memory for the
importer to read), CPU tensors (a 0-d scalar, as eager CUDA allows; a rope's
frequencies built on the host and moved), tensors built on the device from no
device input at all (MPT's alibi bias), and moves between devices inside the
graph (``.to(device)``, ``.cpu()``: ``prims.device_put`` after decomposition).
Each case is compared with CPU eager; what crosses to or from the host is
counted (a CPU constant is transferred once, not per call); the Hugging Face
models that failed that way generate CPU's tokens with a static cache.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from neuron_compile import report
from neuron_compile.device import op_queue
from neuron_compile.device.opkernel import COUNTS


def _compiles() -> tuple[int, int]:
    return report.COUNTERS["lowerings"], report.COUNTERS["xla_compiles"]


class _Literals(torch.nn.Module):
    """A device tensor attribute that is no parameter or buffer, and literals made on the inputs' device."""

    def __init__(self, device):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.table = torch.arange(8.0, device=device).view(2, 4)

    def forward(self, x):
        rows = torch.tensor([2, 0], device=x.device)  # AOTAutograd lifts it: a constant on the device
        offsets = torch.tensor([[0.5, -1.0, 2.0, 0.25]], device=x.device)
        return self.linear(x).index_select(0, rows) + offsets + self.table


def test_device_constants_in_a_compiled_graph_are_read_through_the_transfer_api():
    torch.manual_seed(0)
    cpu = _Literals("cpu")
    model = _Literals("neuron")
    model.linear.load_state_dict(cpu.linear.state_dict())
    model.linear.to("neuron")
    x = torch.randn(3, 4)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        got = compiled(x.to("neuron"))
        assert got.device.type == "neuron"
        assert_close(got.cpu(), cpu(x))
        compiles, copies = _compiles(), COUNTS["host_copies"]
        assert_close(compiled(x.to("neuron")).cpu(), cpu(x))
    assert _compiles() == compiles
    assert COUNTS["host_copies"] == copies + 2  # the input over, the result back: the constants stay put


def test_cpu_tensors_mixed_into_a_device_graph_cross_once():
    def fn(x, scale):
        # a 0-d CPU tensor argument, a 0-d CPU literal, and a bias built on the host and moved
        bias = (torch.arange(4, dtype=torch.float32) / 4).to(x.device)
        return x * scale + torch.tensor(2.0) + bias

    x, scale = torch.randn(3, 4), torch.tensor(3.0)
    compiled = torch.compile(fn, backend="neuron")
    dx = x.to("neuron")
    got = compiled(dx, scale)
    assert got.device.type == "neuron"
    assert_close(got.cpu(), fn(x, scale))
    compiles, copies = _compiles(), COUNTS["host_copies"]
    assert_close(compiled(dx, scale).cpu(), fn(x, scale))
    assert COUNTS["host_copies"] == copies + 1  # the result's .cpu(): the CPU scalar is not moved again
    scale.fill_(-2.0)  # the same tensor, changed in place: moved again
    assert_close(compiled(dx, scale).cpu(), fn(x, scale))
    assert_close(compiled(dx, torch.tensor(0.5)).cpu(), fn(x, torch.tensor(0.5)))
    assert _compiles() == compiles


def _alibi(heads: int, length: int, device):
    """MPT's alibi bias: made from factories alone, on the device it is asked for."""
    alibi = torch.arange(1 - length, 1, dtype=torch.int32, device=device).view(1, 1, 1, length)
    base = torch.arange(1, heads + 1, dtype=torch.int64, device=device).float() * (8 / heads)
    slopes = (1.0 / torch.pow(2, base)).view(1, heads, 1, 1)
    return (alibi * slopes).squeeze(0)


@pytest.mark.parametrize("backend", ["neuron", None])
def test_a_graph_with_no_device_input_builds_its_tensors_on_the_device(backend):
    compiled = torch.compile(_alibi, backend=backend) if backend else torch.compile(_alibi)
    got = compiled(4, 8, torch.device("neuron"))
    assert got.device.type == "neuron"  # not a CPU tensor of XLA's results, and not Inductor's failure
    assert_close(got.cpu(), _alibi(4, 8, "cpu"))
    scores = torch.randn(1, 4, 3, 8)
    assert_close((scores.to("neuron") + got).cpu(), scores + _alibi(4, 8, "cpu"))


def test_moves_between_devices_inside_a_graph_lower_and_land_where_eager_puts_them():
    def fn(x, y):
        moved = y.to(x.device)                      # prims.device_put onto the device
        on_host = (x + moved).cpu()                 # and off it
        wide = x.to("cpu", torch.float64)           # _to_copy with a device and a dtype
        relu = torch.where(x > 0, x, torch.scalar_tensor(0.0, device=x.device))
        return on_host * 2, wide, relu, torch.zeros(0, 4, device=x.device), torch.zeros(0, 2)

    x, y = torch.randn(2, 4), torch.randn(2, 4)
    want = fn(x, y)
    got = torch.compile(fn, backend="neuron")(x.to("neuron"), y)
    assert [t.device.type for t in got] == ["cpu", "cpu", "neuron", "neuron", "cpu"]
    for g, w in zip(got, want):
        assert_close(g.cpu(), w)


def test_dynamo_compiles_only_the_users_frames_around_a_graph_break():
    from torch._dynamo.utils import counters

    def fn(x):
        y = x * 2
        torch._dynamo.graph_break()  # the eager part between the graphs calls the device's kernels
        return torch.cos(y) + 1

    x = torch.randn(3)
    frames = counters["frames"]["total"]
    assert_close(torch.compile(fn, backend="neuron")(x.to("neuron")).cpu(), fn(x))
    assert counters["frames"]["total"] - frames == 2  # fn and its resumption, never a frame of our kernels


# --- Hugging Face models that put such tensors in their graphs -----------------------------------

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
@pytest.mark.parametrize("arch", [
    "mistral",  # sliding window: the static cache's roll indexes with torch.tensor([-1], device=...)
    "gemma2",   # sliding and full layers
    "mpt",      # alibi bias built from factories in a graph of its own (no device input)
    "phimoe",   # rope frequencies built on the host, then .to(device): prims.device_put
])
def test_generate_with_a_static_cache_gives_cpu_tokens(arch, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    sys.path.insert(0, str(_BENCH))
    try:
        import zoo_configs
    finally:
        sys.path.remove(str(_BENCH))
    torch.manual_seed(0)
    cfg = zoo_configs.tiny_config(arch)
    cfg.use_cache = True
    cpu = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    cpu.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="neuron")
    assert model.device.type == "neuron"
    ids = torch.randint(3, 128, (1, 10))  # longer than the sliding window (8)
    kwargs = dict(max_new_tokens=4, cache_implementation="static", do_sample=False)
    want = cpu.generate(ids, **kwargs)
    got = model.generate(ids.to("neuron"), **kwargs)
    assert "inference" in {r.kind for r in report.compile_reports()}  # generate compiled the forward
    assert got.device.type == "neuron" and got.cpu().tolist() == want.tolist()
    op_queue.wait_for_builds()  # what the first call started building in the background (attention: whole_ops)
    compiles = _compiles()
    assert model.generate(ids.to("neuron"), **kwargs).cpu().tolist() == want.tolist()
    assert _compiles() == compiles


def test_a_cpu_tensor_refilled_behind_its_version_is_read_again():
    # a CPU tensor larger than a scalar crosses every call: a write through .data (or a numpy array behind
    # it) does not bump its version, so a kept transfer would be stale
    def fn(x, b):
        return x + b.to(x.device)

    x, b = torch.randn(3, 4), torch.ones(4)
    compiled = torch.compile(fn, backend="neuron")
    dx = x.to("neuron")
    assert_close(compiled(dx, b).cpu(), x + b)
    b.data.fill_(5.0)
    assert_close(compiled(dx, b).cpu(), x + 5.0)


def test_a_graph_of_factories_alone_runs_first_in_a_fresh_process(tmp_path):
    # no eager op has run, so nothing has readied the device for the executor: the executable asks
    # torch.neuron._lazy_init for it
    import subprocess

    code = ("import torch\n"
            "f = torch.compile(lambda n: torch.arange(n, device='neuron') * 2, backend='neuron')\n"
            "out = f(4)\n"
            "print(out.device, out.cpu().tolist())\n")
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "neuron:0 [0, 2, 4, 6]" in result.stdout


def test_a_compiled_training_step_on_the_device_runs_no_eager_op_between_its_graphs(monkeypatch):
    """The activations a compiled forward saves for its backward that are views of its values (GPT-2's
    transposed key, its heads split from one projection) come out of the forward dense
    (``capture.partition.dense_saved_views``), and a view of a whole storage at another shape crosses as
    the same memory (``ExecutorAdapter.to_buffer``): the backward takes them as they are. Before, each was
    copied dense by an eager op before the backward's executable (8 a GPT-2 step). Losses and gradients as
    on the CPU."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from neuron_compile.device import ops

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    cpu = GPT2LMHeadModel(config).train()
    model = GPT2LMHeadModel(config).train()
    model.load_state_dict(cpu.state_dict())
    model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    ids = torch.randint(0, 50, (2, 16))
    on_device = ids.to("neuron")
    dispatched = []
    for step in range(3):
        if step == 2:
            original = ops.dispatch
            monkeypatch.setattr(ops, "dispatch", lambda op, *a: dispatched.append(str(op)) or original(op, *a))
        loss = compiled(input_ids=on_device, labels=on_device).loss
        loss.backward()
        want = cpu(input_ids=ids, labels=ids).loss
        want.backward()
        assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), cpu.parameters()):
            assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)
            p.grad, q.grad = None, None
    assert dispatched == [], dispatched
