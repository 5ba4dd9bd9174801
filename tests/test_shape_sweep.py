"""Property tests (hypothesis): compiled indexing and view functions fed changing shapes and ints.

Each function below is compiled ONCE per bucketing setting (module level:
``torch.compile`` is lazy) and called by hypothesis with changing tensor
shapes and integer arguments, which travel as function arguments, so Dynamo's
automatic dynamic shapes makes them symbolic from the second distinct value on
(issue 24: outputs that are views of inputs came back wrong once their sizes or
offsets were symbolic). Hypothesis draws many examples within one test, with no
``torch._dynamo.reset()`` between them (the conftest resets between tests
only). Every output is compared with eager: shape, dtype, values; outputs eager
returns as views of the input must be views of the compiled call's input, with
eager's strides and storage offset.
"""

import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten

BUCKETS = [pytest.param(128, id="buckets=on"), pytest.param(0, id="buckets=off")]
SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# Computations run on non-empty slices only: an empty slice of a size-1 dim followed by a reduction
# fails to lower even with static shapes (torch.compile(lambda x: x[:, :, :0].sum())(torch.randn(2, 1, 1)):
# 'stablehlo.slice' op inferred type tensor<2x1x1xf32> incompatible with tensor<2x1x0xf32>), a bug of
# its own, not one of changing shapes.


def slices(x, a, b, step):
    rows = x[a:b]
    return rows, x[:, a:b:step], rows * 2 + 1 if rows.numel() else rows


def select(x, dim, index):
    return torch.select(x, dim, index), torch.select(x, dim, index).sum()


def split_int(x, size, dim):
    return torch.split(x, size, dim)


def split_sizes(x, sizes, dim):
    parts = torch.split(x, sizes, dim)
    return parts, [p.sum() for p in parts if p.numel()]


def narrow(x, dim, start, length):
    part = torch.narrow(x, dim, start, length)
    return part, part.exp() if part.numel() else part


def index_select(x, dim, index):
    return torch.index_select(x, dim, index)


def gather(x, dim, index):
    return torch.gather(x, dim, index)


def view_chain(x, a, b):
    # x has shape (a * b, c): views of the input beside results computed from them
    c = x.shape[1]
    v = x.view(a, b, c)
    t = v.transpose(0, 1)
    p = x.reshape(b, a, c).permute(2, 0, 1)
    e = x.unsqueeze(1).expand(-1, 3, -1)
    return v, t, p, e, t.sum(0), (p * 2).reshape(-1), e[:, 1:, :].contiguous()


FUNCTIONS = {f.__name__: f for f in (slices, select, split_int, split_sizes, narrow, index_select, gather, view_chain)}


def _own_code(fn):
    """The function on a code object of its own: Dynamo keeps cache entries and automatic-dynamic state per
    code object, so the bucketing-on and -off compiles of one function must not share them."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


COMPILED = {(name, buckets): torch.compile(_own_code(fn), backend="neuron", options={"buckets": buckets})
            for name, fn in FUNCTIONS.items() for buckets in (128, 0)}


def check(name, buckets, *args):
    fn = FUNCTIONS[name]
    ref_x, got_x = args[0].clone(), args[0].clone()
    ref = fn(ref_x, *args[1:])
    got = COMPILED[name, buckets](got_x, *args[1:])
    got_leaves, got_spec = tree_flatten(got)
    ref_leaves, ref_spec = tree_flatten(ref)
    assert got_spec == ref_spec
    for i, (g, e) in enumerate(zip(got_leaves, ref_leaves)):
        assert g.shape == e.shape and g.dtype == e.dtype, f"output {i}: {g.shape}/{g.dtype} != {e.shape}/{e.dtype}"
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"output {i}: {m}")
        if e.numel() and e.untyped_storage().data_ptr() == ref_x.untyped_storage().data_ptr():
            assert g.untyped_storage().data_ptr() == got_x.untyped_storage().data_ptr(), \
                f"output {i}: eager's is a view of the input, ours not"
            assert (_strides(g), g.storage_offset()) == (_strides(e), e.storage_offset()), \
                f"output {i}: stride/offset {g.stride()}/{g.storage_offset()} != {e.stride()}/{e.storage_offset()}"


def _strides(t):
    """Strides of the dims that have them (a size-1 dim's stride is never used)."""
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride()))


def tensor(shape):
    return torch.randn(shape)


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3)
shapes2 = st.lists(st.integers(1, 9), min_size=2, max_size=3)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes2, a=st.integers(-11, 11), b=st.integers(-11, 11), step=st.integers(1, 3))
def test_slices(buckets, shape, a, b, step):
    check("slices", buckets, tensor(shape), a, b, step)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_select(buckets, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    index = data.draw(st.integers(-shape[dim], shape[dim] - 1))
    check("select", buckets, tensor(shape), dim, index)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_split_int(buckets, shape, data):
    dim = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(1, shape[dim] + 1))
    check("split_int", buckets, tensor(shape), size, dim)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_split_sizes(buckets, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    # a composition of shape[dim] (parts may be empty)
    cuts = sorted(data.draw(st.lists(st.integers(0, shape[dim]), min_size=0, max_size=3)))
    bounds = [0, *cuts, shape[dim]]
    sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
    check("split_sizes", buckets, tensor(shape), sizes, dim)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_narrow(buckets, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    start = data.draw(st.integers(-shape[dim], shape[dim]))
    length = data.draw(st.integers(0, shape[dim] - (start % shape[dim] if start < 0 else start)))
    check("narrow", buckets, tensor(shape), dim, start, length)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_index_select(buckets, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    index = data.draw(st.lists(st.integers(0, shape[dim] - 1), min_size=0, max_size=6))
    check("index_select", buckets, tensor(shape), dim, torch.tensor(index, dtype=torch.int64))


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(shape=shapes, data=st.data())
def test_gather(buckets, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = [data.draw(st.integers(0 if d == dim % len(shape) else 1, 7 if d == dim % len(shape) else n))
                   for d, n in enumerate(shape)]
    index = torch.randint(0, shape[dim], index_shape)
    check("gather", buckets, tensor(shape), dim, index)


@pytest.mark.parametrize("buckets", BUCKETS)
@SETTINGS
@given(a=st.integers(1, 6), b=st.integers(1, 6), c=st.integers(1, 6))
def test_view_chain(buckets, a, b, c):
    check("view_chain", buckets, tensor((a * b, c)), a, b)
