"""Rewrites of AOTAutograd's graphs, before planning, that save XLA work or memory.

``fold_one_hot_sums``: cross-entropy's backward (nll_loss_backward into
log_softmax's backward) sums a one-hot tensor over the classes,
``sum(where(iota == target, a, 0) * b, classes)``. That sum is ``a * b`` where
the target is a class and 0 where it is not, so nothing has to be summed; and
with the sum gone the one-hot tensor has a single consumer, which XLA fuses
instead of materializing a logits-sized buffer in the training step.

``zero_size_values_to_constants``: a tensor with no elements holds no data, so
whatever computes it can be a zero-size constant. Torch-MLIR lowers a slice that
ends at 0 (``x[..., :0]``) as one ending at the dim's size, and the module then
fails to verify; ops that read nothing lower trivially.

``eliminate_common_subexpressions``: AOTAutograd's joint graph repeats forward
work in the backward (the same transposes, casts, views...). Merging the
repeats before the min-cut partitioner decides what to save keeps it from
saving one tensor twice. PyTorch's own pass (``fx_graph_cse``) imports
Inductor's pattern matcher, and with it every Inductor lowering (0.64 s of a
process's first training compile), so the partitioner runs with it off and
this pass instead.
"""

from __future__ import annotations

import operator
import re

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten

_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _iota_dim(node, rank: int):
    """The dim ``node`` counts 0, 1, ..., n-1 along (size 1 everywhere else), or None."""
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dim() > rank:
        return None
    source = node
    while isinstance(source, torch.fx.Node) and source.target in _VIEWS:
        source = source.args[0]
    if not isinstance(source, torch.fx.Node) or source.target not in _ARANGES:
        return None
    args = source.args
    start, end, step = (0, args[0], 1) if source.target is aten.arange.default else \
        (args[0], args[1], args[2] if len(args) > 2 else 1)
    if start != 0 or step != 1 or not isinstance(end, int):
        return None
    sizes = [1] * (rank - val.dim()) + list(val.shape)
    big = [d for d, s in enumerate(sizes) if s != 1]
    if len(big) != 1 or sizes[big[0]] != end:
        return None
    return big[0]


def _is_zeros(node) -> bool:
    if not isinstance(node, torch.fx.Node):
        return node == 0
    if node.target in (aten.zeros_like.default, aten.zeros.default):
        return True
    if node.target in (aten.full_like.default, aten.full.default, aten.scalar_tensor.default):
        fill = node.args[1] if node.target is not aten.scalar_tensor.default else node.args[0]
        return fill == 0
    return False


def _size_along(node, dim: int, rank: int):
    val = _val(node)
    if not isinstance(node, torch.fx.Node):
        return 1
    if not isinstance(val, torch.Tensor) or val.dim() > rank:
        return None
    sizes = [1] * (rank - val.dim()) + list(val.shape)
    return sizes[dim]


def fold_one_hot_sums(gm: torch.fx.GraphModule) -> int:
    """Replace ``sum(where(iota == idx, a, 0) * b, [d])`` by ``where(0 <= idx < n, a * b, 0)``; returns the count."""
    graph = gm.graph
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
            continue
        product, dims = node.args[0], node.args[1]
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        out = _val(node)
        if node.kwargs.get("dtype") is not None or not isinstance(out, torch.Tensor) or len(dims or ()) != 1:
            continue
        if not isinstance(product, torch.fx.Node) or product.target is not aten.mul.Tensor:
            continue
        pval = _val(product)
        if not isinstance(pval, torch.Tensor) or not pval.dtype.is_floating_point:
            continue
        rank, dim = pval.dim(), dims[0] % max(pval.dim(), 1)
        match = _one_hot_product(product, dim, rank)
        if match is not None:
            _replace(graph, node, *match, pval.shape[dim], dim, keepdim, out)
            folded += 1
    if folded:
        graph.eliminate_dead_code()
        gm.recompile()
    return folded


def _one_hot_product(product: torch.fx.Node, dim: int, rank: int):
    """``(index, a, b)`` when ``product`` is ``where(iota == index, a, 0) * b`` along ``dim``, with
    ``index``, ``a`` and ``b`` all of size 1 there; else None."""
    for selected, scale in (product.args, product.args[::-1]):
        if not (isinstance(selected, torch.fx.Node) and selected.target is aten.where.self):
            continue
        mask, a, zero = selected.args
        if not (isinstance(mask, torch.fx.Node) and mask.target is aten.eq.Tensor and _is_zeros(zero)):
            continue
        if _size_along(a, dim, rank) != 1 or _size_along(scale, dim, rank) != 1:
            continue
        for iota, index in (mask.args, mask.args[::-1]):
            if _iota_dim(iota, rank) == dim and _size_along(index, dim, rank) == 1:
                return index, a, scale
    return None


def _replace(graph, node, index, a, scale, n, dim, keepdim, out) -> None:
    fake_mode = detect_fake_mode([out])
    product = _val(node.args[0])

    def emit(target, *args, **kwargs):
        new = graph.call_function(target, args, kwargs)
        values = [_val(x) if isinstance(x, torch.fx.Node) else x for x in args]
        with fake_mode:
            new.meta["val"] = target(*values, **kwargs)
        new.meta["stack_trace"] = node.meta.get("stack_trace")
        return new

    with graph.inserting_before(node):
        valid = emit(aten.logical_and.default, emit(aten.ge.Scalar, index, 0), emit(aten.lt.Scalar, index, n))
        value = emit(aten.mul.Tensor, emit(aten.mul.Tensor, a, scale),
                     emit(aten._to_copy.default, valid, dtype=out.dtype))
        kept = list(product.shape)
        kept[dim] = 1
        value = emit(aten.expand.default, value, kept)
        if not keepdim:
            value = emit(aten.squeeze.dim, value, dim)
        if _val(value).dtype != out.dtype:
            value = emit(aten._to_copy.default, value, dtype=out.dtype)
    node.replace_all_uses_with(value)
    graph.erase_node(node)


