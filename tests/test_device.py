"""The ``neuron`` device: eager ops on neuron tensors against CPU eager.

Every test builds the same computation on CPU and on ``neuron`` and compares
with ``torch.testing.assert_close``; aliasing tests check that a write through
one view is seen through every other; counts (compiles, cache hits) are
asserted where they are the point.
"""

from __future__ import annotations

import io
import textwrap

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def N(t):
    return t.to("neuron")


def test_seed_snippet_from_the_issue():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1).to("neuron")
    x = torch.randn(1, 10, device="neuron")
    out = model(x)
    text = repr(out)
    assert "device='neuron:0'" in text and "grad_fn=<AddmmBackward0>" in text, text
    out.sum().backward()
    assert model.weight.grad.device.type == "neuron"
    # the same on CPU
    torch.manual_seed(0)
    ref_model = torch.nn.Linear(10, 1)
    ref_x = torch.randn(1, 10)
    ref = ref_model(ref_x)
    ref.sum().backward()
    assert_close(x.cpu(), ref_x)
    assert_close(out.cpu(), ref)
    assert_close(model.weight.grad.cpu(), ref_model.weight.grad)


def test_device_module_api():
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.neuron.current_device() == 0
    torch.neuron.synchronize()
    assert torch.device("neuron").type == "neuron"
    assert torch.empty(2, device="neuron:0").device == torch.device("neuron", 0)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.empty(2, device="neuron:1")
    before = torch.neuron.memory_allocated()
    x = torch.ones(1024, device="neuron")
    x.add_(1)
    assert torch.neuron.memory_allocated() - before == 4096
    assert torch.neuron.max_memory_allocated() >= torch.neuron.memory_allocated()
    del x
    torch.neuron.empty_cache()
    assert torch.neuron.memory_allocated() == before


def test_get_device_properties_names_the_device():
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.get_device_name() and props.total_memory > 0
    with pytest.raises(RuntimeError, match="out of range"):
        torch.neuron.get_device_properties(1)


def test_random_ops_give_cpu_numbers():
    for make in (lambda d: torch.randn(3, 4, device=d), lambda d: torch.rand(5, device=d),
                 lambda d: torch.randint(0, 10, (6,), device=d), lambda d: torch.empty(4, device=d).normal_(2, 3),
                 lambda d: torch.empty(4, device=d).uniform_(-1, 1),
                 lambda d: torch.nn.functional.dropout(torch.ones(8, 8, device=d), 0.5)):
        torch.manual_seed(1234)
        got = make("neuron").cpu()
        torch.manual_seed(1234)
        assert_close(got, make("cpu"))


def test_views_and_in_place_ops_alias_like_eager():
    for device in ("cpu", "neuron"):
        x = torch.arange(12.0).reshape(3, 4).to(device)
        row, col, t = x[0], x[:, 1], x.t()
        x[0] += 1  # a write through a view changes the base and every view
        col.mul_(2)
        t[3, 2] = -5
        x.view(-1)[5:7] = 9
        u = x.unsqueeze(0).expand(2, 3, 4)
        results = [x.clone(), row.clone(), col.clone(), t.contiguous(), u.sum(0)]
        if device == "cpu":
            ref = [r for r in results]
        else:
            for got, want in zip(results, ref):
                assert_close(got.cpu(), want)
            assert row._base is x and t._base is x


def test_out_variants_promotion_zero_dim_and_empty():
    a = torch.randn(3, 4)
    b = torch.randn(4)
    for device in ("cpu", "neuron"):
        out = torch.empty(0, device=device)
        torch.add(a.to(device), b.to(device), out=out)  # out= resized from 0 elements
        ints = torch.arange(4, device=device)
        promoted = ints * 0.5 + a.to(device)  # int64 * float -> float32
        zero_dim = a.to(device).sum() * torch.tensor(2.0)  # a 0-d CPU tensor is a scalar, as with CUDA
        empty = torch.empty(0, 4, device=device).sum(0)
        results = [out, promoted, zero_dim, empty, torch.where(a.to(device) > 0, a.to(device), 0.0)]
        if device == "cpu":
            ref = results
        else:
            for got, want in zip(results, ref):
                assert got.device.type == "neuron"
                assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                   torch.bool, torch.float64])
