"""Reductions over padded dims, for the padding analysis (``analysis.py``): a reduced padded dim
sees the reduction's identity on its padded positions (``where(mask, x, identity)`` before the op,
``padding`` applies it), a mean divides by the true element count.
"""

from __future__ import annotations

import torch
import torch.fx

from .layouts import NotBucketable, _padded, _padded_layout, prefix_atoms

aten = torch.ops.aten

# reduction -> identity (None: depends on dtype and direction, see _identity)
_REDUCTIONS = {
    aten.sum.dim_IntList: 0, aten.sum.default: 0, aten.prod.dim_int: 1, aten.prod.default: 1,
    aten.amax.default: "min", aten.amin.default: "max", aten.max.dim: "min", aten.min.dim: "max",
    aten.argmax.default: "min", aten.argmin.default: "max", aten.any.dim: False, aten.any.dims: False,
    aten.any.default: False, aten.all.dim: True, aten.all.dims: True, aten.all.default: True,
    aten.logsumexp.default: "-inf", aten.mean.dim: 0, aten.mean.default: 0, aten.max.default: "min",
    aten.min.default: "max",
}


def _reduction_layout(node, layouts, tensor_args, rewrite):
    _reduction(node, layouts, tensor_args, rewrite, identity=0)


def _reduction(node, layouts, tensor_args, rewrite, identity=None):
    target = node.target
    src = tensor_args[0][2]
    nd = len(src)
    args = node.args
    if target in (aten.sum.default, aten.prod.default, aten.any.default, aten.all.default, aten.mean.default) or (
            identity is not None and (len(args) < 2 or args[1] is None) and "dim" not in node.kwargs):
        dims = list(range(nd))
        keep = False
    else:
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(nd))  # dim=[] reduces every dim (sum.dim_IntList, amax)
        elif isinstance(dims, int):
            dims = [dims]
        dims = [d % nd for d in dims] if nd else []
        keep = (args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
    _reduced(node, layouts, src, dims, keep, _REDUCTIONS.get(target, identity), rewrite)


def _vector_norm(node, layouts, tensor_args, rewrite):
    """``linalg_vector_norm(x, ord, dim)`` over a padded dim: ``(sum |x|^ord)^(1/ord)``, ``max |x|``
    or a count of nonzeros: zeros on the padded positions add nothing for any ``ord >= 0``
    (a negative order or -inf would read them as infinities or minima)."""
    args, src = node.args, tensor_args[0][2]
    order = args[1] if len(args) > 1 else node.kwargs.get("ord", 2)
    dims = args[2] if len(args) > 2 else node.kwargs.get("dim")
    keep = args[3] if len(args) > 3 else node.kwargs.get("keepdim", False)
    dims = list(range(len(src))) if not dims else [d % len(src) for d in ([dims] if isinstance(dims, int) else dims)]
    if not isinstance(order, (int, float)) or order < 0:
        if any(_padded(src[d]) for d in dims):
            raise NotBucketable(f"{node.name}: a vector norm of order {order} over a padded dim")
    _reduced(node, layouts, src, dims, keep, 0, rewrite)


def _reduced(node, layouts, src, dims, keep, identity, rewrite):
    target, nd = node.target, len(src)
    masked = [(d, src[d]) for d in dims if _padded(src[d])]
    if masked:
        rewrite.masks.append((0, masked, identity))
        if target in (aten.mean.dim, aten.mean.default):
            rewrite.mean_dims = [(d, src[d]) for d in dims]
    out = [() if d in dims else src[d] for d in range(nd)] if keep else [src[d] for d in range(nd) if d not in dims]
    val = node.meta["val"]
    layouts[node] = [tuple(out), tuple(out)] if isinstance(val, (tuple, list)) else tuple(out)


# prefix scan -> the identity its padded positions see where they lie inside the real region
_SCANS = {aten.cumsum.default: 0, aten.cumprod.default: 1}


def prefix_scan_layout(node, src, rewrite):
    """A prefix scan along ``d`` (``out[i] = x[0] op ... op x[i]``) keeps its input's layout.

    Where ``d``'s real region is a prefix of the dim (one atom), a real output reads real inputs
    only. Where ``d`` is blocks each real on a prefix (``(2, t)``: a view of ``[2, t]`` as ``[2 t]``),
    a real output of the second block reads the first block's padded tail as well: those
    positions are set to the scan's identity first (0 for a sum, 1 for a product), and the real
    outputs are then eager's."""
    if src:
        d = node.args[1] % len(src)
        if _padded(src[d]) and prefix_atoms(src[d]) is None:
            rewrite.masks.append((0, [(d, src[d])], _SCANS[node.target]))
    return src


def associative_scan_layout(node, layout_of, combine):
    """The ``associative_scan`` op (``associative_scan.py``) scans its inputs along dim 0 with a
    pointwise combine (Dynamo checks): ``out[i] = x[0] . x[1] . ... . x[i]``, elementwise in the
    other dims, so every output keeps the inputs' layout, which they must share. Where dim 0's
    real region is a prefix, a real output combines real inputs only. A combine has no identity we
    know, so dim 0 laid out as blocks (each real on a prefix) is refused, as is a padded additional
    input, or a size the combine reads (its value at the bucket is not the true one)."""
    xs = [layout_of(x) for x in node.args[1]]
    if any(lay is None or tuple(lay) != tuple(xs[0]) for lay in xs):
        raise NotBucketable(f"{node.name}: associative_scan's inputs are laid out differently")
    if xs[0] and _padded(xs[0][0]) and prefix_atoms(xs[0][0]) is None:
        raise NotBucketable(f"{node.name}: associative_scan along padded blocks (a combine has no identity to mask with)")
    lifted = [p for p in combine.graph.nodes if p.op == "placeholder"][2 * len(xs):]
    for extra, placeholder in zip(node.args[2], lifted):
        a_size = not isinstance(extra, torch.fx.Node) or not isinstance(extra.meta.get("val"), torch.Tensor)
        if _padded_layout(layout_of(extra)) or (a_size and placeholder.users):
            raise NotBucketable(f"{node.name}: associative_scan's combine reads a padded tensor or a size")
    return [tuple(xs[0]) for _ in node.meta["val"]]
