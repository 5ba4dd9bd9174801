"""Views on the ``neuron`` device against CPU eager: metadata and aliasing.

In-place view ops (``torch.Tag.inplace_view``: ``t_``, ``transpose_``,
``squeeze_``, ``as_strided_``, ``set_``...) change a tensor's size, stride and
offset on its own storage; every later write through the tensor, or through a
further view of it, must land where CPU's lands. ``view(dtype)`` of any
element size shares the storage byte for byte, on the device and in compiled
graphs.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

aten = torch.ops.aten


def _inplace_view_ops() -> list:
    """Every aten overload torch tags ``inplace_view``: a new one is tested (and needs a sample below)."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        packet, _, overload = name.removeprefix("aten::").partition(".")
        op = getattr(getattr(aten, packet), overload or "default")
        if torch.Tag.inplace_view in op.tags:
            found.append(op)
    return sorted(found, key=str)


def _strided(base):
    return base[1:, ::2]  # 3x3, strides (6, 2), offset 6: not contiguous


# op -> (the view it works on, its arguments after self); both from the base
SAMPLES = {
    "aten.as_strided_.default": (_strided, lambda b: ((2, 3), (1, 2), 3)),
    "aten.detach_.default": (lambda b: b, lambda b: ()),  # (a view can't be detached in place)
    "aten.resize_.default": (_strided, lambda b: ((2, 3),)),
    "aten.resize_as_.default": (_strided, lambda b: (b[:2, :4],)),
    "aten.set_.default": (_strided, lambda b: ()),
    "aten.set_.source_Storage": (_strided, lambda b: (b.untyped_storage(),)),
    "aten.set_.source_Storage_storage_offset": (_strided, lambda b: (b.untyped_storage(), 2, (2, 3), (1, 2))),
    "aten.set_.source_Tensor": (_strided, lambda b: (b[:, 1:3],)),
    "aten.set_.source_Tensor_storage_offset": (_strided, lambda b: (b, 2, (2, 3), (1, 2))),
    "aten.squeeze_.default": (lambda b: b[1:2, ::2].unsqueeze(2), lambda b: ()),
    "aten.squeeze_.dim": (lambda b: b[1:2, ::2].unsqueeze(2), lambda b: (2,)),
    "aten.squeeze_.dims": (lambda b: b[1:2, ::2].unsqueeze(2), lambda b: ([0, 2],)),
    "aten.swapaxes_.default": (_strided, lambda b: (0, 1)),
    "aten.swapdims_.default": (_strided, lambda b: (1, 0)),
    "aten.t_.default": (_strided, lambda b: ()),
    "aten.transpose_.default": (_strided, lambda b: (0, 1)),
    "aten.unsqueeze_.default": (_strided, lambda b: (1,)),
}


def _run(op, device, made_by):
    base = torch.arange(1.0, 25.0).reshape(4, 6).clone()  # not a view
    base = base.to(device) if made_by == "copy" else (base.to(device) * 1)  # an op's result or a copy's
    make_view, make_args = SAMPLES[str(op)]
    v = make_view(base)
    out = op(v, *make_args(base))
    assert out is v
    # a write through the view, one value per element (a misplaced element shows), then through a view of it
    v.copy_(torch.arange(100.0, 100.0 + v.numel()).reshape(v.shape).to(device))
    if v.dim() and v.numel():
        v.select(-1, 0).mul_(-1)
    return base, v


@pytest.mark.parametrize("made_by", ["copy", "op"])
@pytest.mark.parametrize("op", _inplace_view_ops(), ids=str)
def test_inplace_view_ops_keep_aliasing_like_cpu(op, made_by):
    assert str(op) in SAMPLES, f"{op} is a new in-place view op: give it a sample in SAMPLES"
    base, v = _run(op, "neuron", made_by)
    ref_base, ref_v = _run(op, "cpu", made_by)
    assert (v.shape, v.stride(), v.storage_offset()) == (ref_v.shape, ref_v.stride(), ref_v.storage_offset())
    assert_close(v.cpu(), ref_v)
    assert_close(base.cpu(), ref_base)


def test_inplace_view_ops_under_autograd_like_cpu():
    def run(device):
        torch.manual_seed(0)
        w = torch.randn(3, 4).to(device).requires_grad_()
        y = w * 2
        y.t_()
        y.unsqueeze_(0)
        (y * torch.arange(12.0).reshape(1, 4, 3).to(device)).sum().backward()
        return y, w.grad

    y, grad = run("neuron")
    ref_y, ref_grad = run("cpu")
    assert (y.shape, y.stride()) == (ref_y.shape, ref_y.stride())
    assert_close(y.detach().cpu(), ref_y.detach())
    assert_close(grad.cpu(), ref_grad)