def test_dtypes_round_trip_and_compute(dtype):
    x = (torch.randn(5, 3) * 4).to(dtype)
    n = N(x)
    assert n.dtype == dtype and n.device.type == "neuron"
    assert_close(n.cpu(), x)
    if dtype != torch.bool:
        assert_close((n + n).cpu(), x + x)
    assert_close(n.max().cpu(), x.max())


def test_mixing_devices_raises_like_cuda():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.randn(3, device="neuron") + torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.nn.Linear(3, 2).to("neuron")(torch.randn(1, 3))


def _step_all(optimizer_cls, kwargs, steps=3):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    opt_ref = optimizer_cls(ref.parameters(), **kwargs)
    opt = optimizer_cls(model.parameters(), **kwargs)
    for step in range(steps):
        x = torch.randn(4, 6)
        for m, o, inp in ((ref, opt_ref, x), (model, opt, N(x))):
            o.zero_grad()
            loss = m(inp).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        assert p.device.type == "neuron"
        assert_close(p.cpu(), p_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kwargs", [
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "foreach": False}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "foreach": False}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01}),
    ("Adagrad", {"lr": 0.1}),
    ("Adamax", {"lr": 0.01}),
    ("NAdam", {"lr": 0.01}),
    ("RAdam", {"lr": 0.01}),
])
def test_optimizers_match_cpu(name, kwargs):
    _step_all(getattr(torch.optim, name), kwargs)


def test_save_load_and_state_dict_round_trips(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("neuron")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu", weights_only=True)
    assert all(v.device.type == "cpu" for v in on_cpu.values())
    assert_close(on_cpu["weight"], model.weight.detach().cpu())
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    back = torch.load(path, weights_only=True)  # back on the device it was saved from
    assert back["weight"].device.type == "neuron"
    assert_close(back["weight"].cpu(), model.weight.detach().cpu())
    other = torch.nn.Linear(4, 3).to("neuron")
    other.load_state_dict(back)
    assert_close(other(N(torch.ones(1, 4))).cpu(), model(N(torch.ones(1, 4))).cpu())
    to_neuron = torch.load(io.BytesIO(_saved(torch.nn.Linear(2, 2).state_dict())), map_location="neuron")
    assert to_neuron["weight"].device.type == "neuron"
    cpu_model = torch.nn.Linear(4, 3)
    cpu_model.load_state_dict(model.state_dict())
    assert_close(cpu_model.weight, model.weight.detach().cpu())
    assert model.to("cpu").weight.device.type == "cpu"


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_no_grad_and_inference_mode():
    w = torch.randn(3, 3, device="neuron", requires_grad=True)
    with torch.no_grad():
        y = w * 2
    assert not y.requires_grad
    with torch.inference_mode():
        z = w @ w
    assert not z.requires_grad
    assert_close(z.cpu(), w.detach().cpu() @ w.detach().cpu())


def test_autocast_runs_matmuls_in_bfloat16():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        got = N(a) @ N(b)
        kept = torch.softmax(N(a), -1)  # fp32 list: stays float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = a @ b
    assert got.dtype == torch.bfloat16
    assert kept.dtype == torch.float32
    assert_close(got.cpu(), want)


def test_an_op_that_does_not_lower_names_the_op_and_the_line(monkeypatch):
    from neuron_compile import LoweringError
    from torch.nn.functional import embedding_bag

    indices, offsets, weight = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4]), torch.randn(10, 3)
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "error")
    with pytest.raises(LoweringError) as info:
        embedding_bag(N(indices), N(weight), N(offsets), padding_idx=2)  # Torch-MLIR has no StableHLO for it
    assert "aten.embedding_bag.padding_idx" in str(info.value)
    assert "test_device.py" in str(info.value) and "embedding_bag(N(indices)" in str(info.value)
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    device_ops._HOST_OPS.clear()
    device_ops._WARNED.clear()
    with pytest.warns(UserWarning, match="embedding_bag"):
        got = embedding_bag(N(indices), N(weight), N(offsets), padding_idx=2)
    assert_close(got.cpu(), embedding_bag(indices, weight, offsets, padding_idx=2))


