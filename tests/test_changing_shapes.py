"""One compiled function, called many times with changing shapes and integer arguments (issue 24).

Each test builds ONE ``torch.compile(fn, backend="neuron")`` and calls it with
the argument patterns of PyTorch's OpInfo samples for the op (the sequence
``benchmarks/opinfo_coverage.py --sequence`` runs), so from the second call on
Dynamo's automatic dynamic shapes makes the changed sizes and Python ints
(split sizes, dims, indices, pads) symbolic. Every result is compared with
eager: values, shapes, dtypes; outputs that eager returns as views of an input
must be views of the compiled call's input too, with eager's strides and
storage offset; inputs the op writes to (batch norm's running stats) must hold
eager's values afterwards. Every test runs with bucketing on (the default,
multiples of 128) and off (``buckets=0``).
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

BUCKETS = [pytest.param(128, id="buckets=on"), pytest.param(0, id="buckets=off")]
# the harness's float32 tolerance (benchmarks/opinfo_coverage.py)
TOL = dict(rtol=1e-4, atol=1e-4)


def r(*shape, dtype=torch.float32):
    """OpInfo-like values (make_tensor's default range for float32 is [-9, 9])."""
    return torch.empty(shape, dtype=dtype).uniform_(-9, 9)


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if type(obj) in (list, tuple):
        return type(obj)(_clone(x) for x in obj)
    if type(obj) is dict:
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _storages(args):
    return [t.untyped_storage().data_ptr() for t in tree_flatten(args)[0]
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()]


def _assert_same(got, ref, got_args, ref_args, what, tol):
    got_leaves, got_spec = tree_flatten(got)
    ref_leaves, ref_spec = tree_flatten(ref)
    assert got_spec == ref_spec, f"{what}: output structure {got_spec} != eager's {ref_spec}"
    ref_inputs, got_inputs = _storages(ref_args), _storages(got_args)
    for i, (g, e) in enumerate(zip(got_leaves, ref_leaves)):
        where = f"{what}, output {i}"
        if not isinstance(e, torch.Tensor):
            assert g == e, f"{where}: {g!r} != eager's {e!r}"
            continue
        assert isinstance(g, torch.Tensor), f"{where}: got {type(g).__name__}"
        assert g.shape == e.shape, f"{where}: shape {tuple(g.shape)} != eager's {tuple(e.shape)}"
        assert g.dtype == e.dtype, f"{where}: dtype {g.dtype} != eager's {e.dtype}"
        exact = not (e.dtype.is_floating_point or e.dtype.is_complex)
        torch.testing.assert_close(g, e, **(dict(rtol=0, atol=0) if exact else tol), equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
        if e.numel() and e.untyped_storage().nbytes() and e.untyped_storage().data_ptr() in ref_inputs:
            # eager returns a view of input k: the compiled output must view the compiled input k
            k = ref_inputs.index(e.untyped_storage().data_ptr())
            assert g.untyped_storage().data_ptr() == got_inputs[k], f"{where}: eager's is a view of an input, ours not"
            assert (_strides(g), g.storage_offset()) == (_strides(e), e.storage_offset()), \
                f"{where}: view stride/offset {g.stride()}/{g.storage_offset()} != eager's " \
                f"{e.stride()}/{e.storage_offset()}"


def _strides(t):
    """Strides of the dims that have them (a size-1 dim's stride is never used)."""
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride()))


