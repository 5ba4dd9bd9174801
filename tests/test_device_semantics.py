"""The ``neuron`` device behaves as CPU and CUDA do where PyTorch's own device-generic code expects it.

``tensor.data = ...`` across CPU and neuron, ``Module.to`` moving parameters
in place, CPU index tensors into neuron tensors (CUDA's rules), the memory
format of op results, and ops that used to be missing. Each test compares
with CPU eager (``assert_close``, and strides where the layout is the point).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def N(t):
    return t.to("neuron")


# --- .data = across the host boundary, and Module.to --------------------------------------------

@pytest.mark.parametrize("make", [lambda: torch.nn.Parameter(torch.ones(3)), lambda: torch.ones(3)],
                         ids=["parameter", "tensor"])
def test_data_assignment_moves_a_tensor_to_the_device_and_back_keeping_the_object(make):
    t = make()
    ident, kind, requires_grad = id(t), type(t), t.requires_grad
    t.data = t.to("neuron")
    assert id(t) == ident and type(t) is kind and t.requires_grad == requires_grad
    assert t.device.type == "neuron"
    assert_close(t.cpu(), torch.ones(3))
    t.data = t.cpu()
    assert id(t) == ident and t.device.type == "cpu"
    assert_close(t, torch.ones(3))


def test_a_parameter_moved_by_data_keeps_its_hooks_and_gets_its_gradient_on_the_device():
    p = torch.nn.Parameter(torch.arange(3.0))
    seen = []
    p.register_hook(lambda g: seen.append(g.device.type))
    p.data = p.to("neuron")
    (p * p).sum().backward()
    assert seen == ["neuron"] and p.grad.device.type == "neuron"
    assert_close(p.grad.cpu(), 2 * torch.arange(3.0))


def test_module_to_moves_parameters_in_place_as_for_cuda():
    """PyTorch's device-generic ``test_modules.py::test_to``: ``param.data`` changes, the Parameter object
    stays (an optimizer built before the move still holds it), tied weights stay tied, ``.grad`` moves."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 4), head)
    ids = torch.tensor([1, 2, 3])
    model(ids).sum().backward()
    want = model(ids)  # alive: its autograd graph holds the CPU parameters (torch's swap path refuses them)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    model.to("neuron")
    assert model[0].weight is model[2].weight
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p.device.type == "neuron" and p.grad.device.type == "neuron" for p in params)
    assert all(p.grad is g for p, g in zip(params, grads))  # moved by `.data =` too
    assert_close(model(N(ids)).cpu(), want)
    model.to("cpu")
    assert all(p is q and p.device.type == "cpu" for p, q in zip(model.parameters(), params))


# --- CPU index tensors into neuron tensors: CUDA's rules -----------------------------------------

def _mask_and_index():
    x = torch.arange(12.0).reshape(3, 4)
    return x, x > 5, torch.tensor([2, 0])


INDEXING = {
    "get_mask": lambda x, mask, idx, v: x[mask],
    "set_mask_scalar": lambda x, mask, idx, v: x.__setitem__(mask, 0) or x,
    "set_mask_values": lambda x, mask, idx, v: x.__setitem__(mask, v.reshape(-1)[:6]) or x,
    "get_index": lambda x, mask, idx, v: x[idx],
    "get_index_and_slice": lambda x, mask, idx, v: x[idx, 1:],
    "get_index_dim1": lambda x, mask, idx, v: x[:, idx],
    "get_two_indices": lambda x, mask, idx, v: x[idx, idx + 1],
    "set_index": lambda x, mask, idx, v: x.__setitem__(idx, v) or x,
    "set_index_scalar": lambda x, mask, idx, v: x.__setitem__(idx, 7.0) or x,
    "index_put_": lambda x, mask, idx, v: x.index_put_((idx,), v),
    "index_put_accumulate": lambda x, mask, idx, v: x.index_put_((idx,), v, accumulate=True),
    "index_put": lambda x, mask, idx, v: x.index_put((idx,), v),
}


