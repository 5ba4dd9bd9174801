"""Functional collectives in a graph: compiled into the XLA executable, or run eagerly on torch.distributed.

Tensor parallel, DTensor redistributes, SimpleFSDP-style parameters, DDP's
python reducer under compiled autograd and a ``dist.all_reduce`` inside a
compiled function all reach us as ``_c10d_functional`` ops (an async
collective, then ``wait_tensor`` on its result). Torch-MLIR lowers none of
them; every one is known here before any lowering is tried, whatever the
``fallback`` option says, and takes one of two paths (``route``):

``compiled`` (the default when it can serve)
    the collective becomes a StableHLO collective in the graph's own
    module, which then runs as one executable of ``world`` replicas on a
    distributed PJRT CPU client (``runtime.collectives``); ``wait_tensor`` is
    the identity. Replica ``i`` is rank ``i``; a group is the world or a
    subgroup (a DeviceMesh dim's): ``replica_groups`` lists the rank's own
    group first and the rest of the world in groups of its size
    (``replica_groups``). The lowerings, for groups of ``W`` ranks:

    ================================  =======================================================
    all_reduce(x, op)                 ``stablehlo.all_reduce`` (sum, product, min, max; avg is
                                      the sum divided by W)
    all_gather_into_tensor(x, W)      ``stablehlo.all_gather`` along dim 0
    reduce_scatter_tensor(x, op, W)   ``stablehlo.reduce_scatter`` along dim 0
    all_to_all_single(x, None/equal)  ``stablehlo.all_to_all`` splitting and joining dim 0
    broadcast(x, src)                 ``all_gather`` then the src's slice: exact, and XLA CPU
                                      runs it where ``collective_broadcast`` is not lowered
    ================================  =======================================================

``eager``
    the node stays in an eager parent graph (``capture.fallback``) and runs
    on torch.distributed between compiled parts: issued as soon as its input
    exists, waited on just before its first use. This path serves what the
    compiled one can't, and says why in the compile report and ``explain``:
    torch.distributed not initialized, groups that do not split the world
    into equal parts, uneven all-to-all splits, a reduce op or dtype XLA has
    no reduction for, tensors of a device without PJRT buffers,
    ``collectives="eager"``.

World size, rank and each group's ranks go into the cache key
(``key_parts``).
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.fx

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
_REDUCERS = {"sum": "add", "avg": "add", "product": "multiply", "min": "minimum", "max": "maximum"}
_KINDS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all", "broadcast": "broadcast",
          "wait_tensor": "wait"}


def op_name(node: torch.fx.Node) -> str | None:
    """``all_reduce`` for a ``_c10d_functional.all_reduce.default`` node; None for any other node."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    return target._opname if target.namespace in NAMESPACES else None


def is_collective(node: torch.fx.Node) -> bool:
    return op_name(node) is not None


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(is_collective(n) for n in gm.graph.nodes)


# --------------------------------------------------------------------------- torch.distributed's view


