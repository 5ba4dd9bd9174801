"""``torch._higher_order_ops.associative_scan``: one op while sizes are symbolic, expanded at concrete ones.

Mamba's selective scan in transformers (mamba, falcon_mamba, zamba, jamba)
calls ``associative_scan(combine_fn, (A, Bu), dim=2, combine_mode="generic")``
off CUDA. PyTorch's generic mode is a Python recursion on the length (halve,
recurse, interleave), so Dynamo unrolls it, guarding on the length's parity
and magnitude at every level: a graph per length, none of them bucketable.
The ``pointwise`` mode is the ``associative_scan`` higher-order op: one node,
its combine function a subgraph, whatever the length; PyTorch refuses it off
CUDA only because its own kernels are CUDA's.

So, for us:

* ``install`` registers a Dynamo substitution for the frontend
  (``torch.compiler.substitute_in_graph``; what Dynamo traces is in
  ``neuron_compile/traced.py``, outside the packages the device hides from
  Dynamo): in a frame traced for our backend, a generic-mode scan that needs
  no gradient is traced as the higher-order op, at any length (the combine
  function must then be pointwise, as Mamba's is: Dynamo checks); every other
  call (another backend, a scan that needs a gradient, an eager call) is
  PyTorch's own code, unchanged.
* the padding analysis reads the op as a prefix scan along its dim 0
  (``bucketing``: real outputs read real inputs only);
* ``expand_associative_scans`` replaces each op, in a graph whose sizes are
  concrete (every graph we lower is), by PyTorch's own generic recursion
  traced at those sizes: ``log2(n)`` levels of slices and pointwise combines,
  which lower like any other ops. This is the op's eager (dense) kernel, so
  the results are what eager computes.

The private names used here (the frontend, ``generic_associative_scan``,
``wrap_combine_fn_flat``, ``associative_scan_op``) are checked by
``tests/test_associative_scan.py``.
"""

from __future__ import annotations

import functools
import logging
import operator
import types

import torch
import torch.fx

from .. import traced
from ..traced import _scan  # the module, not the function the package re-exports under its name

_installed = False


def scan_op():
    """The higher-order op, or None where this torch has none."""
    return getattr(torch.ops.higher_order, "associative_scan", None)


def install() -> None:
    """Register the substitution (once per process; a no-op where PyTorch lacks the op)."""
    global _installed
    if _installed or scan_op() is None:
        return
    _installed = True
    original = _scan.associative_scan
    # PyTorch's frontend for every other call: a copy (same code and globals) that Dynamo inlines as
    # it is; calling ``original`` from the substitution would call the substitution again
    frontend = types.FunctionType(original.__code__, original.__globals__, original.__name__,
                                  original.__defaults__, original.__closure__)
    frontend.__kwdefaults__ = original.__kwdefaults__
    traced.frontend = frontend
    try:
        torch.compiler.substitute_in_graph(original)(traced.associative_scan)
    except Exception as exc:  # noqa: BLE001 - a PyTorch that substitutes it itself: its own wins
        logging.getLogger("neuron_compile").warning(
            "neuron_compile: associative_scan stays PyTorch's recursion (a graph per length): %s", exc)


def mark_backend(fn):
    """Mark our Dynamo backend: the substitution applies only to graphs traced for it."""
    fn._neuron_compile_backend = True
    return fn


def expand_associative_scans(gm: torch.fx.GraphModule) -> int:
    """Inline each ``associative_scan`` op of a concrete-size graph as PyTorch's generic recursion,
    traced at its sizes. Returns how many ops were expanded."""
    op = scan_op()
    nodes = [n for n in gm.graph.nodes if op is not None and n.op == "call_function" and n.target is op]
    if not nodes:
        return 0
    from torch.fx.experimental.proxy_tensor import make_fx

    generic = _scan.generic_associative_scan
    graph = gm.graph
    for node in nodes:
        combine = getattr(gm, node.args[0].target)
        xs, extra = list(node.args[1]), list(node.args[2])

        def run(*flat, n=len(xs), combine=combine):
            return tuple(generic(combine, list(flat[:n]), additional_inputs=tuple(flat[n:])))

        inputs = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in xs + extra]
        sub = make_fx(run, tracing_mode="fake")(*inputs)
        env = {}
        placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
        for p, a in zip(placeholders, xs + extra):
            env[p] = a
        for attr in [n for n in sub.graph.nodes if n.op == "get_attr"]:
            name = f"_scan_{node.name}_{attr.target}"
            setattr(gm, name, getattr(sub, attr.target))
            with graph.inserting_before(node):
                env[attr] = graph.get_attr(name)
            env[attr].meta.update(attr.meta)
        with graph.inserting_before(node):
            outs = graph.graph_copy(sub.graph, env)
        trace = node.meta.get("stack_trace")
        for new in env.values():
            if isinstance(new, torch.fx.Node) and trace and "stack_trace" not in new.meta:
                new.meta["stack_trace"] = trace
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outs[user.args[1]])
                graph.erase_node(user)
        if node.users:
            raise RuntimeError(f"{node.name}: associative_scan's results used other than by index: "
                               f"{list(node.users)}")
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return len(nodes)