@pytest.mark.parametrize("name", INDEXING)
def test_cpu_masks_and_indices_index_a_neuron_tensor_as_on_cuda(name):
    """ATen's advanced indexing (``index``, ``index_put_``) moves index tensors to ``self``'s device, so CUDA
    takes CPU masks and indices there; the values must be on the device (or a 0-d CPU tensor)."""
    fn = INDEXING[name]
    x, mask, idx = _mask_and_index()
    v = torch.arange(8.0).reshape(2, 4) + 100
    want = fn(x.clone(), mask, idx, v)
    assert_close(fn(N(x), mask, idx, N(v)).cpu(), want)


def test_gradients_flow_through_cpu_indices():
    x, mask, idx = _mask_and_index()
    for index in (idx, mask):
        ref = x.clone().requires_grad_(True)
        (ref[index] * 3).sum().backward()
        dev = N(x).requires_grad_(True)
        (dev[index] * 3).sum().backward()
        assert_close(dev.grad.cpu(), ref.grad)


def test_index_select_masked_fill_and_a_cpu_value_with_cpu_indices_raise_as_on_cuda():
    """CUDA's ``index_select`` and ``masked_fill`` check that the index is on ``self``'s device; a CPU value
    tensor (not 0-d) is a second device in ``index_put_``'s iterator."""
    x, mask, idx = _mask_and_index()
    with pytest.raises(RuntimeError, match="same device"):
        torch.index_select(N(x), 0, idx)
    with pytest.raises(RuntimeError, match="same device"):
        N(x).masked_fill(mask, 1.0)
    with pytest.raises(RuntimeError, match="same device"):
        N(x)[idx] = torch.ones(2, 4)


def test_a_boolean_mask_does_not_send_later_integer_indexing_to_the_host():
    from neuron_compile.device import ops as device_ops

    x, mask, idx = _mask_and_index()
    assert_close(N(x)[N(mask)].cpu(), x[mask])  # its size depends on the data: the host answers
    host_ops = device_ops.COUNTS["host_ops"]
    assert_close(N(x)[N(idx)].cpu(), x[idx])
    assert device_ops.COUNTS["host_ops"] == host_ops


# --- memory formats: results laid out as CPU lays them out ---------------------------------------

