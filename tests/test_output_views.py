"""Outputs that are views, the specialization key, and bucketing's fall-back to exact shapes (issue 24).

AOTAutograd regenerates an output that aliases an input or another output from
the tensor the backend returns (``neuron_compile/output_views.py``); these tests
check that what we return is a real view with eager's size, stride and storage
offset, that nothing is recomputed by XLA for it, and that a failure on the
bucketed path costs bucketing, never a wrong or missing result.
"""

import logging

import pytest
import torch

import neuron_compile
from neuron_compile.capture.backend import _signature_part
from neuron_compile.report import COUNTERS

BUCKETS = [pytest.param(128, id="buckets=on"), pytest.param(0, id="buckets=off")]


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    neuron_compile.reset()
    yield
    torch._dynamo.reset()


def _same_view(got: torch.Tensor, ref: torch.Tensor, got_base: torch.Tensor, ref_base: torch.Tensor):
    torch.testing.assert_close(got, ref)
    assert got.untyped_storage().data_ptr() == got_base.untyped_storage().data_ptr(), "not a view of its base"
    assert got.stride() == ref.stride()
    assert got.storage_offset() - got_base.storage_offset() == ref.storage_offset() - ref_base.storage_offset()


def test_static_view_output_is_not_computed_by_xla():
    def fn(x):
        return x[1:, 2], x.sum()

    x = torch.randn(4, 5)
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    got, ref = compiled(x), fn(x)
    _same_view(got[0], ref[0], x, x)
    torch.testing.assert_close(got[1], ref[1])
    report = neuron_compile.compile_reports()[-1]
    assert report.ops.get("select.int", 0) == 0 and report.ops.get("slice.Tensor", 0) == 0, report.ops


@pytest.mark.parametrize("buckets", BUCKETS)
def test_views_of_inputs_follow_changing_int_arguments(buckets):
    def fn(x, dim, index, sizes):
        return torch.select(x, dim, index), torch.split(x, sizes, dim=-1)

    compiled = torch.compile(fn, backend="neuron", options={"buckets": buckets})
    x = torch.randn(5, 6, 5)
    for dim, index, sizes in [(1, 2, [1, 3, 1]), (-1, 2, [1, 4, 0]), (-1, -1, [2, 2, 1]), (0, -2, [5, 0, 0])]:
        got, ref = compiled(x, dim, index, sizes), fn(x, dim, index, sizes)
        _same_view(got[0], ref[0], x, x)
        assert len(got[1]) == len(ref[1])
        for g, r in zip(got[1], ref[1]):
            _same_view(g, r, x, x)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_view_of_another_output_with_changing_shapes(buckets):
    # y.t() is an alias of the intermediate y, which is returned too: AOTAutograd regenerates it
    # from y with the strides of what we return for it
    def fn(x):
        y = x * 2 + 1
        return y, y.t(), y[:, 1:].unsqueeze(0)

    compiled = torch.compile(fn, backend="neuron", options={"buckets": buckets})
    for n, m in [(3, 4), (5, 7), (9, 2), (130, 3)]:
        x = torch.randn(n, m)
        got, ref = compiled(x), fn(x)
        torch.testing.assert_close(got[0], ref[0])
        _same_view(got[1], ref[1], got[0], ref[0])
        _same_view(got[2], ref[2], got[0], ref[0])


@pytest.mark.parametrize("buckets", BUCKETS)
def test_view_of_a_padded_input_is_sliced_at_the_true_size(buckets):
    # under bucketing the executable sees x padded to 128: its outputs' views must be of the
    # caller's x, at x's true strides
    def fn(x, y):
        return x.view_as(y), x.reshape(y.shape).T, (x * 2).sum()

    compiled = torch.compile(fn, backend="neuron", options={"buckets": buckets})
    for n in (6, 10, 14):
        x, y = torch.randn(n * 2), torch.randn(n, 2)
        got, ref = compiled(x, y), fn(x, y)
        _same_view(got[0], ref[0], x, x)
        _same_view(got[1], ref[1], x, x)
        torch.testing.assert_close(got[2], ref[2])