def test_a_new_process_compiles_nothing_for_a_model_it_ran_before(tmp_path, cold_then_warm):
    script = textwrap.dedent("""
        import json, torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        for step in range(2):
            loss = model(torch.randn(4, 8, device="neuron")).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        from neuron_compile.report import COUNTERS
        from neuron_compile.device.ops import COUNTS
        print(json.dumps({"loss": loss.item(), "xla_compiles": COUNTERS["xla_compiles"],
                          "lowerings": COUNTERS["lowerings"], "disk_hits": COUNTERS["disk_hits"],
                          "traced": COUNTS["op_compiles"], "index_hits": COUNTS["index_hits"]}))
    """)
    first, second = cold_then_warm(script, tmp_path / "cache", timeout=600)
    assert first["xla_compiles"] > 10 and first["lowerings"] == first["xla_compiles"]
    assert second["xla_compiles"] == 0 and second["lowerings"] == 0, second
    # the persistent op index: no op is even traced again
    assert second["traced"] == 0 and second["index_hits"] == first["traced"], (first, second)
    assert second["loss"] == first["loss"]


@pytest.mark.slow
def test_gpt2_trains_five_steps_eagerly_with_cpu_losses():
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)  # dropout on: masks drawn as on CPU
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg)
    model = transformers.GPT2LMHeadModel(cfg)
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    assert model.lm_head.weight is model.transformer.wte.weight  # .to("neuron") keeps tied weights tied
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 32))
    for step in range(5):
        losses = []
        for m, o, inp in ((ref, opt_ref, ids), (model, opt, N(ids))):
            torch.manual_seed(100 + step)
            loss = m(inp, labels=inp).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
            o.zero_grad()
            losses.append(loss.item())
        assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)


# (function, new compiles for 4 new values): 0 where the value reaches the executable as an input,
# 4 where it is baked in (one kernel per value: pow's exponent, clamp's bound, a fill value...)
FLOAT_CASES = {
    "mul-div-sub": (lambda x, y, v: x * v + y / v - v, 0),
    "alpha": (lambda x, y, v: x.add(y, alpha=v), 0),
    "ema": (lambda x, y, v: x.clone().mul_(v).add_(y, alpha=1 - v), 0),
    "rdiv": (lambda x, y, v: v / (x.abs() + 1), 0),
    "0d": (lambda x, y, v: x.sum() * v, 0),
    "addcdiv": (lambda x, y, v: torch.addcdiv(x, y, x.abs() + 1, value=-v), 0),
    "pow": (lambda x, y, v: torch.pow(x.abs(), v), 4),
    "clamp": (lambda x, y, v: x.clamp(min=v - 1), 4),
    "rsub": (lambda x, y, v: v - x, 0),  # rsub.Tensor gets a wrapped number: a 0-d input
    # lerp's Scalar weight is a 0-d full_like in torch's decomposition (Adafactor's weight changes every
    # step: a compile per step and parameter shape, its foreach test ran past 300 s)
    "lerp": (lambda x, y, v: torch.lerp(x, y, v), 0),
    "lerp_": (lambda x, y, v: x.clone().lerp_(y, v), 0),
    "foreach_lerp": (lambda x, y, v: torch.stack(torch._foreach_lerp([x, y], [y, x], [v, v / 2])), 0),
    # a fill of a whole storage takes a shared constant buffer (storage.shared_constant): no executable
    "full": (lambda x, y, v: torch.full((3, 1), v, device=x.device) * x, 0),
    "fill_view": (lambda x, y, v: x.clone()[:, 1:].fill_(v), 4),  # a view's fill is its op's, value baked in
    "leaky_relu": (lambda x, y, v: torch.nn.functional.leaky_relu(x, v), 4),
}


@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_changing_float_arguments_are_right_and_compile_once(case):
    fn, expected = FLOAT_CASES[case]
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xn, yn = N(x), N(y)
    fn(xn, yn, 0.35)
    compiles = device_ops.COUNTS["op_compiles"]
    for v in (0.123, 0.77, -0.45, 1e-3, 0.35):  # learning rates, bias corrections...
        assert_close(fn(xn, yn, v).cpu(), fn(x, y, v))
    assert device_ops.COUNTS["op_compiles"] - compiles == expected


def test_a_float_that_changes_an_out_tensors_size_resizes_it():
    """``mvlgamma`` fills ``arange(-p / 2 + 0.5, 0.5, 0.5, out=...)``: each new float start is a kernel of its
    own (arange keeps its floats) and a new length of the ``out=`` tensor, which is resized first (the
    OpInfo sweep's mvlgamma samples crashed there)."""
    x = torch.rand(5, 5) + 2
    with torch.no_grad():
        for p in range(1, 8):
            assert_close(torch.mvlgamma(N(x), p).cpu(), torch.mvlgamma(x, p))