def _channels_last(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


LAYOUTS = {
    "conv2d": lambda x, w: torch.nn.functional.conv2d(x, w, padding=1),
    "relu": lambda x, w: torch.relu(x),
    "add_scalar": lambda x, w: x + 1,
    "add_contiguous": lambda x, w: x + x.contiguous(),
    "batch_norm_train": lambda x, w: torch.nn.functional.batch_norm(x, None, None, training=True),
    "clone": lambda x, w: x.clone(),
    "clone_preserve": lambda x, w: x.clone(memory_format=torch.preserve_format),
    "clone_contiguous": lambda x, w: x.clone(memory_format=torch.contiguous_format),
    "zeros_like": lambda x, w: torch.zeros_like(x),
    "to_channels_last": lambda x, w: x.contiguous().to(memory_format=torch.channels_last),
    "to_dtype": lambda x, w: x.to(torch.float64),
    "sum_keepdim": lambda x, w: x.sum(1, keepdim=True),
    "where": lambda x, w: torch.where(x > 0, x, 0.0),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_results_keep_the_memory_format_cpu_gives_them(name):
    fn = LAYOUTS[name]
    x, w = _channels_last(2, 3, 5, 6), torch.randn(4, 3, 3, 3)
    want = fn(x, w)
    got = fn(N(x), N(w))
    assert got.stride() == want.stride()
    for fmt in (torch.channels_last, torch.contiguous_format):
        assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)
    assert_close(got.cpu(), want)
    assert_close((got * 2).cpu(), want * 2)  # read back by the next op (a transpose of its buffer)


PADS = [("reflection_pad2d", (2, 3, 4, 5)), ("replication_pad2d", (2, 3, 4, 5)),
        ("reflection_pad3d", (2, 3, 4, 5, 6)), ("replication_pad3d", (2, 3, 4, 5, 6)),
        ("reflection_pad3d", (3, 4, 5, 6)), ("replication_pad3d", (3, 4, 5, 6))]  # unbatched, 4-D channels_last


@pytest.mark.parametrize("name,shape", PADS)
def test_padding_keeps_the_layout_of_its_input_forward_and_backward_as_cpu(name, shape):
    """CPU's reflection/replication pad kernels lay the result (and the input's grad) out as the input;
    their Meta kernels say contiguous (torch's module tests check the memory format)."""
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    x = torch.randn(shape).to(memory_format=fmt).requires_grad_()
    device_x = N(x.detach()).requires_grad_()
    pad = [1, 2] * (3 if name.endswith("3d") else 2)  # (left, right) per spatial dim
    op = getattr(torch.ops.aten, name)
    want, got = op(x, pad), op(device_x, pad)
    assert got.stride() == want.stride() and got.is_contiguous(memory_format=fmt)
    assert_close(got.cpu(), want)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(N(grad))
    assert device_x.grad.stride() == x.grad.stride()
    assert_close(device_x.grad.cpu(), x.grad)


def test_empty_like_keeps_the_layout():
    x = _channels_last(2, 3, 5, 6)
    got, want = torch.empty_like(N(x)), torch.empty_like(x)
    assert got.stride() == want.stride() and got.is_contiguous(memory_format=torch.channels_last)


def test_a_channels_last_tensor_moved_back_and_forth_keeps_its_layout_and_values():
    x = _channels_last(2, 3, 4, 5)
    for move in (lambda t: N(t), lambda t: N(t).cpu(), lambda t: N(t) + 0):
        y = move(x)
        assert y.stride() == x.stride()
        assert_close(y.cpu(), x)


def test_a_channels_last_conv_net_trains_as_on_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 2, 1)).to(memory_format=torch.channels_last)
    model = copy.deepcopy(ref).to("neuron")
    x = _channels_last(2, 3, 6, 6)
    out_ref, out = ref(x), model(N(x))
    assert out.stride() == out_ref.stride()
    assert_close(out.cpu(), out_ref, rtol=1e-4, atol=1e-5)
    out_ref.square().mean().backward()
    out.square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.stride() == q.grad.stride()
        assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)


# --- ops that were missing -----------------------------------------------------------------------

def test_a_lazy_module_moved_to_the_device_initializes_there_as_on_cpu():
    torch.manual_seed(0)
    ref = torch.nn.LazyLinear(4)
    torch.manual_seed(0)
    model = torch.nn.LazyLinear(4).to("neuron")
    x = torch.randn(2, 3)
    torch.manual_seed(1)
    want = ref(x)
    torch.manual_seed(1)
    got = model(N(x))
    assert model.weight.device.type == "neuron" and type(model.weight) is torch.nn.Parameter
    assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm_in_eval_mode_as_on_cpu(dtype, affine):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, dtype=dtype)
    stats = torch.randn(3, dtype=dtype), torch.rand(3, dtype=dtype) + 0.5
    weights = (torch.randn(3, dtype=dtype), torch.randn(3, dtype=dtype)) if affine else (None, None)
    want = torch.ops.aten.native_batch_norm(x, *weights, *stats, False, 0.1, 1e-5)
    got = torch.ops.aten.native_batch_norm(N(x), *[N(w) if w is not None else None for w in weights],
                                           *map(N, stats), False, 0.1, 1e-5)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want]  # CPU saves no statistics in eval
    assert_close(got[0].cpu(), want[0])


