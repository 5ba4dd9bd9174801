"""One eager op at one signature, traced into a functional FX graph over storage buffers.

The graph's inputs are the buffers of the storages the op reads (in the shape
each buffer has) and the 0-d host tensors it takes as scalars. Inside, each
tensor argument is rebuilt from its storage: the buffer itself when the tensor
is the whole buffer, else ``as_strided`` of the flattened buffer. The op runs
under ``torch.func.functionalize`` and ``make_fx`` with the compiled path's
decomposition table, so an in-place op on a view becomes a scatter into its
storage, and the graph returns the op's fresh results followed by the new
contents of every storage the op wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

aten = torch.ops.aten


class OpTraceError(RuntimeError):
    """The op cannot be one executable here (its output shapes depend on data, or it returns a number)."""


@dataclass
class Traced:
    gm: torch.fx.GraphModule
    inputs: list  # per graph input: ("slot", k) or ("host", k)
    fresh: list  # per fresh output: (shape, dtype)
    written: list  # slots written, in output order after the fresh outputs
    returns: tuple  # how the op's result is rebuilt (ops._rebuild)
    resized: dict | None = None  # out= arguments the op resizes: leaf -> shape (then no graph)


def out_resizes(op, args, kwargs, leaves, written_positions: list[int]) -> dict:
    """The written (``out=``) arguments this call resizes, found by running the op's Meta kernel."""
    if not written_positions:
        return {}

    def meta(i):
        t = leaves.tensors[i]
        from .storage import storage_extent

        extent = storage_extent(t.shape, t.stride(), t.storage_offset())
        return torch.empty(max(extent, 1), dtype=t.dtype, device="meta").as_strided(
            t.shape, t.stride(), t.storage_offset())

    metas = [meta(i) for i in range(len(leaves.tensors))]
    new_args, new_kwargs = _replace_tensors(args, kwargs, lambda i: metas[i])
    op(*new_args, **new_kwargs)
    return {i: tuple(metas[i].shape) for i in written_positions if metas[i].shape != leaves.tensors[i].shape}


def _replace_tensors(args, kwargs, fn):
    """args and kwargs with every tensor replaced by ``fn(i)``, i counting tensors as ``ops._Leaves`` does."""
    counter = iter(range(1 << 30))

    def visit(value):
        if isinstance(value, torch.Tensor):
            return fn(next(counter))
        if isinstance(value, (list, tuple)):
            return type(value)(visit(v) for v in value)
        return value

    new_args = [visit(v) for v in args]
    new_kwargs = {k: visit(v) for k, v in kwargs.items()}
    return new_args, new_kwargs


def trace_op(op, args, kwargs, leaves, written_positions: list[int]) -> Traced:
    resized = out_resizes(op, args, kwargs, leaves, written_positions)
    if resized:
        return Traced(None, [], [], [], ("const", None), resized)
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..decompositions import decomposition_table

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
    host_index = 0
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
        leaf_source.append(("slot", slot_input[slot], part))

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
        work = {}
        for index in written_slots:
            if index in slot_views:
                work[index] = aten.clone.default(bases[index].reshape(-1))
        views = []
        for source in leaf_source:
            if source[0] == "host":
                views.append(bases[source[1]])
                continue
            _, index, part = source
            base = bases[index]
            if index in work:
                flat = work[index]
                views.append(flat.view(base.shape) if len(part) == 3 else
                             aten.as_strided.default(flat, part[1], part[2], part[3]))
            elif len(part) == 3:
                views.append(base)
            else:
                flat = base.reshape(-1) if base.dim() != 1 else base
                views.append(aten.as_strided.default(flat, part[1], part[2], part[3]))
        new_args, new_kwargs = _replace_tensors(args, kwargs, lambda i: views[i])
        result = op(*new_args, **new_kwargs)
        fresh_values = []
        structure["returns"] = _describe(result, views, fresh_values)
        structure["fresh"] = [(tuple(v.shape), v.dtype) for v in fresh_values]
        written = tuple(work[i].view(bases[i].shape) if i in work else bases[i] for i in written_slots)
        return tuple(fresh_values) + written

    try:
        gm = make_fx(torch.func.functionalize(run, remove="mutations_and_views"),
                     decomposition_table=decomposition_table(), tracing_mode="fake")(*example)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise OpTraceError(f"{type(exc).__name__}: {exc}") from exc
    except RuntimeError as exc:
        if "data-dependent" in str(exc) or "Data dependent" in str(exc) or "unbacked" in str(exc):
            raise OpTraceError(str(exc)) from exc
        raise
    for shape, _ in structure["fresh"]:
        if not all(isinstance(d, int) for d in shape):
            raise OpTraceError(f"its result has the data-dependent shape {shape}")
    _drop_input_copies(gm)
    return Traced(gm, inputs, structure["fresh"], [inputs[i][1] for i in written_slots], structure["returns"])


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
