"""FX graph -> StableHLO text with no Torch-MLIR: the eager device's fast path for one op's graph.

An eager op on the ``neuron`` device is traced into a small FX graph of core
ATen ops (views, elementwise arithmetic, a matmul, a reduction), then lowered.
Through Torch-MLIR that lowering (its importer, the torch-backend and
StableHLO pipelines) takes about 7 ms of an op's cold build, which XLA's own
compile (about 25 ms) cannot go under. Here each ATen op of such a graph has a
rule (``direct_rules``) that writes its StableHLO directly, in MLIR's generic
syntax, from the node's FakeTensor value (its shape and dtype): ``lower(gm)``
gives the module's text when every node has a rule, and None otherwise, so the
graph takes Torch-MLIR's path as before. Nothing is guessed: a node whose arguments a rule
does not expect (a symbolic size, complex values, a rounding mode) has no rule.

Rules follow ATen's semantics as Torch-MLIR lowers them: operands converted to
the result's dtype for arithmetic and to the promoted dtype for comparisons,
broadcast to the result's shape. Half-precision sums and softmax accumulate in
float32, as CPU's kernels do.
"""

from __future__ import annotations

import torch

from .direct_ir import Function, NoRule, V
from .direct_rules import RULES, register_ours


def lower(gm: torch.fx.GraphModule) -> str | None:
    """``gm``'s StableHLO module text, ``@main`` taking its placeholders and returning its outputs, when every
    node has a rule; None when one has not (the reason is not an error: Torch-MLIR lowers the graph)."""
    register_ours()
    fn = Function()
    env: dict = {}
    params = []
    try:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    return None
                env[node] = V(f"%arg{len(params)}", val.shape, val.dtype)
                params.append(f"{env[node].name}: {env[node].type}")
            elif node.op == "call_function":
                emit = RULES.get(node.target)
                val = node.meta.get("val")
                if emit is None or not isinstance(val, torch.Tensor) or val.is_complex():
                    return None
                args = [_value(a, env) for a in node.args]
                env[node] = emit(fn, node, args, (tuple(val.shape), val.dtype))
                if env[node].shape != tuple(val.shape) or env[node].dtype is not val.dtype:
                    return None  # a rule that does not give the node's value exactly: never guess
            elif node.op == "output":
                results = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
                outputs = [env.get(o) if isinstance(o, torch.fx.Node) else None for o in results]
                if not outputs or any(o is None for o in outputs):
                    return None
            else:
                return None
    except (NoRule, TypeError, ValueError, ZeroDivisionError, KeyError, IndexError):
        return None
    types = ", ".join(o.type for o in outputs)
    body = "\n".join(fn.lines)
    returned = ", ".join(o.name for o in outputs)
    return (f"module {{\n  func.func @main({', '.join(params)}) -> ({types}) {{\n{body}\n"
            f'    "func.return"({returned}) : ({types}) -> ()\n  }}\n}}\n')


def _value(arg, env):
    if isinstance(arg, torch.fx.Node):
        if arg not in env:
            raise NoRule("an argument with no value")
        return env[arg]
    if isinstance(arg, (list, tuple)):
        return type(arg)(_value(a, env) for a in arg)
    return arg