COMPLEX = {
    "eq": lambda a, b: a == b,
    "eq_scalar": lambda a, b: a == 1j,
    "ne": lambda a, b: a != b,
    "pow_half": lambda a, b: a ** 0.5,
    "pow_float": lambda a, b: a ** 1.7,
    "pow_tensor": lambda a, b: a ** b,
    "isnan": lambda a, b: torch.isnan(a),
    "isfinite": lambda a, b: torch.isfinite(a / b),
    "view_as_real_copy": lambda a, b: torch.view_as_real_copy(a),
    # a complex fill value: Torch-MLIR's importer takes no complex scalar, these lower through JAX
    "fill_": lambda a, b: a.clone().fill_(1 - 2j),
    "fill_tensor": lambda a, b: a.clone().fill_(b[0]),
    "full_like": lambda a, b: torch.full_like(a, 2j),
    "new_full": lambda a, b: a.new_full((2, 3), -1 + 1j),
    # reductions lower through JAX too: ``t.sum()`` reaches it as ``sum.dim_IntList(dim=[])``, every dim
    "sum": lambda a, b: (a * b).sum(),
    "sum_dim_empty": lambda a, b: a.sum(dim=[]),
    "sum_dim_keepdim": lambda a, b: a.view(2, 3).sum(0, keepdim=True),
    "mean": lambda a, b: a.mean(),
    "mean_dim": lambda a, b: a.view(2, 3).mean(1),
}


@pytest.mark.parametrize("name", COMPLEX)
def test_complex_ops_as_on_cpu(name):
    torch.manual_seed(0)
    a, b = torch.randn(6, dtype=torch.complex64), torch.randn(6, dtype=torch.complex64)
    a[1] = b[1]
    want = COMPLEX[name](a, b)
    assert_close(COMPLEX[name](N(a), N(b)).cpu(), want)


def test_assert_equal_compares_complex_neuron_tensors():
    from torch.testing._internal.common_utils import TestCase

    a = N(torch.randn(5, dtype=torch.complex64))
    TestCase().assertEqual(a, a.clone())
    with pytest.raises(AssertionError):
        TestCase().assertEqual(a, a + 1)


MULTILABEL_TARGET = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, -1, 0], [0, -1, 2, 2, 2], [4, 3, 2, 1, 0]])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("rows", [4, 0], ids=["batch", "vector"])
def test_multilabel_margin_loss_and_its_gradient_as_on_cpu(reduction, rows):
    """Labels stop at a row's first -1 (torch's own decomposition counted the slots after it: a wrong
    loss, silently); the backward had no lowering."""
    x = torch.randn(4, 5) if rows else torch.randn(5)
    target = MULTILABEL_TARGET if rows else MULTILABEL_TARGET[0]
    ref = x.clone().requires_grad_(True)
    want = torch.nn.functional.multilabel_margin_loss(ref, target, reduction=reduction)
    want.sum().backward()
    dev = N(x).requires_grad_(True)
    got = torch.nn.functional.multilabel_margin_loss(dev, N(target), reduction=reduction)
    got.sum().backward()
    assert_close(got.cpu(), want)
    assert_close(dev.grad.cpu(), ref.grad)


POOLS = {
    "max_pool2d": lambda x: torch.nn.functional.max_pool2d(x, 2),  # stride left to its default
    "max_pool2d_indices": lambda x: torch.nn.functional.max_pool2d(x, 3, return_indices=True),
    "max_pool2d_channels_last": lambda x: torch.nn.functional.max_pool2d(
        x.contiguous(memory_format=torch.channels_last), 2),
    "adaptive_max_pool2d": lambda x: torch.nn.functional.adaptive_max_pool2d(x, (2, 3), return_indices=True),
}


@pytest.mark.parametrize("name", POOLS)
def test_max_pooling_as_on_cpu(name):
    x = torch.randn(2, 3, 7, 8)
    want = POOLS[name](x)
    got = POOLS[name](N(x))
    assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), got), want)


def test_max_pooling_gradients_as_on_cpu():
    x = torch.randn(2, 3, 7, 8)
    for pool in (lambda t: torch.nn.functional.max_pool2d(t, 2),
                 lambda t: torch.nn.functional.adaptive_max_pool2d(t, (2, 3))):
        ref, dev = x.clone().requires_grad_(True), N(x).requires_grad_(True)
        pool(ref).square().sum().backward()
        pool(dev).square().sum().backward()
        assert_close(dev.grad.cpu(), ref.grad)


