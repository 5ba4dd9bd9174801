"""The decomposition table AOTAutograd applies before Torch-MLIR sees a graph.

torch-mlir's FX importer applies no decompositions of its own, so what reaches
it is exactly what this table leaves. ``decomposition_table()`` assembles it
here, in layers, later ones win:

1. torch-mlir's own table (``fx_decomp_util.get_decomposition_table``): PyTorch's
   core-ATen decompositions, minus a few whose output torch-mlir lowers worse
   (roll, one_hot, rms_norm, ...: it keeps its C++ lowering for those), plus
   the overloads torch-mlir needs decomposed (layer/group/batch norm, SDPA, ...);
2. ours, one module per family, for ops that the table leaves and that
   torch-mlir does not legalize to StableHLO (each entry says which model hits
   it): ``core`` (with ``gamma``, ``reductions`` and ``layers``, which register
   into its ``_OURS``), then the ``_foreach_*`` ops, ``linalg`` (unrolled
   LU/Cholesky/QR), ``special`` (Cephes' special functions, coefficients in
   ``_cephes``), ``pool`` (pooling windows as gathers), ``search`` (searchsorted, mode,
   stable sort...), ``distances_and_losses``, ``bits`` (nextafter, bitcasts),
   ``strided`` (as_strided as gathers), ``sampling`` (random distributions),
   ``histograms``, and the library ops loaded so far;
3. wrappers over the result: 0-d inputs (``_RANK0``), bool/uint8 inputs of
   max/min/argmax/cummax widened to int32 (``_WIDENED``), half-precision
   gelu, convolution, sum, mean and cumsum computed in float32
   (``_HALF_IN_FLOAT32``), half-precision tensors multiplied or divided by a
   number in float32 (``_HALF_WITH_NUMBER``), and zero-size inputs
   (``pool.with_zero_size``).

``pre_autograd`` holds the rewrites of Dynamo's graph that run before
AOTAutograd (SDPA and embedding_bag as plain ops). The families from
``linalg`` on are imported when the table is first built, not with this package.
"""

from __future__ import annotations

import functools

import torch

from . import gamma, reductions  # noqa: F401  (they register into core._OURS)
from .core import _OURS, _RANK0, _rank0
from .layers import _foreach_decompositions, _library_decompositions

aten = torch.ops.aten


@functools.lru_cache(maxsize=1)
def _base_table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    from .linalg import LINALG
    from .bits import BITS
    from .distances_and_losses import DISTANCES_AND_LOSSES, library_decompositions
    from .histograms import HISTOGRAMS
    from .pool import POOL, with_zero_size
    from .sampling import SAMPLING
    from .search import SEARCH
    from .special import SPECIAL
    from .strided import STRIDED

    table = dict(get_decomposition_table())
    table.update(_OURS)
    table.update(_foreach_decompositions())
    table.update(LINALG)
    table.update(SPECIAL)
    table.update(POOL)
    for family in (SEARCH, DISTANCES_AND_LOSSES, BITS, STRIDED, SAMPLING, HISTOGRAMS):
        table.update(family)
    table.update(library_decompositions())
    for op, fn in _RANK0.items():
        if op not in table:  # ops some table already decomposes keep that decomposition
            table[op] = _rank0(fn)
    for op in _WIDENED:
        table[op] = _first_of(_widened(op), table.get(op))
    for op in _HALF_IN_FLOAT32:
        table[op] = _first_of(_in_float32(op), table.get(op))
    for op in _HALF_WITH_NUMBER:
        table[op] = _first_of(_with_number_in_float32(op), table.get(op))
    return with_zero_size(table)


# A half-precision tensor times or over a number (x * 1.7, x / 3.3; a 0-d float32 tensor counts as
# one, as in ATen): ATen multiplies in float32 by the number as given; the lowering rounded the number
# to bfloat16 first (1.7 became 1.703125: a third of x * 1.7's outputs were off). ATen's add and sub
# do round the number to the tensor's dtype: they stay as they are.
_HALF_WITH_NUMBER = (aten.mul.Tensor, aten.div.Tensor)


def _with_number_in_float32(op):
    def decomposition(x, other):  # only a number on the right: ATen's 0-d tensor * x rounds it
        if not isinstance(x, torch.Tensor) or isinstance(other, (bool, complex)):
            return NotImplemented
        half = torch.result_type(x, other)
        if half not in (torch.bfloat16, torch.float16) or x.dtype != half:
            return NotImplemented
        if isinstance(other, torch.Tensor):
            if other.dim() != 0 or other.dtype not in (torch.float32, torch.float64):
                return NotImplemented
            other = aten._to_copy.default(other, dtype=torch.float32)
        return aten._to_copy.default(op(aten._to_copy.default(x, dtype=torch.float32), other), dtype=half)
    return decomposition


# Ops that torch-mlir lowers step by step in the input's dtype, where ATen computes in float32 and
# rounds once: gelu (x * rsqrt(2) and 0.5 * x * (1 + erf) each rounded to bfloat16; 40% of a
# bfloat16 gelu's outputs were an ulp off) and convolution (the bias added after the rounding: a
# bfloat16 3x3 convolution was a quarter of its outputs off, CPU's equals float32's rounded)
_HALF_IN_FLOAT32 = (aten.gelu.default, aten.gelu_backward.default, aten.convolution.default,
                    # sums and means: XLA reduced in bfloat16 (half of a row sum's results off)
                    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim,
                    # running sums: ATen accumulates them in float32 (acc_type); in bfloat16 the sum
                    # drifted by several ulps over a row
                    aten.cumsum.default)


def _in_float32(op):
    def decomposition(*args, **kwargs):
        half = args[0].dtype if isinstance(args[0], torch.Tensor) else None
        if half not in (torch.bfloat16, torch.float16) or kwargs.get("dtype") not in (None, half):
            return NotImplemented
        kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
        wide = [aten._to_copy.default(a, dtype=torch.float32) if isinstance(a, torch.Tensor) else a for a in args]
        out = op(*wide, **kwargs)
        narrow = lambda t: aten._to_copy.default(t, dtype=half) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return tuple(narrow(t) for t in out) if isinstance(out, (tuple, list)) else narrow(out)
    return decomposition


# Reductions that pick an element: torch-mlir's lowering compares bool and uint8 wrongly (max.dim on
# bool returned wrong indices, its amax under cummax wrong values, argmax on bool does not lower), so
# those inputs go through int32 and then whatever decomposes the op (ours or a 0-d rule).
_WIDENED = (aten.max.dim, aten.min.dim, aten.argmax.default, aten.argmin.default, aten.cummax.default,
            aten.cummin.default)


def _widened(op):
    def decomposition(x, *args, **kwargs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.dtype not in (torch.bool, torch.uint8):
            return NotImplemented
        out = op(aten._to_copy.default(x, dtype=torch.int32), *args, **kwargs)
        if isinstance(out, (tuple, list)):  # (values, indices): values back to the input's dtype
            return (aten._to_copy.default(out[0], dtype=x.dtype), *out[1:])
        return out
    return decomposition


def _first_of(first, second):
    """A decomposition trying ``first``, then ``second`` (if any), NotImplemented when neither applies."""
    if second is None:
        return first

    def decomposition(*args, **kwargs):
        out = first(*args, **kwargs)
        return second(*args, **kwargs) if out is NotImplemented else out
    return decomposition


def decomposition_table() -> dict:
    """The table we hand to AOTAutograd: torch-mlir's, ours, and those of libraries loaded so far."""
    table = _base_table()
    for op, fn in _library_decompositions():
        table.setdefault(op, fn)
    return table
