"""Shape bucketing: symbolic sizes rounded up to buckets, one executable per bucket, exact results.

When Dynamo hands us a graph with symbolic sizes, each size symbol ``s`` is
rounded up to a bucket ``S`` (the next multiple of 128 by default, or the next
entry of an explicit list; capped at the last size the graph's guards admit,
``layouts.bucket_within``). Inputs are padded to the bucket at call
time, outputs sliced back, and one executable serves every length in the bucket.

Padding must never leak into real values. The padded region of a tensor holds
garbage (anything, NaN included); every op whose real outputs could read it is
made exact:

* reductions over a padded dim (sum, amax, any, softmax, nll_loss, ...) see the
  reduction's identity there (``where(mask, x, identity)`` before the op);
* contractions over a padded dim (mm, bmm) see zeros on both sides;
* accumulating scatters (embedding backward) add zeros from padded rows;
* arithmetic on a size as a *value* (a mean's divisor, ``x * n``) reads the
  true size, passed to the executable at run time in a small int64 tensor, not
  the bucket; sizes used as *shapes* (views, ``arange(n)``) take the bucket;
* ``constant_pad_nd`` along a padded dim writes its value at the true end.

The analysis (``analyze``) is conservative: an op it cannot prove safe on a
padded dim (flip, roll along it, a view that splits a padded size, ...) makes
the whole graph compile at exact shapes instead, and the reason is kept
(``CompiledGraph.bucketing``, the compile report, ``neuron-compile explain``).

Layouts (their arithmetic is ``layouts.py``). A dim of a padded tensor
is a row-major product of *atoms*, each a sympy expression of the true size
(``s1``, ``s1 + 1``, a static ``64``); a view merging ``[s0, s1]`` into
``[s0*s1]`` keeps the atoms ``(s0, s1)`` so the padding pattern of the merged
dim is known. Where such a merged dim crosses a graph boundary (a forward
output saved for the backward), the backward reads the forward's atoms back.

Rewrites happen while the symbolic graph is re-traced at the bucket's sizes
(``padding.BucketInterpreter`` under ``make_fx``), so the result is a
static graph that goes through the ordinary compile path and cache. This
module is the analysis; ``padding`` applies it at each call.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx

from .layouts import (NotBucketable, _broadcast, _dim_expr, _expr, _norm, _padded, _padded_layout, _regroup,
                      Specialize, agree, assume_equal_sizes, assume_invariant_sizes, assume_products, assumed_products,
                      end_assumptions, guarded_products, layout_of_shape, merged_input, shape_key, size_expr,
                      specialize_sizes)
from .sizes import size_multiples, symbol_admits
from .conv_cat import cat_layout, constant_pad_layout, convolution_backward_layout, convolution_layout, split_layout
from .indexing import (index_layout, index_put_layout, row_local_layout, select_layout, slice_layout, sort_layout,
                       topk_layout)
from ..decompositions.associative_scan import scan_op
from .padded_reductions import _REDUCTIONS, _SCANS, _reduction, _reduction_layout, _vector_norm, associative_scan_layout, prefix_scan_layout
from .values import Positions, adopt_uniform, check_reads, inexact, value_fact
from .shape_env import graph_shape_env, graph_size_symbols, graph_traced_values

aten = torch.ops.aten

# ----------------------------------------------------------------------------- analysis

_POINTWISE_EXTRA = {
    aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten._to_copy.default,
    aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.tril.default, aten.triu.default,
    aten.copy.default, aten.detach.default, aten.clamp.default, aten.clamp.Tensor, aten.polar.default,
    aten._conj.default,
}
_CREATION = {
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default, aten.zeros.default,
    aten.ones.default, aten.empty.memory_format, aten.empty_strided.default, aten.scalar_tensor.default,
    aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.new_empty.default,
    aten.new_empty_strided.default,
}
# a tensor shaped as the first argument (random draws elementwise: phimoe's Gumbel noise, exponential_)
_LIKE = {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
         aten.rand_like.default, aten.randn_like.default, aten.exponential.default, aten.uniform.default,
         aten.bernoulli.p}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_SOFTMAX = {aten._softmax.default, aten._log_softmax.default}
# reductions that are exact only when no reduced dim is padded (statistics over hidden sizes)
_ROW_REDUCTIONS = {aten.var_mean.correction, aten.var.correction, aten.std.correction, aten.var_mean.dim,
                   aten.var.dim, aten.std.dim}
_POSITIONED = {aten.slice.Tensor, aten.select.int}
_ASSERTS = {aten._assert_async.msg, aten._assert_async.default}
_ROW_LOCAL_INDEXING = {aten.gather.default, aten.scatter.value, aten.scatter.src, aten.scatter_add.default,
                       aten.scatter_reduce.two}


@dataclass
class Rewrite:
    """What to do to one node while re-tracing: mask arguments, feed true sizes."""

    masks: list = field(default_factory=list)  # (arg index, dims: list[(dim, atoms)], identity)
    true_values: dict = field(default_factory=dict)  # arg index -> sympy expr of a size used as a value
    mean_dims: list | None = None  # mean over padded dims: divide by the true count
    pad_fix: list | None = None  # constant_pad_nd: (dim, atoms of the input dim, left pad)
    index_wrap: list | None = None  # index_put: (position in the index list, atoms of that padded dim)
    sort_last: tuple | None = None  # sort along a padded dim: (dim, its atoms): the padded elements go last
    scratch: tuple | None = None  # index_put from padded indices: (dim, the indices' padded dims)
    read_at: tuple | None = None  # slice or select of an unpadded dim at a size: (dim, its expression)
    cat_pieces: tuple | None = None  # cat with a padded piece before another: (dim, per piece its atoms or None)


SPECIALIZED = ("specialized",)  # boundary_layouts' key for the sizes a forward specialized
OUTPUTS = ("outputs",)  # and for its outputs' (shape, layout): a tangent is padded as its output was
SAME_AT_BUCKET = "same at the bucket"  # a check's right side: its left is invariant (layouts)


@dataclass(frozen=True)
class SymOutput:
    """A graph output that is a size (a host int): computed from the true sizes after the call."""

    expr: object


@dataclass
class BucketAnalysis:
    """The outcome of ``analyze`` for one symbolic graph."""

    ok: bool
    reason: str = ""
    symbols: tuple = ()  # size symbols, in a fixed order (index into the true-sizes tensor)
    value_symbols: tuple = ()  # symbols only used as values: specialized exactly, never bucketed
    bindings: dict = field(default_factory=dict)  # symbol -> (arg position, dim or None)
    input_layouts: dict = field(default_factory=dict)  # arg position -> Layout
    sym_inputs: dict = field(default_factory=dict)  # arg position -> size expression (fed at the bucket)
    output_layouts: list = field(default_factory=list)  # per output: Layout, SymOutput or None
    output_facts: list = field(default_factory=list)  # per output: what values knows of its values
    # positions in a padded layout cross graph boundaries as eager's positions: arg/output index -> atoms
    position_inputs: dict = field(default_factory=dict)
    position_outputs: dict = field(default_factory=dict)
    rewrites: dict = field(default_factory=dict)  # node name -> Rewrite
    # what the analysis could not prove for every size but holds for the sizes real calls have,
    # checked at each call (``holds``): (lhs, rhs): lhs == rhs at the true and at the bucket sizes;
    # (expr, None): expr at the bucket is at least expr at the true sizes;
    # (expr, SAME_AT_BUCKET): expr is the same at the bucket as at the true sizes (an invariant atom)
    checks: list = field(default_factory=list)
    output_names: list = field(default_factory=list)
    specialized: dict = field(default_factory=dict)  # size symbol -> the value it is taken at (checked)
    admits: dict = field(default_factory=dict)  # size symbol -> Admits: caps its bucket (bucket_within)
    multiples: dict = field(default_factory=dict)  # size symbol -> (another, c): bucketed at c times its
    one_size: bool = False  # not ok because Dynamo's guards admit one size only: exact is one executable


def _schema_args(node):
    schema = getattr(node.target, "_schema", None)
    return schema.arguments if schema is not None else []


def _is_sym_node(value) -> bool:
    return isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), (torch.SymInt, torch.SymFloat))


def analyze(gm: torch.fx.GraphModule, boundary_layouts: dict | None = None, buckets=None) -> BucketAnalysis:
    """Decide whether ``gm`` can run padded to ``buckets`` (the option: a multiple or a list), and
    how; never raises: a case the analysis does not know (NotBucketable) or trips over (any other
    exception) keeps exact shapes. Without ``buckets`` no size is taken for invariant
    (``layouts.assume_invariant_sizes``)."""
    try:
        hints = graph_traced_values(gm)
        if not hints:  # every size Dynamo gave a symbol it has since specialized (kimi_linear at 64 tokens:
            # its chunk padding of 0 guards t % 64 == 0 and its one chunk t <= 64): a graph for one size
            return BucketAnalysis(ok=False, one_size=True, reason="Dynamo specialized every size of the graph")
        # sizes Dynamo traced at 0 or 1 are constants, as it makes such sizes itself (an int argument
        # made symbolic, transformers' logits_to_keep=0); more where the analysis needs them
        spec = {s: v for s, v in hints.items() if v in (0, 1)}
        spec.update((boundary_layouts or {}).get(SPECIALIZED, {}))  # a backward takes its forward's
        shape_env = graph_shape_env(gm)
        admits = symbol_admits(shape_env, hints, hints)  # the sizes the graph's guards admit
        assume_products(guarded_products(shape_env, [  # each view as its input's and its output's sizes
            tuple(shape_key(v) for v in (n.args[0].meta["val"], n.meta["val"])) for n in gm.graph.nodes
            if n.target in _VIEWS and isinstance(n.args[0], torch.fx.Node)
            and isinstance(n.args[0].meta.get("val"), torch.Tensor)]), shape_env)
        only = {s: v for s, v in hints.items() if s in admits and admits[s].only(v)}  # checked too
        spec.update(only)
        if only and spec.keys() >= hints.keys():  # Dynamo traced it for one size: exact is one executable
            return BucketAnalysis(ok=False, one_size=True, reason=f"its guards admit one size only: {hints}")
        blocks, first = False, None  # inputs of merged sizes: a prefix, then (refused so) blocks
        for _ in range(10):
            try:
                result = _analyze(gm, boundary_layouts or {}, buckets, spec, hints, admits, blocks)
                result.specialized, result.admits = dict(spec), {s: admits[s] for s in result.symbols if s in admits}
                result.multiples = size_multiples(result.symbols, hints)
                return result
            except Specialize as more:
                spec[more.symbol] = more.value
            except NotBucketable as exc:
                if blocks or not any(merged_input(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"):
                    raise (first or exc) from None
                blocks, first = True, exc
        raise NotBucketable(f"sizes needed at their traced values past {sorted(spec, key=str)}")
    except NotBucketable as exc:
        return BucketAnalysis(ok=False, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - an analysis bug must cost bucketing, never the call
        return BucketAnalysis(ok=False, reason=f"the padding analysis failed ({type(exc).__name__}: {exc})")
    finally:
        end_assumptions()  # sizes outside an analysis are taken as they are


def _analyze(gm, boundary_layouts, buckets, spec, hints, admits, blocks=False) -> BucketAnalysis:
    result = BucketAnalysis(ok=True)
    assumed = assume_equal_sizes()
    invariant = assume_invariant_sizes(buckets, admits)
    specialize_sizes(spec, hints)
    products = assumed_products()
    layouts: dict = {}  # node -> Layout (tensor) or list of Layouts (tuple outputs)
    facts: dict = {}  # node -> what its real values are known to be (values)
    size_symbols: set = set()
    bindings: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for pos, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            saved = boundary_layouts.get(node.name)
            if saved is None and node.name.startswith("tangents"):  # any layout is exact for an input at
                # its true sizes: the one its forward output had is the one the backward computes in
                saved = next((lay for shape, lay in boundary_layouts.get(OUTPUTS, ()) if shape == shape_key(val)), None)
            if saved is not None and len(saved) == val.dim():
                lay = saved
            else:  # every input comes at its true sizes (outputs are sliced back): real is a prefix of each
                lay = layout_of_shape(val.shape)  # dim, one atom however merged (2 t: the padding after 2 t)
                lay = tuple(merged_input(val, a) for a in lay) if blocks else lay
            for size in val.shape:  # a length is bucketed where the layout writes it as a constant too
                if isinstance(size, torch.SymInt):
                    size_symbols |= size_expr(size.node.expr).free_symbols - spec.keys()  # specialized: not bucketed
            for d, atoms in enumerate(lay):
                for a in atoms:
                    size_symbols |= a.free_symbols
                    if a.is_Symbol and a not in bindings and len(atoms) == 1:
                        bindings[a] = (pos, d)
            layouts[node] = lay
            result.input_layouts[pos] = lay
            if boundary_layouts.get(("fact", node.name)) is not None:
                facts[node] = boundary_layouts[("fact", node.name)]
                if inexact(facts[node]):
                    result.position_inputs[pos] = facts[node].atoms
        elif isinstance(val, torch.SymInt):
            result.sym_inputs[pos] = size_expr(val.node.expr)
            if val.node.expr.is_Symbol:
                bindings.setdefault(val.node.expr, (pos, None))
                if val.node.expr not in spec and val.node.expr not in products and \
                        val.node.expr in graph_size_symbols(gm):  # an int a shape is
                    size_symbols.add(val.node.expr)  # made of (a resumed frame's length: arange(t)): bucketed
    for pos, node in enumerate(placeholders):  # where a specialized size (checked at each call) or a product comes from
        val = node.meta.get("val")
        for d, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt) and (size.node.expr in spec or size.node.expr in products):
                bindings.setdefault(size.node.expr, (pos, d))
    result.checks += [(x, sympy.Integer(v)) for x, v in spec.items() if x in bindings]
    symbols = sorted(size_symbols, key=str)
    missing = [s for s in symbols if s not in bindings]
    if missing:
        raise NotBucketable(f"no input gives the true value of {missing}")
    result.symbols = tuple(symbols)
    result.bindings = dict(bindings)
    # a product (guarded_products) is bound for the views rebuilt at true sizes; its factors key
    result.value_symbols = tuple(sorted((s for s in bindings if s not in size_symbols | products.keys()), key=str))
    if not symbols:
        raise NotBucketable("no symbolic tensor size to bucket")

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        val = node.meta.get("val")
        if not isinstance(val, (torch.Tensor, tuple, list)) or node.op != "call_function":
            # sizes and other host values: shape uses take the bucket, value uses are rewritten below
            if node.op == "call_function" and isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                continue
            if node.target is operator.getitem:
                continue
            if node.target in _ASSERTS and not _padded_layout(_tensor_layout(layouts, node.args[0]) or ((),)) \
                    and not inexact(facts.get(node.args[0])):
                continue  # an assert on an unpadded, exact value (a 0-d reduction): the value eager asserts on
            raise NotBucketable(f"node {node.name} ({node.target}) is not supported under bucketing")
        if node.target is operator.getitem:
            parent = layouts.get(node.args[0])
            layouts[node] = parent[node.args[1]] if isinstance(parent, list) else None
            if isinstance(facts.get(node.args[0]), list) and facts[node.args[0]][node.args[1]] is not None:
                facts[node] = facts[node.args[0]][node.args[1]]
            continue
        try:
            check_reads(node, facts)
            _analyze_node(node, layouts, result, facts)
        except Specialize:
            raise
        except NotBucketable as exc:
            raise NotBucketable(_at_node(node, str(exc))) from None
        fact = facts.get(node) or value_fact(node, facts)
        if fact is not None:
            facts[node] = fact

    result.checks += [(a, b) for a, b in assumed]
    result.checks += [(a, SAME_AT_BUCKET) for a in invariant]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    for k, value in enumerate(outs):
        result.output_facts.append(facts.get(value) if isinstance(value, torch.fx.Node) else None)
        if isinstance(result.output_facts[-1], Positions) and inexact(result.output_facts[-1]):
            result.position_outputs[k] = result.output_facts[-1].atoms  # handed out as eager's positions
        elif inexact(result.output_facts[-1]):
            raise NotBucketable(f"output {value.name} is computed from positions in the padded layout (a sort's "
                                "indices along a padded dim), not eager's values")
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                result.output_layouts.append(layouts[value])
            elif isinstance(val, (torch.SymInt, torch.SymFloat)):
                result.output_layouts.append(SymOutput(size_expr(val.node.expr)))
            else:
                result.output_layouts.append(None)
            result.output_names.append(value.name)
        else:
            result.output_layouts.append(None)
            result.output_names.append(None)
    return result


def _at_node(node, reason: str) -> str:
    """``reason`` naming the node it is about and the user's line that made it."""
    from ..lowering.diagnostics import user_source_line

    if not reason.startswith(f"{node.name}:"):
        reason = f"{node.name} ({node.target}): {reason}"
    line = user_source_line(node)
    return f"{reason} [{line}]" if line else reason