@pytest.mark.parametrize("shape,pad", [((2, 3, 5), (2, 1)), ((2, 3, 5, 4), (2, 1, 1, 3)), ((3, 5, 4), (0, 2, 3, 0)),
                                       ((1, 2, 3, 4, 3), (1, 1, 2, 0, 1, 2))], ids=["1d", "2d", "2d_unbatched", "3d"])
def test_replication_padding_gradient_as_on_cpu(shape, pad):
    x = torch.randn(*shape)
    ref, dev = x.clone().requires_grad_(True), N(x).requires_grad_(True)
    torch.nn.functional.pad(ref, pad, mode="replicate").square().sum().backward()
    torch.nn.functional.pad(dev, pad, mode="replicate").square().sum().backward()
    assert_close(dev.grad.cpu(), ref.grad)


FRACTIONAL = {
    "2d": (lambda x, s: torch.nn.functional.fractional_max_pool2d(
        x, (3, 2), output_size=(4, 3), return_indices=True, _random_samples=s), (2, 3, 9, 7), (2, 3, 2)),
    "2d_unbatched": (lambda x, s: torch.nn.functional.fractional_max_pool2d(
        x, 2, output_size=(3, 3), return_indices=True, _random_samples=s), (3, 7, 7), (1, 3, 2)),
    "3d": (lambda x, s: torch.nn.functional.fractional_max_pool3d(
        x, 2, output_size=(3, 3, 2), return_indices=True, _random_samples=s), (2, 3, 7, 6, 5), (2, 3, 3)),
    "3d_one_window": (lambda x, s: torch.nn.functional.fractional_max_pool3d(
        x, 2, output_size=(1, 3, 2), return_indices=True, _random_samples=s), (2, 3, 7, 6, 5), (2, 3, 3)),
    # an unbatched input with two sample rows (module_db's no_batch_dim inputs): ATen reads the first row
    "3d_unbatched_more_samples": (lambda x, s: torch.nn.functional.fractional_max_pool3d(
        x, 2, output_ratio=0.5, return_indices=True, _random_samples=s), (4, 5, 5, 5), (2, 4, 3)),
    "2d_unbatched_more_samples": (lambda x, s: torch.nn.functional.fractional_max_pool2d(
        x, 2, output_size=(3, 3), return_indices=True, _random_samples=s), (3, 7, 7), (2, 3, 2)),
}


@pytest.mark.parametrize("name", FRACTIONAL)
def test_fractional_max_pooling_and_its_gradient_as_on_cpu(name):
    fn, shape, samples_shape = FRACTIONAL[name]
    x, samples = torch.randn(*shape), torch.rand(*samples_shape)
    want = fn(x, samples)
    got = fn(N(x), N(samples))
    assert_close([t.cpu() for t in got], list(want))
    ref, dev = x.clone().requires_grad_(True), N(x).requires_grad_(True)
    fn(ref, samples)[0].square().sum().backward()
    fn(dev, N(samples))[0].square().sum().backward()
    assert_close(dev.grad.cpu(), ref.grad)


@pytest.mark.parametrize("shape", [(2, 0, 3), (0, 5), (4, 0)], ids=str)
def test_zero_size_results_have_cpus_strides(shape):
    # torch's empty device tensor strided a zero-size dim 0 ((2, 0, 3): (0, 3, 1)); CPU: (3, 3, 1)
    x = torch.randn(shape)
    for fn in (lambda t: t + 1, lambda t: t.clone(), lambda t: torch.empty_like(t)):
        assert fn(N(x)).stride() == fn(x).stride()


def test_second_derivatives_through_zero_gradients_as_on_cpu():
    # abs's (sgn's) double backward is an efficient zero tensor: CPU's is a ZeroTensor without data to copy
    x = torch.randn(2, 3, dtype=torch.float64)
    got = []
    for t in (x.clone(), N(x)):
        t.requires_grad_(True)
        g, = torch.autograd.grad(torch.nn.functional.softsign(t).pow(2).sum(), t, create_graph=True)
        gg, = torch.autograd.grad(g.sum(), t)
        got.append((g.detach().cpu(), gg.cpu()))
    assert_close(got[1], got[0])
    assert torch.autograd.gradgradcheck(torch.nn.Softsign(), (N(x).requires_grad_(True),))
    zeros = torch._efficientzerotensor((2, 3), dtype=torch.float32, device="neuron")
    assert zeros.device.type == "neuron"
    assert_close(zeros.cpu(), torch.zeros(2, 3))


