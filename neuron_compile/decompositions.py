"""The decomposition table AOTAutograd applies before Torch-MLIR sees a graph.

torch-mlir's FX importer applies no decompositions of its own, so what reaches
it is exactly what this table leaves. Three layers, later ones win:

1. torch-mlir's own table (``fx_decomp_util.get_decomposition_table``): PyTorch's
   core-ATen decompositions, minus a few whose output torch-mlir lowers worse
   (roll, one_hot, rms_norm, ...: it keeps its C++ lowering for those), plus
   the overloads torch-mlir needs decomposed (layer/group/batch norm, SDPA, ...);
2. ours, below: ops that the table leaves and that torch-mlir does not
   legalize to StableHLO. Each entry says which model hits it.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import register_decomposition

aten = torch.ops.aten

_OURS: dict = {}


def _ours(op):
    return register_decomposition(op, registry=_OURS)


@_ours(aten.squeeze.dims)
def _squeeze_dims(x: torch.Tensor, dims):
    # Every transformers causal-LM loss hits this (cross-entropy's target squeeze);
    # torch-mlir legalizes only squeeze.dim. A view to the squeezed shape is exact.
    if x.dim() == 0:
        return aten.view.default(x, [])
    wanted = {d % x.dim() for d in dims}
    shape = [s for i, s in enumerate(x.shape) if not (i in wanted and s == 1)]
    return aten.view.default(x, shape)


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """The table we hand to AOTAutograd (a fresh dict each process, shared after)."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table = dict(get_decomposition_table())
    table.update(_OURS)
    return table