def test_an_adam_step_with_changing_bias_corrections_compiles_nothing_after_the_first():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("neuron")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    compiles = []
    for step in range(4):
        model(torch.randn(2, 8, device="neuron")).sum().backward()
        opt.step()
        opt.zero_grad()
        compiles.append(device_ops.COUNTS["op_compiles"])
    assert compiles[1] == compiles[2] == compiles[3], compiles


def test_convolutions_forward_and_backward():
    torch.manual_seed(0)
    for conv, x, w in ((torch.nn.functional.conv1d, torch.randn(2, 3, 9), torch.randn(4, 3, 3)),
                       (torch.nn.functional.conv2d, torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)),
                       (torch.nn.functional.conv_transpose2d, torch.randn(2, 3, 5, 5), torch.randn(3, 4, 3, 3))):
        b = torch.randn(w.shape[1] if conv is torch.nn.functional.conv_transpose2d else w.shape[0])
        grads = []
        for device in ("cpu", "neuron"):
            leaves = [t.detach().to(device).requires_grad_(True) for t in (x, w, b)]
            out = conv(*leaves, stride=2, padding=1)
            (out * out).sum().backward()
            grads.append([out.detach().cpu()] + [t.grad.cpu() for t in leaves])
        for got, want in zip(grads[1], grads[0]):
            assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["transposed-to", "zero-size", "wrapped-number", "factory", "non-blocking",
                                  "no-meta-kernel", "empty-strided", "masked-write", "masked-select"])
def test_corner_cases_the_opinfo_sweep_found(case):
    x = torch.randn(5, 3)
    if case == "transposed-to":  # a non-contiguous CPU tensor moved to the device (torch makes it contiguous)
        got, want = x.t().to("neuron"), x.t()
    elif case == "zero-size":
        got, want = torch.nan_to_num(torch.zeros(1, 0, 3, device="neuron")), torch.zeros(1, 0, 3)
    elif case == "wrapped-number":  # remainder.Scalar reaches us as remainder.Tensor with a Python int
        i = torch.tensor([[0, 1], [2, 2], [1, 0], [0, 0], [2, 1]])
        got, want = torch.take_along_dim(N(x), N(i), 1), torch.take_along_dim(x, i, 1)
    elif case == "factory":  # no tensor argument at all
        got, want = torch.triu_indices(4, 3, 1, device="neuron"), torch.triu_indices(4, 3, 1)
    elif case == "non-blocking":
        got, want = N(x).to("cpu", non_blocking=True), x
    elif case == "masked-write":  # x[mask] = v: eager's index_put_ reaches the graph as _index_put_impl
        got, want = N(x), x.clone()
        got[got > 0] = 0.5
        want[want > 0] = 0.5
        got[:, 1][got[:, 1] < 0] += 2
        want[:, 1][want[:, 1] < 0] += 2
    elif case == "masked-select":  # a data-dependent shape: the host answers
        got, want = N(x)[N(x) > 0], x[x > 0]
    elif case == "no-meta-kernel":  # _cummax_helper has only CPU and CUDA kernels: the host runs it
        got, want = torch.cummax(N(x), 0).values, torch.cummax(x, 0).values
    else:
        got = torch.empty_strided((2, 3), (1, 2), device="neuron").fill_(3.0)
        want = torch.full((2, 3), 3.0)
        assert got.stride() == (1, 2)
    assert_close(got.cpu(), want)


@pytest.mark.slow
def test_gpt2_greedy_generate_gives_cpu_tokens():
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, 128, (1, 6))
    want = model.generate(ids, max_new_tokens=3, do_sample=False)
    got = model.to("neuron").generate(N(ids), max_new_tokens=3, do_sample=False)
    assert got.device.type == "neuron"
    assert got.cpu().tolist() == want.tolist()


