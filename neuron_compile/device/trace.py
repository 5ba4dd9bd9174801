"""One eager op at one signature, traced into a functional FX graph over storage buffers.

The graph's inputs are the buffers of the storages the op reads (in the shape
each buffer has) and the 0-d host tensors it takes as scalars. Inside, each
tensor argument is rebuilt from its storage: the buffer itself when the tensor
is the whole buffer, else ``as_strided`` of the flattened buffer. The op runs
under ``torch.func.functionalize`` and ``make_fx`` with the compiled path's
decomposition table, so an in-place op on a view becomes a scatter into its
storage, and the graph returns the op's fresh results followed by the new
contents of every storage the op wrote. A fresh result gets the strides CPU
gives it (the op's Meta kernel: ``channels_last`` in, ``channels_last`` out);
the graph returns it in that memory order, the order its storage holds.
The few ops functionalization cannot
take (fused Adam) run as ATen code instead (``optim.REWRITES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx

from ._torch_hooks import plain_dispatch
from .optim import REWRITES
from .storage import storage_extent

aten = torch.ops.aten

# a view's storage offset in its signature part (``opkernel.Leaves``): an input of the executable, read at
# run time (a view of fewer elements than its storage, which the op does not write)
RUNTIME = "offset"


class OpTraceError(RuntimeError):
    """The op cannot be one executable here (its output shapes depend on data, or it returns a number)."""


@dataclass
class Traced:
    gm: torch.fx.GraphModule
    inputs: list  # per graph input: ("slot", k), ("host", k) or ("float", k, dtype)
    fresh: list  # per fresh output: (shape, dtype, strides: CPU's, or None for contiguous)
    written: list  # slots written, in output order after the fresh outputs
    returns: tuple  # how the op's result is rebuilt (opkernel.rebuild)
    resized: dict | None = None  # out= arguments the op resizes: leaf -> shape (then no graph)
    by_value: bool = False  # its float arguments are baked in: one kernel per value


def _without_data(op, args, kwargs, leaves, device: str):
    """The op run on data-free copies of the call's tensors (same sizes, strides and offsets) made on
    ``device`` ("meta", or "cpu" under a FakeTensorMode): (the copies, the result)."""
    from .storage import storage_extent

    def copy(i):
        t = leaves.tensors[i]
        extent = storage_extent(t.shape, t.stride(), t.storage_offset())
        return torch.empty(max(extent, 1), dtype=t.dtype, device=device).as_strided(
            t.shape, t.stride(), t.storage_offset())

    copies = [copy(i) for i in range(len(leaves.tensors))]
    new_args, new_kwargs = _replace_tensors(args, kwargs, lambda i: copies[i])
    return copies, op(*new_args, **new_kwargs)


def out_resizes(op, args, kwargs, leaves, written_positions: list[int]) -> dict:
    """The written (``out=``) arguments this call resizes, found by running the op's Meta kernel."""
    if not written_positions:
        return {}
    metas, _ = _without_data(op, args, kwargs, leaves, "meta")
    return {i: tuple(metas[i].shape) for i in written_positions if metas[i].shape != leaves.tensors[i].shape}


def fresh_strides(op, args, kwargs, leaves) -> list | None:
    """The strides CPU gives each fresh result of the op, in ``_describe``'s order (``channels_last`` in,
    ``channels_last`` out): the op on fake CPU tensors, whose Meta kernels pick a layout by device, as
    CPU's and CUDA's kernels differ (a convolution). None where it has no Meta kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with plain_dispatch(), FakeTensorMode(allow_fallback_kernels=False):
            fakes, result = _without_data(op, args, kwargs, leaves, "cpu")
            fresh: list = []
            _describe(result, fakes, fresh)
            strides = [tuple(t.stride()) for t in fresh]
    except Exception:  # no Meta kernel (or one that cannot take this call): contiguous results, as before
        return None
    source = _LAYOUT_OF_SELF.get(op)
    if source is not None and len(strides) == 1:  # CPU's kernel lays the result out as ``self``, its Meta not
        from torch._prims_common import suggest_memory_format

        fmt = suggest_memory_format(leaves.tensors[source]) if source < len(leaves.tensors) else None
        if fmt is not None and fmt != torch.contiguous_format:
            strides = [torch.empty(fresh[0].shape, device="meta", memory_format=fmt).stride()]
    return strides


def _pads() -> dict:
    """Ops whose CPU kernel gives the result ``self``'s memory format (``suggest_memory_format``) where
    their Meta kernel gives a contiguous one: op -> the position of ``self`` among the call's tensors."""
    aten = torch.ops.aten
    table = {}
    for name in ("reflection_pad2d", "reflection_pad3d", "replication_pad2d", "replication_pad3d"):
        table[getattr(aten, name).default] = 0
        table[getattr(aten, name + "_backward").default] = 1  # (grad_output, self, padding)
    return table


