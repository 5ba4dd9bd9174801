"""Splitting AOTAutograd's joint graph into the forward and backward our backend compiles.

``partition`` is Inductor's min-cut rematerialization partitioner run after our CSE (not its own),
and ``dense_saved_views`` then makes the forward return dense the saved activations that would be
views (``output_views``), so the backward reads them with no copy in between.
"""

from __future__ import annotations

import torch

from ..output_views import find_output_views
from ..decompositions.graph_rewrites import eliminate_common_subexpressions


def partition(joint_module: torch.fx.GraphModule, joint_inputs, **kwargs):
    """Inductor's min-cut rematerialization partitioner, after our CSE instead of its own.

    The partitioner recomputes cheap ops in the backward instead of saving them,
    so the forward hands fewer, smaller activations to the backward. Its CSE
    pre-pass imports Inductor's pattern matcher, and with it every Inductor
    lowering: 0.64 s of the first training compile in each process, which only
    Inductor needs. ``eliminate_common_subexpressions`` does that job without
    the import; with no CSE at all, a GPT-2 or llama training step's own peak
    memory grew by 10-25 MB (about 15%).
    """
    from functorch.compile import min_cut_rematerialization_partition

    if eliminate_common_subexpressions(joint_module.graph):
        joint_module.recompile()
    with torch._functorch.config.patch(cse=False):
        forward, backward = min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
    dense_saved_views(forward, kwargs["num_fwd_outputs"])
    return forward, backward


def dense_saved_views(forward: torch.fx.GraphModule, saved_from: int) -> None:
    """Activations the forward saves for the backward (its outputs from ``saved_from`` on) that are views of
    another of its values with other sizes or strides (a transposed projection, a head's slice) are
    computed dense by the forward's executable: returned as views (``output_views``, for the user's
    outputs' aliasing, which saved values do not need), each would be copied dense before the backward's
    executable could read it, by an eager op on the device (a GPT-2 step: 8 of them) or a torch copy on
    the CPU. The backward's graph reads its inputs by shape alone, so it takes the dense value as it is."""
    output = next(n for n in reversed(forward.graph.nodes) if n.op == "output")
    values = list(output.args[0])
    changed = False
    for index, view in enumerate(find_output_views(forward)):
        node = values[index]
        if (index < saved_from or view is None or view.symbols() or view.base_is_input
                or not isinstance(node, torch.fx.Node)):
            # a symbolic graph's views are XLA's results already (compiler.plan_graph); a view of an input
            # (a transposed weight) stays a view: held dense from forward to backward it would be a copy of
            # the parameter in memory (the partitioner recomputes those in the backward anyway)
            continue
        val = node.meta["val"]
        if view.offset == 0 and val.is_contiguous() and view.dtype is None:
            base = values[view.base].meta["val"]
            if tuple(base.shape) == tuple(val.shape):
                continue  # the base's own buffer: no copy either way
        with forward.graph.inserting_before(output):
            dense = forward.graph.call_function(torch.ops.aten.clone.default, (node,),
                                                {"memory_format": torch.contiguous_format})
        dense.meta["val"] = val.clone(memory_format=torch.contiguous_format)
        values[index] = dense
        changed = True
    if changed:
        output.args = (tuple(values),)
        forward.recompile()