def _is_view_of(base, other):  # PyTorch's test_view_ops.py, for devices that do not expose storage
    return other._is_view() and other is not base and other._base is base and base.device == other.device


def test_t_inplace_view():  # PyTorch's test_view_ops.py, on neuron
    t = torch.ones(5, 5, device="neuron")
    v = t.view_as(t)
    v = v.t_()
    assert _is_view_of(t, v)
    v[0, 1] = 0
    assert_close(t[1, 0], v[0, 1])
    assert t[1, 0].item() == 0


@pytest.mark.parametrize("method", ["swapdims_", "swapaxes_", "transpose_"])
def test_transpose_inplace_view(method):  # PyTorch's test_view_ops.py, on neuron
    t = torch.ones(5, 5, device="neuron")
    v = t.view_as(t)
    v = getattr(v, method)(0, 1)
    assert _is_view_of(t, v)
    v[0, 1] = 0
    assert_close(t[1, 0], v[0, 1])
    assert t[1, 0].item() == 0


@pytest.mark.parametrize("made_by", ["copy", "op"])
def test_as_strided_inplace_past_the_storage_raises_like_cpu(made_by):
    for device in ("cpu", "neuron"):
        base = torch.zeros(2, 3).to(device)
        base = base if made_by == "copy" else base * 1
        with pytest.raises(RuntimeError, match="out of bounds"):
            base.as_strided_((2, 3), (3, 1), 1)


# --- view(dtype): a view of the same storage, its bytes read in another dtype ---------------------

DTYPE_PAIRS = [(torch.float16, torch.uint8), (torch.float16, torch.int8), (torch.float32, torch.int16),
               (torch.float32, torch.int64), (torch.float32, torch.float16), (torch.int64, torch.float32),
               (torch.bool, torch.uint8), (torch.complex64, torch.float32),
               (torch.bfloat16, torch.int16), (torch.uint8, torch.float32), (torch.float16, torch.float32),
               # Torch-MLIR imports no uint16 / uint64: these views (and their copies) lower through JAX
               (torch.bool, torch.uint16), (torch.complex64, torch.uint64)]


def _dtype_view_inputs(dtype):
    """PyTorch's test_view_ops.py::test_view_dtype_new inputs: (a host tensor, the view taken of it)."""
    torch.manual_seed(0)
    make = lambda *shape: torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=-5, high=5)  # noqa: E731
    return [(make(4, 4, 64), lambda t: t), (make(4, 4, 64), lambda t: t.permute(1, 0, 2)),
            (make(4, 64, 4), lambda t: t.permute(2, 0, 1)), (make(1, 5, 1), lambda t: t.expand(5, 5, 64)),
            (make(2, 5, 256), lambda t: t[1::2, 1:, ::2]), (make(0, 5, 64), lambda t: t), (make(), lambda t: t)]


def _bytes(t):
    t = t.cpu()
    return t.contiguous().view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


@pytest.mark.parametrize("src,dst", DTYPE_PAIRS, ids=str)
def test_view_dtype_has_cpus_shape_strides_and_bytes(src, dst):
    for base, take in _dtype_view_inputs(src):
        host, device = take(base), take(base.to("neuron"))
        try:
            expected = host.view(dst)
        except RuntimeError as error:
            with pytest.raises(RuntimeError, match=str(error).split(" to view")[0].replace("(", r"\(")
                               .replace(")", r"\)")):
                device.view(dst)
            continue
        view = device.view(dst)
        assert (view.shape, view.stride(), view.storage_offset()) == \
            (expected.shape, expected.stride(), expected.storage_offset())
        assert torch.equal(_bytes(view), _bytes(expected))
        assert torch.equal(_bytes(view.view(src)), _bytes(host))
        assert view.untyped_storage().data_ptr() == device.untyped_storage().data_ptr()


def test_a_bool_view_of_bytes_holds_0_or_1_else_raises():
    ref = torch.tensor([0, 1, 1, 0], dtype=torch.uint8)
    x = ref.to("neuron")
    v, ref_v = x.view(torch.bool), ref.view(torch.bool)
    v[0] = True
    ref_v[0] = True
    assert_close(v.cpu(), ref_v)
    assert_close(x.cpu(), ref)
    # a PJRT bool holds 0 or 1: bytes 4 or 255 read as bool would come back changed
    y = torch.tensor([0, 4, 255, 1], dtype=torch.uint8).to("neuron")
    with pytest.raises(RuntimeError, match="bytes are not all 0 or 1"):
        y.view(torch.bool).cpu()
    assert y.cpu().tolist() == [0, 4, 255, 1]