def group_ranks(group_name: str) -> list[int]:
    """The global ranks of a process group named as functional collectives name it."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group  # private: checked by a test

    return dist.get_process_group_ranks(_resolve_process_group(group_name))


def replica_groups(group_name: str, world: int) -> list | str:
    """The ``replica_groups`` of a collective in ``group_name`` on this rank: the group's ranks (in
    group-rank order) first, then the rest of the world cut into groups of the same size; or why it
    cannot be compiled. XLA wants every replica in exactly one group, and only the replicas of the
    executing rank's own group meet: each rank names its own group, so no rank needs another's layout
    (a DeviceMesh dim's other groups need not even run the executable)."""
    ranks = group_ranks(group_name)
    layout = layout_of(ranks, world)
    return layout if layout is not None else (
        f"its group holds ranks {ranks}: {world} ranks do not split into groups of {len(ranks)}")


def layout_of(ranks: list, world: int) -> list | None:
    """``ranks`` first, then the rest of ``range(world)`` cut into groups of their size: replica groups
    that cover the world (``replica_groups``; the device's eager collectives too), or None where the
    world does not split so."""
    size = len(ranks)
    if not size or world % size or not set(ranks) <= set(range(world)):
        return None
    rest = [r for r in range(world) if r not in ranks]
    return [list(ranks)] + [rest[i:i + size] for i in range(0, len(rest), size)]


def _world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


# --------------------------------------------------------------------------- routing


def route(gm: torch.fx.GraphModule, mode: str = "compiled") -> dict[torch.fx.Node, str | None]:
    """Every collective node of ``gm`` -> None (compiled into the executable) or why it runs eagerly."""
    world = _world()
    routes: dict[torch.fx.Node, str | None] = {}
    for node in gm.graph.nodes:
        name = op_name(node)
        if name is None:
            continue
        if name == "wait_tensor":
            source = node.args[0]
            routes[node] = (routes.get(source, "it waits on a value no collective of this graph issued")
                            if isinstance(source, torch.fx.Node) else "it waits on no graph value")
            continue
        if mode == "eager":
            routes[node] = 'collectives="eager"'
        elif world is None:
            routes[node] = "torch.distributed is not initialized"
        else:
            routes[node] = _why_not_compiled(node, name, world[1])
    return routes


def _why_not_compiled(node: torch.fx.Node, name: str, world: int) -> str | None:
    if name not in _KINDS or node.target.namespace != "_c10d_functional":
        return f"{node.target.namespace}.{name} has no StableHLO lowering here"
    if world < 2:
        return "the world is one process"
    x, out = node.args[0], node.meta.get("val")
    if not isinstance(x, torch.fx.Node) or not isinstance(out, torch.Tensor):
        return "its input is not one tensor"
    value = x.meta.get("val")
    if value.device.type != "cpu" and value.device.type not in _devices_with_buffers():
        return f"its tensors are on {value.device} (no PJRT buffers behind them)"
    if value.dtype == torch.bool or value.is_complex():
        return f"XLA has no reduction of {value.dtype} here"
    layout = replica_groups(node.args[-1], world)
    if isinstance(layout, str):
        return layout
    size = len(layout[0])
    if name in ("all_reduce", "reduce_scatter_tensor"):
        op = node.args[1]
        if op not in _REDUCERS:
            return f"reduce op {op!r} has no StableHLO reduction"
        if op == "avg" and not value.is_floating_point():
            return "avg of integers"
    if name != "all_reduce" and value.dim() == 0:
        return f"{name} of a 0-d tensor"
    if name == "all_to_all_single":
        rows = value.shape[0]
        for splits in node.args[1:3]:
            if splits is not None and len(set(splits)) > 1:
                return f"uneven splits {list(splits)}"
        if rows % size:
            return f"{rows} rows do not split into {size} equal parts"
    return None


def _devices_with_buffers():
    """Devices whose tensors are PJRT buffers of this process (``runtime.executor.DEVICE_ADAPTERS``): their
    collectives compile too, the buffers crossing to the distributed client (``DistributedBridge``)."""
    from neuron_compile.runtime.executor import DEVICE_ADAPTERS

    return DEVICE_ADAPTERS


def collective_names(gm: torch.fx.GraphModule) -> list[str]:
    """The collectives a graph issues (its waits left out), in graph order."""
    return [op_name(n) for n in gm.graph.nodes if is_collective(n) and op_name(n) != "wait_tensor"]


def key_parts(gm: torch.fx.GraphModule) -> dict:
    """The cache-key part of a graph with collectives: world size, rank and each group's ranks."""
    groups = sorted({n.args[-1] for n in gm.graph.nodes if is_collective(n) and op_name(n) != "wait_tensor"})
    world = _world()
    if not groups or world is None:
        return {}
    return {"distributed": {"rank": world[0], "world": world[1], "groups": {g: group_ranks(g) for g in groups}}}


# --------------------------------------------------------------------------- lowering


def world_size(gm: torch.fx.GraphModule) -> int:
    world = _world()
    return world[1] if world and has_collectives(gm) else 1


def _region(op: str, scalar: str) -> str:
    """The reduction region of an ``all_reduce`` or ``reduce_scatter`` of ``op`` on elements of type ``scalar``."""
    return (f"({{\n      ^bb0(%lhs: {scalar}, %rhs: {scalar}):\n"
            f"        %r = stablehlo.{_REDUCERS[op]} %lhs, %rhs : {scalar}\n"
            f"        stablehlo.return %r : {scalar}\n    }})")


def _layout_attr(groups: list) -> str:
    rows = ", ".join("[" + ", ".join(map(str, group)) + "]" for group in groups)
    return f"replica_groups = dense<[{rows}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"


def _collective_lines(kind: str, value: str, result: str, fresh, source, tout: str, groups: list, type_of,
                      op: str | None = None, root: int = 0) -> list[str]:
    """StableHLO lines that compute SSA ``result`` (of type ``tout``) from ``value`` (shaped as ``source``,
    a tensor; meta will do) by one collective in the replica groups ``groups``: ``all_reduce`` or
    ``reduce_scatter`` of ``op`` (avg: the sum over the group's size), ``all_gather`` or ``all_to_all``
    (even splits) along dim 0, or ``broadcast`` of group rank ``root``'s rows (an all-gather, then its rows).
    ``fresh()`` names an intermediate. Compiled graphs' collectives (``lower_group``) and the device's eager
    ones (``eager_module``) both lower through here."""
    layout, size = _layout_attr(groups), len(groups[0])
    tin = type_of(torch.empty(source.shape, dtype=source.dtype, device="meta"))
    if kind == "all_gather":
        return [f'    {result} = "stablehlo.all_gather"({value}) {{all_gather_dim = 0 : i64, {layout}}} : '
                f"({tin}) -> {tout}"]
    if kind == "all_to_all":
        return [f'    {result} = "stablehlo.all_to_all"({value}) {{split_dimension = 0 : i64, concat_dimension = '
                f"0 : i64, split_count = {size} : i64, {layout}}} : ({tin}) -> {tout}"]
    if kind == "broadcast":
        shape = list(source.shape)
        gathered_type = type_of(torch.empty([shape[0] * size, *shape[1:]], dtype=source.dtype, device="meta"))
        gathered = fresh()
        start, limit = [root * shape[0]] + [0] * (len(shape) - 1), [(root + 1) * shape[0]] + shape[1:]
        return [f'    {gathered} = "stablehlo.all_gather"({value}) {{all_gather_dim = 0 : i64, {layout}}} : '
                f"({tin}) -> {gathered_type}",
                f'    {result} = "stablehlo.slice"({gathered}) {{start_indices = array<i64: '
                f"{', '.join(map(str, start))}>, limit_indices = array<i64: {', '.join(map(str, limit))}>, "
                f"strides = array<i64: {', '.join('1' for _ in shape)}>}} : ({gathered_type}) -> {tout}"]
    scalar = type_of(torch.empty((), dtype=source.dtype, device="meta"))
    extra = "scatter_dimension = 0 : i64, " if kind == "reduce_scatter" else ""
    reduced = fresh() if op == "avg" else result
    lines = [f'    {reduced} = "stablehlo.{kind}"({value}) {_region(op, scalar)} {{{extra}{layout}}} : '
             f"({tin}) -> {tout}"]
    if op == "avg":
        divisor = fresh()
        lines += [f"    {divisor} = stablehlo.constant dense<{float(size)}> : {tout}",
                  f"    {result} = stablehlo.divide {reduced}, {divisor} : {tout}"]
    return lines


def lower_group(sub: torch.fx.GraphModule, type_of) -> str:
    """StableHLO text (a module with ``@main``) of a group of compiled collective nodes.

    ``type_of(value)`` spells a fake tensor's MLIR type. Every node here was
    routed to the compiled path, so its group splits the world (``replica_groups``).
    """
    world = _world()[1]
    names: dict[torch.fx.Node, str] = {}
    args, body = [], []
    counter = itertools.count()

    def fresh() -> str:
        return f"%v{next(counter)}"

    for node in sub.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"%arg{len(args)}"
            args.append(f"{names[node]}: {type_of(node.meta['val'])}")
            continue
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            body.append(f"    return {', '.join(names[o] for o in outs)} : "
                        f"{', '.join(type_of(o.meta['val']) for o in outs)}")
            results = ", ".join(type_of(o.meta["val"]) for o in outs)
            continue
        name = op_name(node)
        if node.target is operator.getitem or name is None:
            raise NotImplementedError(f"unexpected node {node.format_node()} in a collective group")
        x = node.args[0]
        tout = type_of(node.meta["val"])
        if name == "wait_tensor":
            names[node] = names[x]
            continue
        result = fresh()
        kind = _KINDS.get(name)  # wait_tensor went above
        if kind is None:
            raise NotImplementedError(f"no lowering of {node.target}")
        reduction = node.args[1] if kind in ("all_reduce", "reduce_scatter") else None
        root = node.args[1] if kind == "broadcast" else 0
        body += _collective_lines(kind, names[x], result, fresh, x.meta["val"], tout,
                                  replica_groups(node.args[-1], world), type_of, reduction, root)
        names[node] = result
    return (f"module {{\n  func.func @main({', '.join(args)}) -> ({results}) {{\n" + "\n".join(body)
            + "\n  }\n}\n")


def eager_module(calls: list, op: str | None, groups: list, type_of) -> str:
    """StableHLO text of an eager collective of the device's process group (or several, coalesced: one
    executable) that XLA runs on the distributed client itself, in the first of the replica groups
    ``groups`` (which cover the world; replica ``i`` is rank ``i``). ``calls``: per collective ``(kind,
    source, result)``, tensors (meta will do) shaped as its input and output, dim 0 gathered, scattered or
    exchanged; ``kind``: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` (equal splits) or
    ``("broadcast", root)`` (``root`` the group rank whose rows every rank takes: an all-gather, then its
    rows, as the compiled lowering does). ``op``: the reductions' name. ``type_of`` spells a tensor's MLIR
    type (``splice.tensor_type``)."""
    world = sum(map(len, groups))
    counter = itertools.count()
    args, body, values, types = [], [], [], []
    for i, (kind, source, result) in enumerate(calls):
        tout = type_of(torch.empty(result.shape, dtype=result.dtype, device="meta"))
        args.append(f"%arg{i}: {type_of(torch.empty(source.shape, dtype=source.dtype, device='meta'))}")
        kind, root = kind if isinstance(kind, tuple) else (kind, 0)
        body += _collective_lines(kind, f"%arg{i}", f"%r{i}", lambda: f"%v{next(counter)}", source, tout, groups,
                                  type_of, op, root)
        values.append(f"%r{i}")
        types.append(tout)
    return (f"module attributes {{mhlo.num_replicas = {world} : i32}} {{\n"
            f"  func.func @main({', '.join(args)}) -> ({', '.join(types)}) {{\n" + "\n".join(body)
            + f"\n    return {', '.join(values)} : {', '.join(types)}\n  }}\n}}\n")