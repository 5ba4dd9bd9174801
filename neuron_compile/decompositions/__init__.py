"""The decomposition table AOTAutograd applies before Torch-MLIR sees a graph (see ``core``)."""

from .core import _embedding_bag_math, _foreach_decompositions, _sdpa_math, decompose_before_autograd, decomposition_table

__all__ = ["decompose_before_autograd", "decomposition_table"]