_MUTATING_NAME = re.compile(r"(?<!_)_$|_(out|inplace)$")


def _mutates(node: torch.fx.Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return bool(_MUTATING_NAME.search(getattr(target, "__name__", ""))) or node.kwargs.get("out") is not None


def _mergeable(node: torch.fx.Node, output_storages: set) -> bool:
    """A functional (``_mutates`` is false), deterministic op whose repeat may be replaced by its
    first occurrence."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target.__name__.split(".")[0] in (
            "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"):
        return False  # random draws, and uninitialized memory, are not the same value twice
    values = _val(node)
    values = values if isinstance(values, (tuple, list)) else (values,)
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return False  # symbolic scalars: an unbacked one must keep its own node
    # a graph output keeps its own storage: merged, two outputs would alias
    return all(StorageWeakRef(v.untyped_storage()) not in output_storages for v in values)


def _key_of(value):
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key_of(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key_of(v)) for k, v in value.items()))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(value.node.expr))
    if isinstance(value, torch.fx.Node):
        return value
    return (type(value), value)  # 1, 1.0 and True are distinct arguments


def eliminate_common_subexpressions(graph: torch.fx.Graph) -> int:
    """Replace each repeated call (same op, same arguments, no mutation in between) by its first
    occurrence, in place; returns how many nodes went.

    Left alone: placeholders and outputs, ops that mutate (each starts a new
    region: a call repeated across a mutation may read other data), random
    and ``empty`` ops, nodes whose value is not a tensor, and nodes whose
    storage is a graph output's.
    """
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    output_storages = set()
    for value in torch.utils._pytree.tree_leaves(output.args):
        val = _val(value)
        if isinstance(val, torch.Tensor):
            try:
                output_storages.add(StorageWeakRef(val.untyped_storage()))
            except NotImplementedError:  # no storage (a sparse or subclass tensor): nothing to alias
                pass
    first: dict = {}
    region = 0
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if _mutates(node):
            region += 1
            continue
        try:
            if not _mergeable(node, output_storages):
                continue
            key = (region, node.target, _key_of(node.args), _key_of(node.kwargs))
            hash(key)
        except (NotImplementedError, TypeError):  # no storage to compare, or an unhashable argument
            continue
        earlier = first.setdefault(key, node)
        if earlier is not node:
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
            removed += 1
    return removed


def zero_size_values_to_constants(gm: torch.fx.GraphModule) -> int:
    """Replace each computed tensor with no elements (a static zero-size shape) by ``aten.zeros`` of
    its shape and dtype; graph outputs keep their node (the plan returns them without XLA).
    Returns how many nodes were replaced."""
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outputs = set(n for n in output.all_input_nodes)
    replaced = 0
    for node in list(graph.nodes):
        val = _val(node)
        if node.op != "call_function" or node in outputs or not isinstance(val, torch.Tensor) or _mutates(node):
            continue
        if not all(isinstance(s, int) for s in val.shape) or val.numel() != 0 or node.target is aten.zeros.default:
            continue
        with graph.inserting_before(node):
            zeros = graph.call_function(aten.zeros.default, (list(val.shape),),
                                        {"dtype": val.dtype, "device": torch.device("cpu")})
        zeros.meta.update(node.meta)
        node.replace_all_uses_with(zeros)
        replaced += 1
    if replaced:
        graph.eliminate_dead_code()
        gm.recompile()
    return replaced


def one_device(gm: torch.fx.GraphModule) -> int:
    """Say what a graph over device tensors says about devices for XLA's one device, in place (the
    executable runs where its buffers are; ``GraphPlan`` keeps where each result goes). Returns how
    many places changed.

    * ``device=neuron:0`` arguments become ``cpu``: Torch-MLIR legalizes no other device (factories
      in a graph over neuron tensors: ReLU's backward makes a ``scalar_tensor`` on the inputs' device);
    * ``prims.device_put`` (``.to(device)`` decomposed: a rope's CPU-built frequencies moved to the
      model's device, a ``.cpu()`` inside the graph) becomes a copy of its input, which Torch-MLIR lowers;
    * a tensor constant on a device (AOTAutograd lifts ``torch.tensor([-1], device=x.device)`` into
      the graph as an attribute holding a real device tensor) becomes its host copy, read once here
      through the device's own copy to the host (its transfer API): the importer reads constants on
      the host, and a device tensor has no host memory.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    changed = 0

    def to_cpu(value):
        nonlocal changed
        if isinstance(value, torch.device) and value.type not in ("cpu", "meta"):
            changed += 1
            return torch.device("cpu")
        return value

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = torch.fx.node.map_aggregate(node.args, to_cpu)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, to_cpu)
            if node.target is torch.ops.prims.device_put.default:
                node.target, node.args, node.kwargs = aten.clone.default, node.args[:1], {}
                changed += 1
        elif node.op == "get_attr":
            owner, _, name = str(node.target).rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            value = getattr(module, name)
            if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta"):
                with unset_fake_temporarily():  # AOTAutograd compiles under its FakeTensorMode
                    setattr(module, name, value.detach().cpu())
                changed += 1
    if changed:
        gm.recompile()
    return changed
