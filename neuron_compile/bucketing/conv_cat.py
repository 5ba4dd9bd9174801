"""Padding rules for ops whose outputs along a padded dim read neighbours or shift: convolution,
cat and constant_pad_nd.

``analysis.py`` asks these for a node's layout (and the rewrite the bucketed
re-trace applies, ``padding``). Each rule's algebra is in its docstring;
what no rule proves raises ``NotBucketable`` and the graph keeps exact shapes.
"""

from __future__ import annotations

import sympy
import torch

from .layouts import NotBucketable, _broadcast, _dim_expr, _expr, _norm, _padded, _static, layout_of_shape, prefix_atoms

aten = torch.ops.aten

aten = torch.ops.aten


def convolution_layout(node: torch.fx.Node, layout_of, rewrite):
    """Layout of ``convolution(x, w, b, stride, padding, dilation, transposed, ...)`` over a padded
    spatial dim (a Mamba or short-conv block's causal conv over the tokens), masks in ``rewrite``.

    Output ``j`` reads inputs ``j * stride - padding + i * dilation``. At a real output (the prefix
    of eager's length) those are real inputs, the left zero padding, or positions past the true
    end that eager reads as its right zero padding: with the input's padded region masked to
    zeros the bucket reads zeros there too, so every real output is eager's, at any stride,
    padding and dilation. A transposed convolution (a convolution's input gradient) sums
    ``x[j] * w[i]`` over the inputs ``j`` that reach output ``j * stride - padding + i * dilation``:
    a real output gets eager's terms from the real inputs and zeros from the masked padded ones.
    The output dim is the prefix of its true length; batch keeps its layout, channels are fresh.
    A weight padded along a spatial dim (a weight gradient, computed as a convolution of the input
    by the output gradient) is a contraction over that dim: with both sides masked to zeros the
    padded terms add nothing, if the output's spatial size is not padded (static, or the same at
    the bucket, ``layouts.assume_invariant_sizes``; a padded one would differ there).
    """
    args = node.args
    val = node.meta["val"]
    src, weight = layout_of(args[0]), layout_of(args[1])
    if weight is not None and any(_padded(a) for a in weight):
        spatial = [d for d in range(2, len(weight)) if _padded(weight[d])]
        if _padded(weight[0]) or _padded(weight[1]) or any(prefix_atoms(weight[d]) is None for d in spatial) \
                or any(_padded((_expr(n),)) for n in val.shape[2:]):
            raise NotBucketable(f"{node.name}: a convolution with padded weights")
        rewrite.masks.append((1, [(d, weight[d]) for d in spatial], 0))
    masked, lay = [], [src[0], layout_of_shape([val.shape[1]])[0]]
    for d in range(2, len(src)):
        if _padded(src[d]):
            if prefix_atoms(src[d]) is None:
                raise NotBucketable(f"{node.name}: a convolution over a merged padded dim {d}")
            masked.append((d, src[d]))
            lay.append((_expr(val.shape[d]),))
        else:
            lay.append(layout_of_shape([val.shape[d]])[0])
    if masked:
        rewrite.masks.append((0, masked, 0))
    return tuple(lay)


def convolution_backward_layout(node: torch.fx.Node, layout_of, rewrite):
    """Layouts of ``convolution_backward(grad_out, x, w, ...)`` -> (grad_x, grad_w, grad_b).

    With the padded regions of ``grad_out`` and ``x`` masked to zeros, ``grad_x`` at a real input
    sums the same ``grad_out[j] * w[i]`` as eager (the padded ``j`` add zeros), and ``grad_w``,
    ``grad_b`` sum over real outputs only, reading real inputs or zeros where eager reads its
    zero padding (the forward's algebra, read backwards).
    """
    args = node.args
    grad, src = layout_of(args[0]), layout_of(args[1])
    for lay, k in ((grad, 0), (src, 1)):
        dims = [(d, lay[d]) for d in range(2, len(lay)) if _padded(lay[d])]
        if any(prefix_atoms(a) is None for _, a in dims):
            raise NotBucketable(f"{node.name}: a convolution backward over a merged padded dim")
        if dims:
            rewrite.masks.append((k, dims, 0))
    weight = layout_of(args[2])
    return [src, weight, layout_of_shape(node.meta["val"][2].shape) if node.meta["val"][2] is not None else None]


