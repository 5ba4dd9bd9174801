"""What shape bucketing reads of Dynamo's ShapeEnv (a private torch API), in one place.

The padding analysis asks three things of the ShapeEnv behind a graph's
symbolic sizes: the value Dynamo traced each size symbol at (``traced_values``,
``graph_traced_values``), the guards Dynamo installed on them, and their value
ranges. Every read goes through this module;
``tests/test_shape_env.py`` fails loudly when a torch release renames or drops
one of them (the analysis would otherwise just know less).
"""

from __future__ import annotations


def traced_values(shape_env) -> dict:
    """size symbol -> the int Dynamo traced it at (``backed_var_to_val``; ``var_to_val`` before
    torch 2.13, deprecated since)."""
    values = getattr(shape_env, "backed_var_to_val", None)
    if values is None:
        values = shape_env.var_to_val
    return {symbol: int(value) for symbol, value in values.items()}


def graph_traced_values(gm) -> dict:
    """Each size symbol of ``gm``'s inputs -> the int Dynamo traced it at."""
    import torch

    values = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))  # AOT's graphs, Dynamo's
        for size in (list(val.shape) if isinstance(val, torch.Tensor) else [val]):
            if isinstance(size, torch.SymInt):
                traced = traced_values(size.node.shape_env)
                values.update({x: traced[x] for x in size.node.expr.free_symbols if x in traced})
    return values


def guards(shape_env) -> list:
    """The sympy expressions of the guards Dynamo installed so far."""
    return [guard.expr for guard in shape_env.guards]


def value_ranges(shape_env) -> dict:
    """size symbol -> its value range (``.lower``, ``.upper``)."""
    return shape_env.var_to_range


def graph_shape_env(gm):
    """The ShapeEnv behind ``gm``'s symbolic input sizes, or None where every size is static."""
    import torch

    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        for size in (list(val.shape) if isinstance(val, torch.Tensor) else [val]):
            if isinstance(size, torch.SymInt):
                return size.node.shape_env
    return None


def graph_size_symbols(gm) -> set:
    """The size symbols of the tensors ``gm`` computes (cached on it: the graph does not change)."""
    import torch

    if "_size_symbols" not in gm.meta:
        gm.meta["_size_symbols"] = {
            x for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)
            for size in n.meta["val"].shape if isinstance(size, torch.SymInt) for x in size.node.expr.free_symbols}
    return gm.meta["_size_symbols"]