def test_torch_compile_on_device_tensors_trains_with_no_host_copy():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model.load_state_dict(ref.state_dict())
    model.to("neuron")
    compiled_ref, compiled = torch.compile(ref, backend="neuron"), torch.compile(model, backend="neuron")
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 4)
        xn = N(x)
        copies = device_ops.COUNTS["host_copies"]
        out = compiled(xn)
        loss = out.pow(2).mean()
        loss.backward()  # ReLU's backward makes a scalar_tensor on device=neuron inside the graph
        assert device_ops.COUNTS["host_copies"] == copies  # buffers in, buffers out
        assert out.device.type == "neuron" and model[0].weight.grad.device.type == "neuron"
        opt.step()
        opt.zero_grad()
        ref_loss = compiled_ref(x).pow(2).mean()
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        assert_close(loss.cpu(), ref_loss.detach())
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), p_ref)


@pytest.mark.parametrize("name", ["hardshrink", "softshrink", "batch_norm", "sort_stable"])
def test_backward_ops_eager_calls_reach(name):
    fn = {"hardshrink": lambda t: torch.nn.functional.hardshrink(t, 0.3),
          "softshrink": lambda t: torch.nn.functional.softshrink(t, 0.3),
          "batch_norm": lambda t: torch.nn.functional.batch_norm(t, None, None, training=True),
          "sort_stable": lambda t: torch.sort(t.reshape(-1), stable=True).values}[name]
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_(True)
    y, yn = fn(x), fn(xn)
    assert_close(yn.cpu(), y, rtol=1e-4, atol=1e-4)
    (grad,), (grad_n,) = torch.autograd.grad((y * y).sum(), x), torch.autograd.grad((yn * yn).sum(), xn)
    assert_close(grad_n.cpu(), grad, rtol=1e-4, atol=1e-4)


def test_an_element_or_a_slice_of_a_large_storage_comes_to_the_host_alone(monkeypatch):
    """``cache[0, 0, 0, 0].item()``, ``x[i].item()``: the element alone comes to the host (``to_host`` brings a
    whole storage: 16 MiB for one float took milliseconds), at any position with no new compile."""
    from neuron_compile.device import storage

    copied = []
    original = storage.buffer_to_host

    def recording(buffer, dtype):
        copied.append(buffer.size)
        return original(buffer, dtype)

    monkeypatch.setattr(storage, "buffer_to_host", recording)
    x = torch.randn(5000)
    on = x.to("neuron")
    assert on[7].item() == x[7].item()
    compiles = device_ops.COUNTS["op_compiles"]
    for i in (0, 4999, -3, 123):
        assert on[i].item() == x[i].item()
    assert device_ops.COUNTS["op_compiles"] == compiles  # the position is a run-time input
    assert copied and max(copied) == 1, copied
    assert torch.tensor([2.5]).to("neuron").item() == 2.5  # a small storage comes over whole, as before
    # a sampling loop's last position, ``logits[:, -1].cpu()`` / ``.tolist()``: the slice alone too
    logits = torch.randn(2, 64, 100)
    on = logits.to("neuron")
    copied.clear()
    for position in (-1, 5):
        torch.testing.assert_close(on[:, position].cpu(), logits[:, position])
        assert on[:, position].tolist() == logits[:, position].tolist()
    assert copied == [200] * 4, copied


@pytest.mark.parametrize("name, fn", [
    ("abs", lambda x: x.abs()), ("stack", lambda x: torch.stack([x, x * 1, x])),
    ("logical_not", lambda x: torch.logical_not(x)), ("sum", lambda x: x.sum()),
    ("nan_to_num", lambda x: torch.nan_to_num(x / 0.0))])
def test_an_op_torch_runs_as_empty_resize_and_out_is_one_kernel_call(name, fn):
    """Functional ops whose composite kernel is ``empty`` + a resize + ``op.out`` (or a loop of ops, as
    stack's) run as one kernel of their own (aten_kernels._OUT_WRAPPED): one executable, CPU's numbers."""
    from neuron_compile.device import aten_kernels, ops

    assert (name, "default") in aten_kernels._OUT_WRAPPED, name
    x = torch.randn(4, 5)
    d = x.to("neuron")
    torch.testing.assert_close(fn(d).cpu(), fn(x))  # kernels built
    before = dict(ops.COUNTS)
    out = fn(d)
    ran = ops.COUNTS["op_cache_hits"] - before["op_cache_hits"]
    assert ran == (2 if name in ("stack", "nan_to_num") else 1), ran  # stack: x * 1 too; nan_to_num: x / 0.0
    torch.testing.assert_close(out.cpu(), fn(x))