def cat_layout(node: torch.fx.Node, layout_of, rewrite):
    """Layout of ``cat(pieces, d)``; where a padded piece is followed by others, a rewrite.

    Each piece along ``d`` is static or padded as one atom (its real region a prefix). At the
    bucket, piece ``i`` sits at ``[C_i, C_i + E_i)`` (bucket sizes); in eager at ``[c_i, c_i + e_i)``
    (true sizes). When only the last piece is padded the two agree on every real element (a KV
    cache growing from a static prefix). Otherwise the bucketed cat is gathered so that output
    ``j < sum(e)`` reads ``C_i + j - c_i`` of the piece it falls in (``rewrite.cat_pieces``):
    eager's order, the real region a prefix of the true total (gpt-oss's attention sinks,
    ``cat([scores, sinks], -1)`` along the padded key dim).

    Pieces all padded alike (every dim's atoms the same: ``stack``, which torch decomposes to a
    cat and a view, of per-codebook logits; prophetnet's n-gram streams) need no gather: at the
    bucket piece ``i`` sits at ``[i E, i E + E)``, its real elements at ``i E + j``, which is the
    row-major layout ``(n, *atoms)`` of the dim, eager's ``i e + j`` read through it, as a view
    ``[n, e] -> [n e]`` would give (and a split into the ``n`` pieces undoes).
    """
    args = node.args
    val = node.meta["val"]
    d = (args[1] if len(args) > 1 else 0) % val.dim()
    parts = [layout_of(x) for x in args[0]]
    if len(parts) > 1 and parts[0] is not None and len(parts[0]) == val.dim() and _padded(parts[0][d]) and all(
            p == parts[0] for p in parts):
        return tuple((sympy.Integer(len(parts)), *a) if k == d else a for k, a in enumerate(parts[0]))
    atoms = []
    for p in parts:
        if p is not None and len(p) == val.dim() and _padded(p[d]):
            if prefix_atoms(p[d]) is None:
                raise NotBucketable(f"{node.name}: cat along padded dim {d} of a merged padded piece")
            atoms.append(prefix_atoms(p[d]))
        else:
            atoms.append(None)
    padded = [k for k, a in enumerate(atoms) if a is not None]
    if padded and padded != [len(parts) - 1]:
        rewrite.cat_pieces = (d, atoms)
    others = [p for p in parts if p is not None and len(p) == val.dim()]
    lay = list(_broadcast([tuple(() if k == d else a for k, a in enumerate(p)) for p in others], val.shape))
    lay[d] = layout_of_shape([val.shape[d]])[0]
    return tuple(lay)


def split_layout(node: torch.fx.Node, src):
    """Layouts of the pieces of ``split``, ``split_with_sizes`` or ``unbind`` of a tensor laid out
    as ``src``. Along an unpadded dim each piece is fresh; a padded dim splits only into the blocks
    of its leading static atom, ``(n, *atoms)`` into ``k`` pieces ``(n / k, *atoms)`` (the pieces of
    a cat of pieces padded alike, ``cat_layout``: prophetnet's n-gram streams back apart)."""
    target, args, val = node.target, node.args, node.meta["val"]
    d = (args[2] if target is not aten.unbind.int and len(args) > 2 else
         (args[1] if target is aten.unbind.int and len(args) > 1 else node.kwargs.get("dim", 0))) % len(src)
    block = None
    if _padded(src[d]):
        if _static(src[d][0]) and target is not aten.unbind.int and int(src[d][0]) % len(val) == 0:
            block = _norm((src[d][0] // len(val), *src[d][1:]))
        if block is None or any(_expr(piece.shape[d]) != _dim_expr(block) for piece in val):
            raise NotBucketable(f"{node.name}: {target} along padded dim {d}")
    outs = []
    for piece in val:
        lay = list(src)
        if target is aten.unbind.int:
            del lay[d]
        else:
            lay[d] = block or layout_of_shape([piece.shape[d]])[0]
        outs.append(tuple(lay))
    return outs


def constant_pad_layout(node: torch.fx.Node, src, rewrite, checks: list):
    """Layout of ``constant_pad_nd(x, pads, value)``; the fill at the true end in ``rewrite.pad_fix``.

    Pads run from the last dim, ``(left, right)`` each. Along a padded dim (its real region a
    prefix of ``s``) a static left pad moves the real elements to ``[left, left + s)`` at the
    bucket as in eager (a negative one crops), and the bucket's garbage after them is overwritten
    with the value from ``left + s`` on (``pad_fix``): eager's result on its true length
    ``left + s + right``, a prefix. A symbolic right pad (Mamba2's chunked scan pads the tokens to
    a multiple of the chunk, ``(c - t % c) % c``) is the bucket's amount at the bucket: eager's
    result as long as the bucket's length covers the true one, which each call checks
    (``checks``). A symbolic left pad would move the real elements by the bucket's amount.
    """
    args, val = node.args, node.meta["val"]
    pads = list(args[1])
    lay, fixes = list(src), []
    for k in range(len(pads) // 2):
        d = len(src) - 1 - k
        left, right = pads[2 * k], pads[2 * k + 1]
        if isinstance(left, int) and isinstance(right, int) and left == 0 and right == 0:
            continue
        if not _padded(src[d]):
            if not (isinstance(left, int) and isinstance(right, int)):
                raise NotBucketable(f"{node.name}: constant_pad_nd of unpadded dim {d} by symbolic amounts")
            lay[d] = layout_of_shape([val.shape[d]])[0]
            continue
        if prefix_atoms(src[d]) is None or not isinstance(left, int):
            raise NotBucketable(f"{node.name}: constant_pad_nd of padded dim {d} by {left, right}")
        fixes.append((d, prefix_atoms(src[d]), left))
        lay[d] = (_expr(val.shape[d]),)
        if not isinstance(right, int):
            checks.append((_expr(val.shape[d]), None))
    rewrite.pad_fix = fixes
    return tuple(lay)