def test_filling_a_whole_storage_runs_no_executable_and_later_writes_stay_apart():
    """``zero_`` and ``fill_`` of a tensor over its whole storage (torch.zeros, ones, full, autograd's zero
    gradients of a model's unused outputs) take a constant buffer storages share: no op runs; each tensor's
    later writes are its own, a view's fill still fills only the view, and a fill over 4 MiB runs as an op."""
    from neuron_compile.device import ops

    c = torch.arange(32.0, device="neuron")
    before = dict(ops.COUNTS)
    a = torch.zeros(4, 8, device="neuron")
    b = torch.zeros_like(a)
    c.zero_()
    ones, full = torch.ones(4, 8, device="neuron"), torch.full((3,), -0.0, device="neuron")
    half = torch.full((2, 2), 7.5, dtype=torch.float16, device="neuron")
    ran = {k: ops.COUNTS[k] - before[k] for k in ("op_compiles", "op_cache_hits", "index_hits")}
    assert ran == {"op_compiles": 0, "op_cache_hits": 0, "index_hits": 0}, ran
    a.add_(1)
    b[1, 2] = 5.0
    assert_close(a.cpu(), torch.ones(4, 8))
    expected = torch.zeros(4, 8)
    expected[1, 2] = 5.0
    assert_close(b.cpu(), expected)
    assert_close(c.cpu(), torch.zeros(32))
    ones.mul_(3)
    assert_close(ones.cpu(), torch.full((4, 8), 3.0))
    assert_close(torch.ones(4, 8, device="neuron").cpu(), torch.ones(4, 8))
    assert torch.equal(full.cpu().view(torch.int32), torch.full((3,), -0.0).view(torch.int32))  # the sign kept
    assert_close(half.cpu(), torch.full((2, 2), 7.5, dtype=torch.float16))
    big = torch.full((1025, 1024), 2.0, device="neuron")  # 4.004 MiB: filled by its op
    assert_close(big.cpu(), torch.full((1025, 1024), 2.0))
    x = torch.arange(12.0, device="neuron").reshape(3, 4)
    x[1].zero_()  # a view: the rest of the storage keeps its values
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1] = 0
    assert_close(x.cpu(), expected)
    assert_close(torch.zeros(2, 3, dtype=torch.int64, device="neuron").cpu(), torch.zeros(2, 3, dtype=torch.int64))


def test_scalar_inputs_kept_by_value_tell_minus_zero_from_zero():
    """A Python number or a 0-d CPU tensor reaches the executable as a kept 0-d buffer, looked up by value:
    -0.0 and 0.0 (equal, and hashed alike) are two values, NaN is one."""
    x = torch.ones(3, device="neuron")
    for v in (0.0, -0.0, 0.0, float("nan"), -0.0):
        for scalar in (v, torch.tensor(v)):
            assert_close((1 / (x * scalar)).cpu(), 1 / (torch.ones(3) * scalar), equal_nan=True)


def test_contiguous_of_a_transpose_moves_nothing_from_the_host(monkeypatch):
    """``contiguous()`` copies into a fresh tensor whose storage was never written: its executable still
    reads that storage, as zeros kept on the device, never a host transfer per call."""
    from neuron_compile.device import storage

    x = torch.randn(2, 64, 4, 32)
    xn = x.to("neuron")
    xn.transpose(1, 2).contiguous()  # compiled
    transfers = []
    real = storage.host_to_buffer
    monkeypatch.setattr(storage, "host_to_buffer", lambda *a, **k: transfers.append(1) or real(*a, **k))
    for _ in range(5):
        out = xn.transpose(1, 2).contiguous()
    assert transfers == [], len(transfers)
    assert_close(out.cpu(), x.transpose(1, 2).contiguous(), rtol=0, atol=0)