def _tail(dev):  # a view ending short of the storage's end: the bytes past it stay
    base = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16).to(dev) * 1
    v = base[:2].view(torch.float32)
    v.mul_(1)
    return base, v


def _whole_bytes(dev):  # a dtype view as long (in elements) as its storage: not the whole storage
    base = torch.arange(8.0, dtype=torch.float16).to(dev) * 1
    v = base.view(torch.uint8)[:8]
    v.copy_(torch.full((8,), 7, dtype=torch.uint8).to(dev))
    return base, v


def _from_host(dev):
    base = torch.arange(8.0, dtype=torch.float16).to(dev) * 1
    v = base.view(torch.uint8)[:8]
    v.copy_(torch.full((8,), 7, dtype=torch.uint8))
    return base, v


def _base_and_view_in_one_op(dev):
    base = torch.arange(8.0).to(dev) * 1
    read = base + base.view(torch.int32)  # one op reading the storage as float32 and as int32
    base.add_(base.view(torch.int32))
    return base, read


def _strided_writes(dev):  # writes through views of the dtype view, then through the base
    base = torch.arange(24.0).reshape(4, 6).to(dev) * 1
    v = base[1:3].view(torch.int16)[:, 2:7]
    v.fill_(3)
    v[:, 0].zero_()
    base[0].neg_()
    return base, v


def _resize_a_dtype_view(dev):
    base = torch.arange(2.0).to(dev) * 1
    v = base.view(torch.int8)
    v.resize_(6)
    return base, v


@pytest.mark.parametrize("case", [_tail, _whole_bytes, _from_host, _base_and_view_in_one_op, _strided_writes,
                                  _resize_a_dtype_view], ids=lambda f: f.__name__.strip("_"))
def test_writes_through_a_dtype_view_reach_the_base_like_cpu(case):
    base, v = case("neuron")
    ref_base, ref_v = case("cpu")
    assert torch.equal(_bytes(base), _bytes(ref_base))
    assert (v.shape, v.stride(), v.storage_offset()) == (ref_v.shape, ref_v.stride(), ref_v.storage_offset())
    assert torch.equal(_bytes(v), _bytes(ref_v))


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.uint8), (torch.uint8, torch.float32),
                                     (torch.float16, torch.int64), (torch.int64, torch.bfloat16),
                                     (torch.bfloat16, torch.float32), (torch.float64, torch.int16)], ids=str)
def test_view_copy_dtype_lowers_narrowing_and_widening(src, dst):
    # torch-mlir lowers a bitcast to a narrower or same-size dtype only; the decomposition widens
    x = torch.testing.make_tensor((3, 16), dtype=src, device="cpu", low=-100, high=100)
    out = torch.view_copy(x.to("neuron"), dst)
    assert torch.equal(_bytes(out), _bytes(torch.view_copy(x, dst)))


def test_a_dtype_switch_stays_on_the_device():
    from neuron_compile.device.opkernel import COUNTS

    x = torch.arange(-8.0, 8.0).reshape(4, 4).to("neuron") * 1
    ref = torch.arange(-8.0, 8.0).reshape(4, 4)
    before = COUNTS["host_copies"]
    for t in (x, ref):
        t.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # |x| by its sign bit
        t.mul_(2)
        t[1:3].view(torch.int16)[:, 1::2].add_(1)  # the high halves of the middle rows
    assert COUNTS["host_copies"] == before  # each switch is one bitcast on the device, no host transfer
    assert torch.equal(_bytes(x), _bytes(ref))


def _bit_tricks(x):
    return (x.view(torch.uint8) + 1, (x.view(torch.int64) + 1).view(torch.float32),
            x.view(torch.uint8).view(torch.float32) * 2, x.view(torch.int16).view(torch.bfloat16) + 0,
            (x > 0).view(torch.uint8) + 1, (x.view(torch.uint8) & 1).view(torch.bool))


def _complex_bits(x):
    c = torch.complex(x, x * 2)
    return (c.view(torch.float32) + 1, (c.view(torch.float64) * 1).view(torch.complex64) + 0,
            x.view(torch.complex64) * 1, x[0, 0].view(torch.int32) + 1)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
@pytest.mark.parametrize("fn", [_bit_tricks, _complex_bits], ids=["any_element_size", "complex_and_0d"])
def test_compiled_view_dtype(fn, device):
    # torch-mlir lowers only narrowing and same-size bitcasts; the JAX rule takes every view.dtype,
    # complex and 0-d ones included
    x = torch.randn(4, 8)
    out = torch.compile(fn, backend="neuron", fullgraph=True)(x.to(device))
    for got, expected in zip(out, fn(x)):
        assert torch.equal(got.cpu(), expected)