def check_calls(fn, calls, buckets, fullgraph=True, tol=TOL):
    """One compiled ``fn`` called with every argument tuple in ``calls``; each result (and each input the
    call wrote to) against eager's."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", fullgraph=fullgraph, options={"buckets": buckets})
    for n, args in enumerate(calls):
        ref_args, got_args = _clone(args), _clone(args)
        ref = fn(*ref_args)
        got = compiled(*got_args)
        what = f"call {n} {_describe(args)}"
        _assert_same(got, ref, got_args, ref_args, what, tol)
        for i, (g, e) in enumerate(zip(tree_flatten(got_args)[0], tree_flatten(ref_args)[0])):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e, **TOL, equal_nan=True,
                                           msg=lambda m: f"{what}: input {i} after the call: {m}")


def _describe(obj):
    if isinstance(obj, torch.Tensor):
        return f"T{tuple(obj.shape)}"
    if type(obj) in (list, tuple):
        inner = ", ".join(_describe(x) for x in obj)
        return f"[{inner}]" if type(obj) is list else f"({inner})"
    if type(obj) is dict:
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in obj.items()) + "}"
    return repr(obj)


# --------------------------------------------------------------------------- views of the input


def _op(op):
    """The op with its positional arguments as one list, the harness's and the issue's formulation."""
    def fn(t, args):
        return op(t, *args)

    return fn


@pytest.mark.parametrize("buckets", BUCKETS)
def test_select(buckets):
    x = r(5, 5, 5)
    check_calls(_op(torch.select), [(x, [1, 2]), (x, [-1, 2]), (x, [-1, -1]), (x, [1, -1]),
                                    (r(4, 6, 3), [1, 4]), (r(4, 6, 3), [0, -2])], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_split_list_of_sizes(buckets):
    x = r(5, 5, 5)
    check_calls(_op(torch.split), [(x, [[1, 3, 1]]), (x, [[1, 4, 0]]), (x, [[1, 3, 1], 2]), (x, [[2, 1, 2], -2]),
                                   (r(7, 5, 5), [[2, 5]])], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_split_with_sizes(buckets):
    x = r(5, 5, 5)
    check_calls(_op(torch.split_with_sizes),
                [(x, [[1, 3, 1]]), (x, [[1, 4, 0]]), (x, [[1, 3, 1], 2]), (x, [[1, 3, 1], -2]),
                 (r(5, 6, 5), [[2, 4], 1])], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
@pytest.mark.parametrize("op, calls", [
    (torch.dsplit, [((5, 5, 5), [[1, 2, 3]]), ((5, 5, 6), [2]), ((5, 5, 7), [[1, 4]]), ((4, 5, 6), [3])]),
    (torch.hsplit, [((6,), [2]), ((5, 5, 5), [[1, 2, 3]]), ((5, 6, 5), [[2, 4]]), ((8,), [4]), ((10,), [2])]),
    (torch.vsplit, [((6, 5), [2]), ((5, 5, 5), [[1, 2, 3]]), ((7, 5), [[2, 4]]), ((8, 3), [4]), ((10, 3), [2])]),
], ids=["dsplit", "hsplit", "vsplit"])
def test_dsplit_hsplit_vsplit(buckets, op, calls):
    # OpInfo's two samples (sections, indices), then other sizes of either
    check_calls(_op(op), [(r(*shape), args) for shape, args in calls], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_as_strided(buckets):
    def fn(t, size, stride, storage_offset):
        return torch.as_strided(t, size, stride, storage_offset)

    check_calls(fn, [(r(1), (1,), (1,), 0), (r(3, 3), (2, 2), (1, 2), 0), (r(3, 3), (2, 2), (1, 2), 1),
                     (r(16), (2, 2, 2, 2), (1, 1, 1, 1), 0), (r(4, 4), (3, 2), (2, 3), 2)], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_reshape_as(buckets):
    check_calls(lambda t, other: t.reshape_as(other),
                [(r(5, 5, 5), r(25, 5)), (r(25, 5), r(5, 5, 5)), (r(5), r(5)), (r(), r(1)), (r(6, 4), r(3, 8)),
                 (r(4, 6).t(), r(24))], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_view_as(buckets):
    check_calls(lambda t, other: t.view_as(other),
                [(r(5, 5, 5), r(25, 5)), (r(25, 5), r(5, 5, 5)), (r(5), r(5)), (r(), r(1)), (r(6, 4), r(3, 8))],
                buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_meshgrid(buckets):
    def fn(tensors, indexing):
        return torch.meshgrid(*tensors, indexing=indexing)

    check_calls(fn, [([r()], "ij"), ([r()], "xy"), ([r(3)], "ij"), ([r(3)], "xy"), ([r(3), r(2)], "ij"),
                     ([r(4), r(5)], "ij"), ([r(4), r(5)], "xy"), ([r(4), r(5), r(2)], "ij")], buckets)


# --------------------------------------------------------------------------- computed results


@pytest.mark.parametrize("buckets", BUCKETS)
@pytest.mark.parametrize("name", ["native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                                  "nn.functional.batch_norm"])
def test_batch_norm_family(buckets, name):
    # OpInfo's samples: (input, weight, bias, running_mean, running_var, training, momentum, eps); then the
    # batch and spatial sizes change at a fixed channel count
    samples = [((5, 5, 5), True, 0.5, 0.6), ((3, 2, 4), False, -1.2, 1e-5), ((3, 1), True, 0.0, 1e-5),
               ((3, 2, 3, 4), True, -1.0, 0.5), ((4, 3, 5), True, 0.1, 1e-5), ((6, 3, 7), True, 0.1, 1e-5)]
    calls = []
    for shape, training, momentum, eps in samples:
        c = shape[1]
        stats = [r(c), r(c), r(c), r(c).abs() + 0.5]
        calls.append((r(*shape), stats, training, momentum, eps))

    def fn(x, stats, training, momentum, eps):
        w, b, mean, var = stats
        if name == "native_batch_norm":
            return torch.native_batch_norm(x, w, b, mean, var, training, momentum, eps)
        if name == "_native_batch_norm_legit":
            return torch.ops.aten._native_batch_norm_legit(x, w, b, mean, var, training, momentum, eps)
        if name == "_batch_norm_with_update":
            return torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, momentum, eps)
        return F.batch_norm(x, mean, var, w, b, training=training, momentum=momentum, eps=eps)

    if name == "_batch_norm_with_update":  # always training
        calls = [c for c in calls if c[2]]
    check_calls(fn, calls, buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
@pytest.mark.parametrize("name", ["constant_pad_nd", "nn.functional.pad.constant"])
def test_constant_pad(buckets, name):
    def fn(t, pad, value):
        if name == "constant_pad_nd":
            return torch.constant_pad_nd(t, pad, value)
        return F.pad(t, pad, "constant", value)

    # OpInfo's samples, then other sizes and a negative pad
    check_calls(fn, [(r(1, 3, 3), [2, 2], 0.0), (r(1, 3), [1, 2], 1.0), (r(1, 3), [0, 1], 1.0),
                     (r(1, 3), [0, 2, 0, 1], 1.0), (r(2, 5), [3, 1, 1, 0], -2.0), (r(4, 6), [-1, 2], 0.5)], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_chunk_cat(buckets):
    def fn(tensors, dim, num_chunks):
        return torch._chunk_cat(tensors, dim, num_chunks)

    check_calls(fn, [([r(1, 2, 3), r(1, 2, 3)], -1, 5), ([r(1, 2, 129), r(1, 2, 297)], -1, 5),
                     ([r(1, 2, 3), r(1, 2, 3)], 1, 5), ([r(3, 3, 2, 1), r(1, 4, 2, 2), r(2, 1, 3, 3)], 0, 2),
                     ([r(2, 7), r(2, 9)], 1, 3)], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_gather(buckets):
    def idx(high, *shape):
        return torch.randint(0, high, shape)

    check_calls(torch.gather, [(r(10, 5), 0, idx(10, 5, 5)), (r(10, 5), 0, idx(10, 3, 5)), (r(10, 5), 1, idx(5, 10, 2)),
                               (r(7, 6), 0, idx(7, 3, 6)), (r(12, 4), 1, idx(4, 12, 3)), (r(5), 0, idx(5, 0))],
                buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_frexp(buckets):
    check_calls(torch.frexp, [(r(20),), (r(1, 0, 3),), (r(),), (r(7),), (r(3, 4),), (r(30),)], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_index_put(buckets):
    def fn(t, indices, values, accumulate):
        return t.index_put(indices, values, accumulate)

    # OpInfo's samples: an int index, a bool mask, then accumulate=True; then other sizes
    mask = torch.tensor([True, False, True, True, False])
    check_calls(fn, [(r(5, 5), (torch.tensor([3]),), r(1, 5), False),
                     (r(5, 5), (mask,), r(5), False),
                     (r(5, 5), (torch.tensor([1, 4]),), r(2, 5), True),
                     (r(5, 5), (mask,), r(5), True),
                     (r(7, 5), (torch.tensor([0, 6, 2]),), r(3, 5), False),
                     (r(6, 3), (torch.tensor([5, 1]), torch.tensor([2, 0])), r(2), True),
                     (r(9, 4), (torch.tensor([8, 1, 1, 3]),), r(4, 4), True)], buckets)


@pytest.mark.parametrize("buckets", BUCKETS)
def test_as_strided_scatter(buckets):
    def fn(t, src, size, stride, storage_offset):
        return torch.as_strided_scatter(t, src, size, stride, storage_offset)

    check_calls(fn, [(r(1), r(), (), (), 0), (r(1), r(1), (1,), (1,), 0), (r(3, 3), r(2, 2), (2, 2), (1, 2), 0),
                     (r(3, 3), r(2, 2), (2, 2), (1, 2), 1), (r(4, 4), r(3, 2), (3, 2), (2, 3), 2)], buckets)


@pytest.mark.slow  # the first JAX-lowered graph of a process starts JAX's CPU backend (~3 s)
@pytest.mark.parametrize("buckets", BUCKETS)
def test_matrix_exp(buckets):
    # OpInfo's samples are (5, 5) and (5, 5, 5) with entries in [-9, 9]: results up to ~1e7, where float32
    # carries absolute noise far above the harness's rtol=atol=1e-4 for the elements near 0. The issue's
    # 4.7e-4 miss at (2, 4, 1) was 1.2e-4 from the float64 truth, eager's 3.5e-4: noise, not a wrong result
    # (and a single compile of that sample gives the same numbers). So each matrix is checked against the
    # float64 truth, to 1e-5 of its largest element (our lowering's error reaches ~7e-6 of it on one
    # (3, 5, 5) matrix here, eager's 2e-7: with or without changing shapes).
    torch._dynamo.reset()
    compiled = torch.compile(torch.matrix_exp, backend="neuron", fullgraph=True, options={"buckets": buckets})
    for x in [r(5, 5), r(5, 5, 5), r(3, 5, 5), r(4, 4), r(2, 3, 3), r(6, 5, 5)]:
        got = compiled(x.clone())
        ref = torch.matrix_exp(x)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        truth = torch.matrix_exp(x.double()).reshape(-1, *x.shape[-2:])
        err = (got.double().reshape_as(truth) - truth).abs().amax((-2, -1))
        scale = truth.abs().amax((-2, -1))
        assert (err <= 1e-5 * scale).all(), f"{tuple(x.shape)}: error {err.tolist()} against float64, of {scale.tolist()}"
