"""The ShapeEnv reads shape bucketing relies on (neuron_compile/bucketing/shape_env.py): fails loudly
when a torch release renames or drops one of them."""

import warnings

import torch

from neuron_compile.bucketing import shape_env


def _symbolic_shape_env():
    seen = {}

    def backend(gm, example_inputs):
        seen["gm"] = gm
        for node in gm.graph.nodes:
            val = node.meta.get("example_value")
            if isinstance(val, torch.Tensor) and isinstance(val.shape[1], torch.SymInt):
                seen["size"] = val.shape[1]
        return gm.forward

    def f(x):
        return x[:, :-1] * 2 if x.shape[1] > 4 else x

    torch.compile(f, backend=backend, dynamic=True)(torch.randn(2, 37))
    return seen["size"], seen["gm"]


def test_traced_values_guards_and_ranges_read_without_warnings():
    size, gm = _symbolic_shape_env()
    env, symbol = size.node.shape_env, next(iter(size.node.expr.free_symbols))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated spelling (var_to_val in 2.13) fails here
        values = shape_env.traced_values(env)
        guards = shape_env.guards(env)
        ranges = shape_env.value_ranges(env)
        of_graph = shape_env.graph_traced_values(gm)
    assert values[symbol] == 37 and of_graph[symbol] == 37
    assert any(symbol in g.free_symbols for g in guards), guards  # x.shape[1] > 4 guarded
    assert ranges[symbol].lower >= 0 and ranges[symbol].upper >= 37