_LAYOUT_OF_SELF = _pads()


def _from_memory_order(part, buffer_shape) -> list | None:
    """When the tensor ``part`` describes is its whole storage laid out in another order (a ``channels_last``
    result, whose buffer holds it in memory order): the permutation that turns the buffer into the tensor."""
    from .storage import memory_order

    _, shape, stride, offset = part[:4]
    order = memory_order(shape, stride)
    if offset or order is None or tuple(buffer_shape) != tuple(shape[d] for d in order):
        return None
    inverse = [0] * len(order)
    for position, d in enumerate(order):
        inverse[d] = position
    return inverse


def _layout(shape, stride) -> tuple:
    """(the strides a fresh result gets, the permutation its buffer is stored in): CPU's strides when they
    lay the result out densely, else contiguous ones (None). The buffer holds the elements in memory order
    (``storage.memory_order``; None: as the result is)."""
    from .storage import contiguous_strides, dense_order, memory_order

    shape = tuple(shape)
    if stride is None or stride == contiguous_strides(shape) or len(stride) != len(shape):
        return None, None
    if 0 in shape:
        return stride, None
    if dense_order(shape, stride) is None:
        return None, None
    return stride, memory_order(shape, stride)


def runtime_float(value) -> bool:
    """A Python float argument that becomes an input of the executable instead of a constant in it
    (learning rates, bias corrections: values that change from call to call). Integral values (1.0,
    2.0...) and non-finite ones stay constants: they often select a different computation."""
    return type(value) is float and math.isfinite(value) and not value.is_integer()


