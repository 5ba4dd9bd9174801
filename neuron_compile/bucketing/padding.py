"""Shape bucketing at call time: sizes rounded up, the graph re-traced at the bucket, tensors padded and sliced.

What ``bucketing.analyze`` proved, applied per call by ``CompiledGraph``:

* ``check_sizes``: what the analysis assumed of the sizes (``BucketAnalysis.checks``)
  holds at this call's true sizes and their buckets (``layouts.round_up``);
* ``BucketInterpreter``: re-runs the symbolic graph at the bucket's sizes
  under ``make_fx``, applying the analysis' rewrites (``Rewrite``): masks that
  give reductions their identity on padded positions (``apply_mask``,
  ``valid_mask``), sizes used as values read from the true sizes the
  executable receives in a small int64 tensor (``layouts.sym_to_value``), a mean
  divided by the true count, ``constant_pad_nd`` writing its value at the true
  end, an ``index_put`` into a padded dim wrapping negative indices with the
  true size. The result is a static graph for the ordinary compile path;
* ``pad_to_bucket`` and ``slice_from_bucket``: a call's inputs zero-padded to
  the bucket shape atom by atom, its outputs sliced back to their true shape.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from .layouts import Atoms, Layout, NotBucketable, _dim_expr, _padded_layout, _static
from .sizes import round_up, sym_to_value
from .analysis import SAME_AT_BUCKET, BucketAnalysis

aten = torch.ops.aten


# ----------------------------------------------------------------------------- arithmetic


def check_sizes(checks: list, true_env: dict, bucket_env: dict) -> None:
    """NotBucketable unless what the analysis assumed (``BucketAnalysis.checks``) holds at this call."""
    try:
        _check_sizes(checks, true_env, bucket_env)
    except (ArithmeticError, KeyError, TypeError) as exc:  # a size not defined at these sizes (// 0)
        raise NotBucketable(f"a checked size cannot be evaluated at {true_env} and {bucket_env}: {exc!r}") from exc


def _check_sizes(checks: list, true_env: dict, bucket_env: dict) -> None:
    for lhs, rhs in checks:
        if isinstance(rhs, str) and rhs == SAME_AT_BUCKET:
            if int(sym_to_value(lhs, bucket_env)) != int(sym_to_value(lhs, true_env)):
                raise NotBucketable(f"size {lhs} is {sym_to_value(lhs, true_env)} at the true sizes but "
                                    f"{sym_to_value(lhs, bucket_env)} at the bucket, where it was taken for the same")
        elif rhs is None:
            if int(sym_to_value(lhs, bucket_env)) < int(sym_to_value(lhs, true_env)):
                raise NotBucketable(f"size {lhs} is {sym_to_value(lhs, true_env)} at the true sizes but "
                                    f"{sym_to_value(lhs, bucket_env)} at the bucket")
        else:
            for env in (true_env, bucket_env):
                if int(sym_to_value(lhs, env)) != int(sym_to_value(rhs, env)):
                    raise NotBucketable(f"sizes {lhs} and {rhs} differ at {env}")


def padded_size(atoms: Atoms, buckets_env: dict) -> int:
    return int(math.prod(int(sym_to_value(a, buckets_env)) for a in atoms)) if atoms else 1


def valid_mask(atoms: Atoms, buckets_env: dict, true_env: dict) -> torch.Tensor:
    """Bool vector over a padded dim: True where the position holds a real value."""
    sizes = [int(sym_to_value(a, buckets_env)) for a in atoms]
    total = math.prod(sizes)
    idx = torch.arange(total)
    mask = torch.ones(total, dtype=torch.bool)
    stride = total
    for atom, size in zip(atoms, sizes):
        stride //= size
        if _static(atom):
            continue
        comp = (idx // stride) % size
        mask = mask & (comp < sym_to_value(atom, true_env))
    return mask


def _identity(kind, dtype):
    if kind in ("min", "-inf"):
        return float("-inf") if dtype.is_floating_point else (False if dtype == torch.bool else torch.iinfo(dtype).min)
    if kind == "max":
        return float("inf") if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)
    if isinstance(kind, tuple):
        return kind[1]
    return kind


def apply_mask(x: torch.Tensor, dims, identity, buckets_env, true_env) -> torch.Tensor:
    mask = None
    for d, atoms in dims:
        m = valid_mask(atoms, buckets_env, true_env)
        shape = [1] * x.dim()
        shape[d] = -1
        m = m.view(shape)
        mask = m if mask is None else mask & m
    if mask is None:
        return x
    fill = _identity(identity, x.dtype)
    return torch.where(mask, x, torch.full((), fill, dtype=x.dtype))


def _sort_padding_last(x, dim, atoms, descending, buckets_env, true_env):
    """``sort(x, dim)`` with the padded elements of ``dim`` after every real one, the real ones in
    the order the sort gives them: sorted, then each real element moved to its rank among the
    real ones and each padded one after them (a permutation: a scatter, no second sort)."""
    values, order = aten.sort.default(x, dim, bool(descending))
    shape = [1] * x.dim()
    shape[dim] = -1
    real = torch.gather(valid_mask(atoms, buckets_env, true_env).view(shape).expand(x.shape), dim, order)
    ones = real.to(torch.int64)
    dest = torch.where(real, torch.cumsum(ones, dim) - 1, ones.sum(dim, keepdim=True) + torch.cumsum(1 - ones, dim) - 1)
    return torch.zeros_like(values).scatter(dim, dest, values), torch.zeros_like(order).scatter(dim, dest, order)


def _read_at_true_position(x, bucketed, target, d, position, size, true_env):
    """A slice or select at a size, read at the size's true value (the bucketed op read at the
    bucket's): rows ``position + j``, negative from the dim's true end ``size``, clamped to the
    dim (``indexing``)."""
    n = x.shape[d]
    start = torch.as_tensor(sym_to_value(position, true_env))
    start = torch.where(start < 0, start + sym_to_value(size, true_env), start).clamp(0, n - 1)
    if target is aten.select.int:
        return torch.index_select(x, d, start.view(1)).squeeze(d)
    index = (start + torch.arange(bucketed.shape[d])).clamp(max=n - 1)
    return torch.index_select(x, d, index)


def convert_positions(p: torch.Tensor, atoms: Atoms, src_env: dict, dst_env: dict) -> torch.Tensor:
    """Positions along a dim laid out as ``atoms`` at the sizes of ``src_env``, as positions of the
    same elements at the sizes of ``dst_env`` (bucket to true: eager's positions; and back)."""
    src = [sym_to_value(a, src_env) for a in atoms]
    dst = [sym_to_value(a, dst_env) for a in atoms]
    out = torch.zeros_like(p)
    stride_src, stride_dst = 1, 1
    for s, d in zip(reversed(src), reversed(dst)):
        out = out + (p // stride_src) % s * stride_dst
        stride_src, stride_dst = stride_src * s, stride_dst * d
    return out


class RetraceInterpreter(torch.fx.Interpreter):
    """Re-runs a symbolic AOT graph at concrete sizes under make_fx. Whether a ``view`` is possible
    depends on strides, and re-tracing at concrete sizes can compute other strides than the
    symbolic trace did (bamba's chunked scan at one chunk: a permuted einsum result the graph then
    views): views become reshapes, which the executable computes alike (XLA arrays have no strides)."""

    def call_function(self, target, args, kwargs):
        if target in (aten.view.default, aten._unsafe_view.default):
            target = aten.reshape.default
        return super().call_function(target, args, kwargs)


class BucketInterpreter(RetraceInterpreter):
    """Runs the symbolic graph at bucket sizes under make_fx, applying the analysis' rewrites."""

    def __init__(self, gm, analysis: BucketAnalysis, buckets_env: dict):
        super().__init__(gm)
        self.analysis = analysis
        self.buckets_env = buckets_env
        self.true_env: dict = {}

    def run_with_true_sizes(self, true_sizes: torch.Tensor, *args):
        # symbols that are not padded (value symbols, specialized exactly) are their bucket value
        self.true_env = {**self.buckets_env, **{s: true_sizes[i] for i, s in enumerate(self.analysis.symbols)}}
        self._position = 0
        return self.run(*args)

    def call_function(self, target, args, kwargs):
        node = self._current
        rewrite = self.analysis.rewrites.get(node.name)
        if rewrite is None:
            return super().call_function(target, args, kwargs)
        args = list(args)
        for index, expr in rewrite.true_values.items():
            value = sym_to_value(expr, self.true_env)
            if isinstance(value, torch.Tensor) and target is aten.scalar_tensor.default:
                dtype = kwargs.get("dtype") or torch.get_default_dtype()
                return value.to(dtype)
            args[index] = value
        for index, dims, identity in rewrite.masks:
            if dims:
                args[index] = apply_mask(args[index], dims, identity, self.buckets_env, self.true_env)
        for k, atoms in rewrite.index_wrap or ():
            # index_put into a padded dim: a negative index counts from the true end, not the bucket's
            indices = list(args[1])
            n = sym_to_value(_dim_expr(atoms), self.true_env)
            indices[k] = torch.where(indices[k] < 0, indices[k] + n, indices[k])
            args[1] = indices
        if rewrite.scratch is not None:
            # padded index entries write a scratch row past the end, dropped after (indexing)
            d, dims = rewrite.scratch
            target_in, n = args[0], args[0].shape[d]
            indices = list(args[1])
            indices[d] = apply_mask(indices[d], dims, ("value", n), self.buckets_env, self.true_env)
            extended = torch.cat([target_in, target_in.narrow(d, 0, 1)], d)
            return target(extended, indices, *args[2:], **kwargs).narrow(d, 0, n)
        if rewrite.sort_last is not None and target is aten.topk.default:
            # topk: the first k of the sort with the padded elements last (indexing.topk_layout)
            largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
            d = rewrite.sort_last[0]
            values, order = _sort_padding_last(args[0], *rewrite.sort_last, largest, self.buckets_env, self.true_env)
            return values.narrow(d, 0, args[1]), order.narrow(d, 0, args[1])
        if rewrite.sort_last is not None:
            descending = kwargs.get("descending", args[2] if len(args) > 2 else False)
            return _sort_padding_last(args[0], *rewrite.sort_last, descending, self.buckets_env, self.true_env)
        if rewrite.mean_dims is not None:
            # mean over a padded dim: masked sum divided by the true element count
            x = args[0]
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            total = torch.sum(x, [d for d, _ in rewrite.mean_dims], keepdim=keep, dtype=kwargs.get("dtype"))
            count = 1
            for _, atoms in rewrite.mean_dims:
                count = count * (sym_to_value(_dim_expr(atoms), self.true_env) if atoms else 1)
            return total / count
        if rewrite.true_values and target in (aten.full.default, aten.new_full.default, aten.full_like.default):
            index = next(iter(rewrite.true_values))
            value = args[index]
            args[index] = 0
            zeros = target(*args, **kwargs)
            return zeros + value.to(zeros.dtype)
        if rewrite.true_values and isinstance(target, torch._ops.OpOverload):
            target = target.overloadpacket  # a Scalar overload now gets a 0-d tensor: let dispatch pick
        out = target(*args, **kwargs)
        if rewrite.read_at is not None:
            out = _read_at_true_position(args[0], out, target, *rewrite.read_at, self.true_env)
        if rewrite.cat_pieces is not None:
            out = self._cat_in_eager_order(out, args[0], *rewrite.cat_pieces)
        if rewrite.pad_fix:
            for d, atoms, left in rewrite.pad_fix:
                fill = args[2] if len(args) > 2 else kwargs.get("value", 0)
                n = out.shape[d]
                idx = torch.arange(n).view([-1 if k == d else 1 for k in range(out.dim())])
                end = sym_to_value(_dim_expr(atoms), self.true_env) + left
                out = torch.where(idx < end, out, torch.full((), fill, dtype=out.dtype))
        return out

    def _cat_in_eager_order(self, out, pieces, d, atoms):
        """A bucketed cat gathered so that each real element sits where eager's cat puts it
        (``conv_cat.cat_layout``)."""
        j = torch.arange(out.shape[d])
        index = j
        start_true, start_bucket = 0, 0
        for piece, a in zip(pieces, atoms):
            size_true = piece.shape[d] if a is None else sym_to_value(a[0], self.true_env)
            inside = (j >= start_true) & (j < start_true + size_true)
            index = torch.where(inside, j - start_true + start_bucket, index)
            start_true, start_bucket = start_true + size_true, start_bucket + piece.shape[d]
        return torch.index_select(out, d, index)

    def run_node(self, n):
        self._current = n
        return super().run_node(n)

    def placeholder(self, target, args, kwargs):
        value = super().placeholder(target, args, kwargs)
        atoms = self.analysis.position_inputs.get(self._position)
        self._position += 1
        return value if atoms is None else convert_positions(value, atoms, self.true_env, self.buckets_env)

    def output(self, target, args, kwargs):
        outs = list(args[0]) if isinstance(args[0], (tuple, list)) else [args[0]]
        for k, atoms in self.analysis.position_outputs.items():
            outs[k] = convert_positions(outs[k], atoms, self.buckets_env, self.true_env)
        return type(args[0])(outs) if isinstance(args[0], (tuple, list)) else outs[0]


# ----------------------------------------------------------------------------- call-time padding


def _atom_sizes(layout: Layout, env: dict) -> list[int]:
    sizes = []
    for atoms in layout:
        if not atoms:
            sizes.append(1)
        else:
            sizes.extend(int(sym_to_value(a, env)) for a in atoms)
    return sizes


def pad_to_bucket(t: torch.Tensor, layout: Layout, bucket_env: dict, true_env: dict) -> torch.Tensor:
    """Zero-pad a true-size tensor to its bucket shape, atom by atom."""
    if not _padded_layout(layout):
        return t
    true_atoms = _atom_sizes(layout, true_env)
    padded_atoms = _atom_sizes(layout, bucket_env)
    if true_atoms == padded_atoms:
        return t
    out = t.new_zeros(padded_atoms)
    out[tuple(slice(0, n) for n in true_atoms)] = t.reshape(true_atoms)
    return out.reshape([padded_size(a, bucket_env) for a in layout])


def slice_from_bucket(t: torch.Tensor, layout: Layout, bucket_env: dict, true_env: dict) -> torch.Tensor:
    """The real region of a bucket-shaped tensor, at its true shape."""
    if not _padded_layout(layout):
        return t
    true_shape = [padded_size(a, true_env) for a in layout]
    if list(t.shape) == true_shape:
        return t
    if all(len(a) <= 1 for a in layout):
        for d, n in enumerate(true_shape):
            if t.shape[d] != n:
                t = t.narrow(d, 0, n)
        # contiguous, as eager's result is: a narrowed view keeps the bucket's strides, and the
        # user's next view(-1, h) would fail on it (dbrx's experts, across a graph break)
        return t.contiguous()
    true_atoms = _atom_sizes(layout, true_env)
    view = t.reshape(_atom_sizes(layout, bucket_env))
    return view[tuple(slice(0, n) for n in true_atoms)].reshape(true_shape)