def test_as_strided_reads_the_inputs_storage_offset():
    # as_strided's offset is absolute in the storage, and Dynamo does not guard an input's storage
    # offset: the offset selects the executable, and an offset before the input's own first element
    # (which XLA never receives) is an error that names the op
    def fn(x):
        return torch.as_strided(x, (2, 3), (3, 1), 4) * 2

    compiled = torch.compile(fn, backend="neuron")
    base = torch.arange(40.0)
    for start in (0, 1, 4):
        x = base[start:start + 20]
        torch.testing.assert_close(compiled(x), fn(x))
    with pytest.raises(Exception, match="aten.as_strided"):
        compiled(base[5:25])


def test_as_strided_with_a_changing_offset_argument():
    def fn(x, offset):
        return torch.as_strided(x, (2, 2), (1, 2), offset) + 1

    compiled = torch.compile(fn, backend="neuron")
    x = torch.arange(30.0)
    for offset in (0, 3, 7, 3, 11):
        got, ref = compiled(x, offset), fn(x, offset)
        torch.testing.assert_close(got, ref)


def test_specialization_key_tells_apart_what_equality_does_not():
    assert _signature_part(-0.0) != _signature_part(0.0)
    assert _signature_part(True) != _signature_part(1)
    assert _signature_part(1) != _signature_part(1.0)
    x = torch.randn(4, 6)
    assert _signature_part(x) != _signature_part(x.t().contiguous().t())  # same shape, other strides
    assert _signature_part(x[:, 1:]) != _signature_part(torch.randn(4, 5))  # storage offset


def test_a_failing_bucketed_compile_falls_back_to_exact_shapes(monkeypatch, caplog):
    from neuron_compile.bucketing import padding

    def broken(self, true_sizes, *args):
        raise RuntimeError("injected failure in the bucketed trace")

    monkeypatch.setattr(padding.BucketInterpreter, "run_with_true_sizes", broken)

    def fn(x):
        return torch.softmax(x, -1) * x.shape[0]

    compiled = torch.compile(fn, backend="neuron", options={"buckets": 128})
    with caplog.at_level(logging.DEBUG, logger="neuron_compile"):
        for n in (3, 5, 7, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), fn(x))
    lines = [r.getMessage() for r in caplog.records if "injected failure" in r.getMessage()]
    assert len(lines) == 1 and "per exact shape" in lines[0], lines
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "injected failure" in r.getMessage())
    assert COUNTERS["bucketing_fallbacks"] >= 1
    assert COUNTERS["specializations"] >= 2  # the exact shapes that ran after the fall-back


def test_padding_analysis_errors_never_reach_the_user(monkeypatch):
    from neuron_compile.bucketing import analysis as bucketing

    def broken(*args, **kwargs):
        raise TypeError("injected analysis bug")

    monkeypatch.setattr(bucketing, "_analyze_node", broken)
    analysis = bucketing.analyze(torch.fx.symbolic_trace(lambda x: x + 1))
    assert not analysis.ok

    def fn(x):
        return torch.nn.functional.pad(x, (0, x.shape[-1] % 3)) + 1

    compiled = torch.compile(fn, backend="neuron", options={"buckets": 128})
    for n in (4, 5, 7):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("buckets", BUCKETS)
def test_slices_of_an_intermediate_that_is_not_returned(buckets):
    # both outputs view one intermediate that is not itself an output (unravel_index's coordinates):
    # neither holds the other's elements, so neither may serve as the other's base
    def fn(x, n):
        y = torch.stack([x // n, x % n]) + 1
        return y[0], y[1]

    compiled = torch.compile(fn, backend="neuron", options={"buckets": buckets})
    for shape, n in [((2, 3), 4), ((2, 3), 5), ((), 2), ((4,), 3), ((), 7)]:
        x = torch.randint(0, 50, shape)
        for got, ref in zip(compiled(x, n), fn(x, n)):
            torch.testing.assert_close(got, ref)