def _replace_tensors(args, kwargs, fn, floats=None):
    """args and kwargs with every tensor replaced by ``fn(i)``, i counting tensors as ``opkernel.Leaves``
    does, and (with ``floats``) the k-th runtime float by ``floats[k]``."""
    counters = (iter(range(1 << 30)), iter(range(1 << 30)))
    new_args = [_replaced(v, fn, floats, counters) for v in args]
    new_kwargs = {k: _replaced(v, fn, floats, counters) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _replaced(value, fn, floats, counters):
    """``_replace_tensors`` on one value (a function of the module's: a closure that calls itself is a
    reference cycle, which kept ``fn``'s tensors until Python's cyclic collector ran)."""
    if isinstance(value, torch.Tensor):
        return fn(next(counters[0]))
    if isinstance(value, (list, tuple)):
        return type(value)(_replaced(v, fn, floats, counters) for v in value)
    if floats is not None and runtime_float(value):
        return floats[next(counters[1])]
    return value


def trace_op(op, args, kwargs, leaves, written_positions: list[int], bake_floats: bool = False,
             wide: bool = False, padded: dict | None = None, body=None) -> Traced:
    """``wide``: decompose with every decomposition torch registers too (under ours), for an op whose own
    graph did not lower: eager ops reach us as backend ops (``upsample_bilinear2d``,
    ``hardshrink_backward``...) that a compiled graph never holds. ``padded`` (leaf -> shape) and ``body``
    (``lengths``): those leaves are read at bucket sizes and ``body(views, sizes)`` computes the results
    in place of the op, ``sizes`` a last int64 input of the graph (the true sizes)."""
    try:
        resized = out_resizes(op, args, kwargs, leaves, written_positions)
    except NotImplementedError as exc:
        if "no fake impl or Meta kernel" in str(exc):  # e.g. _cummax_helper: CPU's kernel is all there is
            raise OpTraceError(str(exc).splitlines()[0]) from exc
        raise
    if resized:
        return Traced(None, [], [], [], ("const", None), resized)
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..decompositions import decomposition_table
    from ..lowering.runtime_offsets import offset_slice

    parts = [p for p in leaves.parts if isinstance(p, tuple) and p and (p[0] == "host" or isinstance(p[0], torch.dtype))]
    # leaf i -> its part (the tensors' parts, in order)
    tensor_parts = [p for p in leaves.parts if isinstance(p, tuple) and len(p) >= 2
                    and (p[0] == "host" or isinstance(p[0], torch.dtype))]
    assert len(tensor_parts) == len(leaves.tensors), (tensor_parts, len(leaves.tensors))
    del parts

    # graph inputs: one per storage slot, then one per host scalar
    example = []
    inputs = []
    slot_input: dict[int, int] = {}
    host_input: dict[int, int] = {}
    host_index = offset_index = 0
    leaf_source = []
    for position, part in enumerate(tensor_parts):
        if part[0] == "host":
            host_input[position] = len(example)
            inputs.append(("host", host_index))
            example.append(torch.empty((), dtype=part[1]))
            leaf_source.append(("host", len(example) - 1))
            host_index += 1
            continue
        slot = part[2] if len(part) == 3 else part[4]
        if slot not in slot_input:
            data = leaves.datas[slot]
            shape = tuple(data.buffer.shape) if data.buffer is not None else (data.numel,)
            slot_input[slot] = len(example)
            inputs.append(("slot", slot))
            example.append(torch.empty(shape, dtype=data.dtype))
        if len(part) != 3 and part[3] == RUNTIME:  # its offset is the next ("offset", k) input
            leaf_source.append(("slot", slot_input[slot], part, len(example)))
            inputs.append(("offset", offset_index))
            example.append(torch.empty((), dtype=torch.int64))
            offset_index += 1
            continue
        leaf_source.append(("slot", slot_input[slot], part))

    if body is not None:
        inputs.append(("sizes", 0))
        example.append(torch.empty((len(body.symbols),), dtype=torch.int64))
    written_slots = []
    for position in written_positions:
        source = leaf_source[position]
        if source[0] == "slot" and source[1] not in written_slots:
            written_slots.append(source[1])

    structure = {}

    slot_views = {}
    for source in leaf_source:
        if source[0] == "slot" and len(source[2]) != 3:
            slot_views.setdefault(source[1], True)

    def run(*bases):
        # a written storage read through as_strided views is worked on as a flat copy: functionalization
        # can write through one as_strided view of a tensor, not through a view of a view
        work, work_shapes = {}, {}
        for index in written_slots:
            if index in slot_views:
                work[index] = aten.clone.default(bases[index].reshape(-1))
        views = []
        for source in leaf_source:
            if source[0] == "host":
                views.append(bases[source[1]])
                continue
            index, part = source[1], source[2]
            base = bases[index]
            if padded and len(views) in padded and index in work:  # written: a bucket's whole storage
                views.append(work[index].view(padded[len(views)]))
                work_shapes[index] = padded[len(views) - 1]
            elif padded and len(views) in padded:
                views.append(_padded_view(base, part, padded[len(views)], bases, source, offset_slice))
            elif index in work:
                flat = work[index]
                views.append(flat.view(base.shape) if len(part) == 3 else
                             aten.as_strided.default(flat, part[1], part[2], part[3]))
            elif len(part) == 3:
                views.append(base)
            elif part[3] == RUNTIME:  # the view's elements from its run-time offset, then its sizes and strides
                piece = offset_slice(base, bases[source[3]], storage_extent(part[1], part[2]))
                views.append(aten.as_strided.default(piece, part[1], part[2], 0))
            elif (inverse := _from_memory_order(part, base.shape)) is not None:
                views.append(base.permute(inverse))  # a transpose, not a gather
            else:
                flat = base.reshape(-1) if base.dim() != 1 else base
                views.append(aten.as_strided.default(flat, part[1], part[2], part[3]))
        new_args, new_kwargs = _replace_tensors(args, kwargs, lambda i: views[i], structure["floats"])
        result = (body(views, bases[-1]) if body is not None else REWRITES.get(op, op)(*new_args, **new_kwargs))
        fresh_values = []
        structure["returns"] = _describe(result, views, fresh_values)
        if strides is None or len(strides) != len(fresh_values):
            layouts = [(None, None)] * len(fresh_values)
        else:
            layouts = [_layout(v.shape, stride) for v, stride in zip(fresh_values, strides)]
        structure["fresh"] = [(tuple(v.shape), v.dtype, stride) for v, (stride, _) in zip(fresh_values, layouts)]
        # a result CPU lays out in another order (channels_last) comes out of the graph in memory order
        fresh_values = [v if order is None else v.permute(order).contiguous()
                        for v, (_, order) in zip(fresh_values, layouts)]
        written = tuple(work[i].view(work_shapes.get(i, bases[i].shape)) if i in work else bases[i]
                        for i in written_slots)
        return tuple(fresh_values) + written

    table = _wide_table() if wide else decomposition_table()
    strides = fresh_strides(op, args, kwargs, leaves) if body is None else None

    def trace(floats):
        structure["floats"] = floats
        try:
            with plain_dispatch():  # called inside DTensor's __torch_dispatch__, most keys are excluded
                gm = make_fx(torch.func.functionalize(run, remove="mutations_and_views"),
                             decomposition_table=table, tracing_mode="fake")(*example)
        except (DataDependentOutputException, DynamicOutputShapeException) as exc:
            raise OpTraceError(f"{type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:
            if "data-dependent" in str(exc) or "Data dependent" in str(exc) or "unbacked" in str(exc):
                raise OpTraceError(str(exc)) from exc
            raise
        except NotImplementedError as exc:
            if "no fake impl or Meta kernel" in str(exc):  # e.g. _cummax_helper: CPU's kernel is all there is
                raise OpTraceError(str(exc).splitlines()[0]) from exc
            raise
        for shape, _, _ in structure["fresh"]:
            if not all(isinstance(d, int) for d in shape):
                raise OpTraceError(f"its result has the data-dependent shape {shape}")
        _drop_input_copies(gm)
        return gm

    values = list(leaves.floats)
    by_value = False
    if bake_floats:
        by_value = bool(values)
        gm = trace(values or None)
    elif values:
        # trace at two stand-in values near the real ones: where the graphs differ only by those values,
        # in places that take a runtime scalar, the value becomes an input; anything else bakes it in
        first = [v * (1 + 0.0137 * (k + 1)) for k, v in enumerate(values)]
        second = [v * (1 + 0.0291 * (k + 1)) for k, v in enumerate(values)]
        gm = trace(first)
        sites = _float_sites(gm, trace(second), first, second)
        if sites is None:
            by_value = True
            gm = trace(values)
        else:
            inputs = inputs + _floats_to_inputs(gm, sites)
    else:
        gm = trace(None)
    return Traced(gm, inputs, structure["fresh"], [inputs[i][1] for i in written_slots], structure["returns"],
                  by_value=by_value)


def _padded_view(base, part, shape, bases, source, offset_slice):
    """A tensor argument at its bucket ``shape`` (``lengths``): its true elements where the tensor has them,
    anything past them (zeros where the storage ends first; the bucketed graph masks what it reads)."""
    if len(part) == 3:  # the whole buffer, at its true sizes: zeros after its end along each dim
        pads = []
        for size, want in zip(reversed(part[1]), reversed(shape)):
            pads += [0, want - size]
        return aten.constant_pad_nd.default(base, pads, 0) if any(pads) else base
    stride = part[2]
    extent = storage_extent(shape, stride)
    flat = base.reshape(-1)
    if part[3] == RUNTIME:  # room for the bucket's extent from any offset the true view may have
        flat = aten.constant_pad_nd.default(flat, [0, extent], 0)
        piece = offset_slice(flat, bases[source[3]], extent)
        return aten.as_strided.default(piece, shape, stride, 0)
    if extent + part[3] > flat.numel():
        flat = aten.constant_pad_nd.default(flat, [0, extent + part[3] - flat.numel()], 0)
    return aten.as_strided.default(flat, shape, stride, part[3])


# ops whose second operand may be a 0-d tensor in place of a Python scalar, with the same result
# (a wrapped scalar computes in the tensor's dtype, as a 0-d tensor of that dtype does)
_SCALAR_SITES = {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor}


def _float_sites(gm, other, first: list, second: list):
    """Where graph ``gm`` (traced at ``first``) holds the k-th float and ``other`` (at ``second``) is
    otherwise identical: a list of (node, arg position, k), or None if the graphs differ elsewhere or a
    value sits where a tensor cannot replace it."""
    nodes, other_nodes = list(gm.graph.nodes), list(other.graph.nodes)
    if len(nodes) != len(other_nodes):
        return None
    index = {n: i for i, n in enumerate(nodes)}
    other_index = {n: i for i, n in enumerate(other_nodes)}
    sites = []

    def same(a, b, node, position):
        if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
            return isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and index[a] == other_index[b]
        if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
            return (type(a) is type(b) and len(a) == len(b)
                    and all(same(x, y, node, None) for x, y in zip(a, b)))
        if type(a) is float and type(b) is float and a != b:
            for k, (x, y) in enumerate(zip(first, second)):
                if a == x and b == y and position is not None:
                    sites.append((node, position, k))
                    return True
            return False
        return type(a) is type(b) and a == b

    for node, twin in zip(nodes, other_nodes):
        if node.op != twin.op or node.target != twin.target or node.kwargs.keys() != twin.kwargs.keys():
            return None
        if len(node.args) != len(twin.args):
            return None
        for position, (a, b) in enumerate(zip(node.args, twin.args)):
            if not same(a, b, node, position):
                return None
        for name in node.kwargs:
            if not same(node.kwargs[name], twin.kwargs[name], node, name if name == "alpha" else None):
                return None
    for node, position, _ in sites:
        if position == "alpha":  # add/sub(x, y, alpha=v) -> add/sub(x, mul(y, v)): torch-mlir's own lowering
            other = node.args[1] if len(node.args) > 1 else None
            val = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
            out = node.meta.get("val")
            if (node.target not in (aten.add.Tensor, aten.sub.Tensor) or not isinstance(val, torch.Tensor)
                    or not isinstance(out, torch.Tensor) or val.dtype != out.dtype or not val.is_floating_point()):
                return None
            continue
        if node.target is aten.full_like.default:  # a 0-d tensor of the value (lerp's Scalar weight)
            like, out = node.args[0].meta.get("val"), node.meta.get("val")
            if (position != 1 or not isinstance(like, torch.Tensor) or like.dim() != 0
                    or not isinstance(out, torch.Tensor) or out.dim() != 0 or not out.is_floating_point()):
                return None
            continue
        operand = node.args[1 - position] if position in (0, 1) and len(node.args) >= 2 else None
        val = operand.meta.get("val") if isinstance(operand, torch.fx.Node) else None
        if node.target not in _SCALAR_SITES or not isinstance(val, torch.Tensor) or not val.is_floating_point():
            return None
        if position == 0 and node.target is not aten.mul.Tensor:
            return None  # scalar - tensor, scalar / tensor, scalar + alpha * tensor: keep the value
    return sites


def _floats_to_inputs(gm, sites) -> list:
    """Replace each float site by a 0-d placeholder of its tensor operand's dtype; returns the new inputs."""
    graph = gm.graph
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    made: dict = {}
    inputs = []
    for node, position, k in sites:
        full = node.target is aten.full_like.default
        operand = node if full else node.args[1] if position == "alpha" else node.args[1 - position]
        dtype = operand.meta["val"].dtype
        if (k, dtype) not in made:
            with graph.inserting_after(last):
                placeholder = graph.placeholder(f"scalar_{k}_{str(dtype).removeprefix('torch.')}")
            placeholder.meta["val"] = operand.meta["val"].new_empty((), dtype=dtype)
            made[(k, dtype)] = last = placeholder
            inputs.append(("float", k, dtype))
        if full:  # the 0-d tensor of the value is the input itself
            node.replace_all_uses_with(made[(k, dtype)])
            graph.erase_node(node)
            continue
        if position == "alpha":
            with graph.inserting_before(node):
                scaled = graph.call_function(aten.mul.Tensor, (operand, made[(k, dtype)]))
            val = operand.meta["val"]
            with val.fake_mode:
                scaled.meta["val"] = val * made[(k, dtype)].meta["val"]
            node.args = (node.args[0], scaled) + tuple(node.args[2:])
            node.kwargs = {name: v for name, v in node.kwargs.items() if name != "alpha"}
            continue
        args = list(node.args)
        args[position] = made[(k, dtype)]
        if position == 0:  # tensor first: mul and add commute
            args = [args[1], args[0]] + args[2:]
        node.args = tuple(args)
    graph.lint()
    gm.recompile()
    return inputs


def _wide_table() -> dict:
    import torch._decomp

    from ..decompositions import decomposition_table

    return {**torch._decomp.decomposition_table, **decomposition_table()}


def _describe(result, views: list, fresh: list):
    """How the op's result maps to graph outputs: a fresh tensor, an argument handed back, a structure."""
    if isinstance(result, torch.Tensor):
        for index, view in enumerate(views):
            if result is view:
                return ("arg", index)
        fresh.append(result)
        return ("fresh", len(fresh) - 1)
    if isinstance(result, tuple):
        return ("tuple", tuple(_describe(r, views, fresh) for r in result))
    if isinstance(result, list):
        return ("list", [_describe(r, views, fresh) for r in result])
    if result is None or isinstance(result, (bool, int, float)):
        if isinstance(result, (bool, int, float)) and not isinstance(result, bool) and False:
            pass
        return ("const", result)
    raise OpTraceError(f"returns a {type(result).__name__}")


def _drop_input_copies(gm: torch.fx.GraphModule) -> None:
    """Functionalization copies mutated inputs back in place at the end; our graph returns them instead."""
    graph = gm.graph
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is aten.copy_.default and not node.users
                and node.args[0].op == "placeholder"):
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