def _tensor_layout(layouts, arg):
    if isinstance(arg, torch.fx.Node):
        lay = layouts.get(arg)
        if isinstance(lay, tuple):
            return lay
    return None


def _analyze_node(node, layouts, result, facts):
    target = node.target
    val = node.meta["val"]
    rewrite = Rewrite()
    args = list(node.args)
    tensor_args = [(i, a, _tensor_layout(layouts, a)) for i, a in enumerate(args) if _tensor_layout(layouts, a) is not None]
    tensor_args = adopt_uniform(tensor_args, facts)
    adopted = {a: lay for _, a, lay in tensor_args}
    list_args = [(i, a) for i, a in enumerate(args) if isinstance(a, (list, tuple))
                 and any(_tensor_layout(layouts, x) is not None for x in a)]
    any_padded = any(_padded_layout(lay) for _, _, lay in tensor_args) or any(
        _padded_layout(_tensor_layout(layouts, x)) for _, a in list_args for x in a if _tensor_layout(layouts, x))

    # sizes used as values (a mean's divisor, x * n): feed the true value at run time
    schema = _schema_args(node)
    for i, a in enumerate(args):
        if _is_sym_node(a) and target not in _CREATION and target not in _VIEWS and target not in (
                aten.slice.Tensor, aten.expand.default, aten.narrow.default, aten.select.int):
            if i < len(schema) and str(schema[i].type) in ("Scalar", "Tensor", "float", "number"):
                rewrite.true_values[i] = size_expr(a.meta["val"].node.expr)
    if target is aten.scalar_tensor.default and _is_sym_node(args[0]):  # torch.tensor(n): a value
        rewrite.true_values[0] = size_expr(args[0].meta["val"].node.expr)

    # ops on unpadded tensors keep their layout, except those whose position arguments (a slice's
    # start, a select's index) could be sizes: at the bucket those read the bucket's value
    plain = not any_padded and target not in _CREATION and target not in _LIKE and target not in _POSITIONED
    if isinstance(val, (tuple, list)) and plain and all(isinstance(v, torch.Tensor) for v in val):
        layouts[node] = [_fresh_or_inherit(v, tensor_args) for v in val]
    elif isinstance(val, torch.Tensor) and plain:
        layouts[node] = _fresh_or_inherit(val, tensor_args)
    elif target in _CREATION:
        layouts[node] = layout_of_shape(val.shape)
    elif target in _LIKE:
        layouts[node] = tensor_args[0][2]
    elif _is_pointwise(target) and isinstance(val, (tuple, list)):  # frexp: (mantissa, exponent)
        layouts[node] = [_broadcast([lay for _, _, lay in tensor_args], v.shape) for v in val]
    elif _is_pointwise(target):
        layouts[node] = _broadcast([lay for _, _, lay in tensor_args], val.shape)
    elif target in _VIEWS:
        layouts[node] = _regroup(tensor_args[0][2], val.shape)
    elif target is aten.expand.default:
        src = tensor_args[0][2]
        nd = len(val.shape)
        lay = []
        for d in range(nd):
            k = d - (nd - len(src))
            if k >= 0 and _dim_expr(src[k]) != 1:
                lay.append(src[k])
            else:
                lay.append(layout_of_shape([val.shape[d]])[0])
        layouts[node] = tuple(lay)
    elif target is aten.repeat.default:
        # repeat r times along dim k: out[j * n + i] = x[i], a row-major (r, n) whose real region is
        # each copy's prefix: the layout (r, *atoms of k); new leading dims are fresh
        src, reps = tensor_args[0][2], list(args[1])
        lead = len(reps) - len(src)
        if not all(isinstance(r, int) for r in reps):
            raise NotBucketable(f"{node.name}: repeat by symbolic counts {reps}")
        lay = list(layout_of_shape(val.shape[:lead]))
        for k, atoms in enumerate(src):
            r = reps[lead + k]
            lay.append(atoms if r == 1 else _norm((sympy.Integer(r),) + tuple(atoms)) if _padded(atoms)
                       else layout_of_shape([val.shape[lead + k]])[0])
        layouts[node] = tuple(lay)
    elif target is aten.view_as_real.default:  # a trailing (real, imaginary) pair
        layouts[node] = tuple(tensor_args[0][2]) + (layout_of_shape([2])[0],)
    elif target is aten.view_as_complex.default and not _padded(tensor_args[0][2][-1]):
        layouts[node] = tuple(tensor_args[0][2][:-1])
    elif target is aten.permute.default:
        src = tensor_args[0][2]
        layouts[node] = tuple(src[p % len(src)] for p in args[1])
    elif target is aten.transpose.int:
        src = list(tensor_args[0][2])
        a, b = args[1] % len(src), args[2] % len(src)
        src[a], src[b] = src[b], src[a]
        layouts[node] = tuple(src)
    elif target is aten.t.default:
        layouts[node] = tuple(reversed(tensor_args[0][2]))
    elif target is aten.unsqueeze.default:
        src = list(tensor_args[0][2])
        d = args[1] % (len(src) + 1)
        layouts[node] = tuple(src[:d] + [()] + src[d:])
    elif target in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
        layouts[node] = _regroup(tensor_args[0][2], val.shape)
    elif target is aten.slice.Tensor:
        layouts[node] = slice_layout(node, tensor_args[0][2], rewrite)
    elif target is aten.select.int:
        layouts[node] = select_layout(node, tensor_args[0][2], rewrite)
    elif target is aten.cat.default:
        # a piece of zeros takes its neighbours' layout (inkling's router backward: cat([grad, zeros]))
        pieces = adopt_uniform([(k, x, _tensor_layout(layouts, x)) for k, x in enumerate(args[0])
                                 if _tensor_layout(layouts, x) is not None], facts)
        adopted = {x: lay for _, x, lay in pieces}
        layouts[node] = cat_layout(node, lambda a: adopted.get(a, _tensor_layout(layouts, a)), rewrite)
    elif target is aten.convolution.default:
        layouts[node] = convolution_layout(node, lambda a: _tensor_layout(layouts, a), rewrite)
    elif target is aten.convolution_backward.default:
        layouts[node] = convolution_backward_layout(node, lambda a: _tensor_layout(layouts, a), rewrite)
    elif target in _REDUCTIONS:
        _reduction(node, layouts, tensor_args, rewrite)
    elif target is aten.linalg_vector_norm.default:
        _vector_norm(node, layouts, tensor_args, rewrite)
    elif target in (aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int):
        layouts[node] = split_layout(node, tensor_args[0][2])
    elif target in _ROW_REDUCTIONS:
        probe = Rewrite()
        _reduction_layout(node, layouts, tensor_args, probe)
        if probe.masks:
            raise NotBucketable(f"{node.name}: {target} over a padded dim")
    elif target in _SOFTMAX:
        src = tensor_args[0][2]
        d = args[1] % len(src)
        if _padded(src[d]):
            rewrite.masks.append((0, [(d, src[d])], "-inf"))
        layouts[node] = src
    elif target is aten._softmax_backward_data.default:
        src = tensor_args[0][2]
        d = args[2] % len(src)
        if _padded(src[d]):
            rewrite.masks.append((0, [(d, src[d])], 0))
            rewrite.masks.append((1, [(d, src[d])], 0))
        layouts[node] = _broadcast([tensor_args[0][2], tensor_args[1][2]], val.shape)
    elif target in (aten.mm.default, aten.bmm.default):
        a, b = tensor_args[0][2], tensor_args[1][2]
        if (_padded(a[-1]) or _padded(b[-2])) and not agree(a[-1], b[-2]):
            raise NotBucketable(f"{node.name}: contraction operands padded differently")
        if _padded(a[-1]):
            rewrite.masks.append((0, [(len(a) - 1, a[-1])], 0))
            rewrite.masks.append((1, [(len(b) - 2, b[-2])], 0))
        batch = ()
        if target is aten.bmm.default:
            batch = (_broadcast([(a[0],), (b[0],)], val.shape[:1])[0],)
        layouts[node] = batch + (a[-2], b[-1])
    elif target is aten.addmm.default:
        bias, a, b = (tensor_args[k][2] for k in range(3))
        if _padded(a[-1]):
            rewrite.masks.append((1, [(1, a[-1])], 0))
            rewrite.masks.append((2, [(0, b[0])], 0))
        layouts[node] = _broadcast([bias, (a[0], b[1])], val.shape)
    elif target is aten.embedding.default:
        weight, idx = tensor_args[0][2], tensor_args[1][2]
        if _padded(weight[0]):
            raise NotBucketable(f"{node.name}: embedding table with a padded number of rows")
        layouts[node] = tuple(idx) + tuple(weight[1:])
    elif target is aten.index_select.default:
        src, idx = tensor_args[0][2], tensor_args[1][2]
        d = args[1] % len(src)
        layouts[node] = tuple(src[:d]) + (idx[0],) + tuple(src[d + 1:])
    elif target in _ROW_LOCAL_INDEXING:
        layouts[node] = row_local_layout(node, lambda a: adopted.get(a) or _tensor_layout(layouts, a), facts, rewrite)
    elif target is aten.index.Tensor:
        index_layouts = [_tensor_layout(layouts, i) for i in args[1] if i is not None]
        layouts[node] = index_layout(node, tensor_args[0][2], index_layouts, facts)
    elif target in (aten.index_put.default, aten.index_put_.default):
        layouts[node] = index_put_layout(node, lambda a: _tensor_layout(layouts, a), facts, rewrite)
    elif target in (aten.sort.default, aten.sort.stable) and any(
            _padded(tensor_args[0][2][d]) for d in _op_dims(node, tensor_args[0][2])):
        layouts[node], facts[node] = sort_layout(node, tensor_args[0][2], rewrite)
    elif target is aten.topk.default and any(_padded(tensor_args[0][2][d]) for d in _op_dims(node, tensor_args[0][2])):
        layouts[node], facts[node] = topk_layout(node, tensor_args[0][2], rewrite, result.checks)
    elif target in (aten.nll_loss_forward.default, aten.nll_loss_backward.default):
        t_index = 1 if target is aten.nll_loss_forward.default else 2
        ignore = args[t_index + 3] if len(args) > t_index + 3 else -100
        tgt = tensor_args[[i for i, _, _ in tensor_args].index(t_index)][2]
        rewrite.masks.append((t_index, [(k, a) for k, a in enumerate(tgt) if _padded(a)], ("value", ignore)))
        layouts[node] = [(), ()] if target is aten.nll_loss_forward.default else tensor_args[1][2]
    elif target in _SCANS:
        layouts[node] = prefix_scan_layout(node, tensor_args[0][2], rewrite)
    elif target is scan_op():
        layouts[node] = associative_scan_layout(node, lambda a: _tensor_layout(layouts, a),
                                                getattr(node.graph.owning_module, node.args[0].target))
    elif target is aten.constant_pad_nd.default:
        layouts[node] = constant_pad_layout(node, tensor_args[0][2], rewrite, result.checks)
    elif target in (aten.flip.default, aten.sort.default, aten.sort.stable, aten.topk.default, aten.roll.default):
        dims = _op_dims(node, tensor_args[0][2])
        if any(_padded(tensor_args[0][2][d]) for d in dims):
            raise NotBucketable(f"{node.name}: {target} moves data across a padded dim")
        # a dim keeps its layout where its size does (topk's k is a fresh size: not padded, checked above)
        layouts[node] = [_fresh_or_inherit(v, tensor_args[:1]) for v in val] if isinstance(val, (tuple, list)) \
            else _fresh_or_inherit(val, tensor_args[:1])
    else:
        raise NotBucketable(f"{node.name}: {target} on a padded tensor is not known to be padding-safe")
    if rewrite.masks or rewrite.true_values or rewrite.mean_dims or rewrite.pad_fix or rewrite.index_wrap \
            or rewrite.sort_last or rewrite.cat_pieces or rewrite.read_at or rewrite.scratch:
        result.rewrites[node.name] = rewrite


def _op_dims(node, layout):
    t = node.target
    nd = len(layout)
    if t is aten.flip.default:
        return [d % nd for d in node.args[1]]
    if t in (aten.sort.default, aten.sort.stable):
        return [(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)) % nd]
    if t is aten.topk.default:
        return [(node.args[2] if len(node.args) > 2 else -1) % nd]
    if t is aten.roll.default:
        return [d % nd for d in (node.args[2] if len(node.args) > 2 else range(nd))]
    return list(range(nd))


def _fresh_or_inherit(val, tensor_args):
    """The input's layout in every dim whose size is the input's, a fresh one elsewhere."""
    if len(tensor_args) == 1 and tensor_args[0][2] is not None and len(tensor_args[0][2]) == val.dim():
        return tuple(a if _dim_expr(a) == _expr(s) else layout_of_shape([s])[0]
                     for a, s in zip(tensor_args[0][2], val.shape))
    return layout_of_shape(val.shape)


def _is_pointwise(target) -> bool:
    return target in _POINTWISE_EXTRA or torch.Tag.pointwise in getattr(target, "tags", ())
