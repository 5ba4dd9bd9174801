"""Outline a set of ops as ``stablehlo.composite "neuron.<kind>"``.

    %r = stablehlo.composite "neuron.attention" %q, %k, %v, %mask
           {decomposition = @neuron.attention_0} : (...) -> ...
    func.func private @neuron.attention_0(...) { <the original ops> }

The decomposition holds the original ops unchanged, so XLA and the StableHLO
interpreter (which both run a composite through its decomposition) compute
exactly what they computed before, while a kernel library can replace the
composite by name. Inputs are the values the region reads from outside, in
order of first use, including values its ops' regions capture; constants are
cloned into the body instead of passed in. Outputs are the region's values
used outside it (several for e.g. a norm whose mean escapes).

Two steps, so that no rewrite invalidates what the next one reads:

1. ``region_io`` works on the ``BlockGraph`` snapshot, before any rewrite:
   every region's inputs, constants and outputs are fixed up front.
2. ``outline`` moves the region's ops (the very same op objects, none cloned
   or erased) into the decomposition and rewires their operands by value:
   inputs to block arguments, constants to their clones. Inputs that an
   earlier ``outline`` replaced by its composite's results are looked up in
   ``replaced``; inputs that a later one replaces are rewired by its
   ``replace_all_uses_with``. So regions can be outlined in any order.

The composite goes where the region's last op was; the caller orders the
block afterwards (``fuse.order_block``), as an outside user of an early output
may sit above that point.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from .dataflow import OUTSIDE, BlockGraph
from .stablehlo_ops import CONSTANTS, byte_size, nested_ops


@dataclass
class RegionIO:
    ops: list[int]  # sorted indices into the BlockGraph
    inputs: list[ir.Value]  # read from outside, first use first
    consts: list[int]  # outside constant ops the region reads (cloned in)
    outputs: list[ir.Value]  # results used outside the region


def region_io(g: BlockGraph, region) -> RegionIO:
    """Inputs, constants to clone and outputs of ``region`` (op indices)."""
    ops = sorted(region)
    inside = set(ops)
    inputs: list[ir.Value] = []
    consts: list[int] = []
    seen: set = set()
    for i in ops:
        for v in [*g.ops[i].operands, *g.captures(i)]:
            if v in seen:
                continue
            p = g.producer(v)
            if p is not None and p in inside:
                continue
            seen.add(v)
            if p is not None and g.name(p) in CONSTANTS:
                consts.append(p)
            else:
                inputs.append(v)
    outputs = [
        r for i in ops for r in g.ops[i].results
        if any(u == OUTSIDE or u not in inside for u in g.value_users(r))
    ]
    return RegionIO(ops, inputs, consts, outputs)


def intermediate_bytes(g: BlockGraph, io: RegionIO) -> int:
    """Bytes of traffic kept on chip: each non-constant intermediate that no
    longer leaves the kernel would be written once and read once per use."""
    outputs = set(io.outputs)
    total = 0
    for i in io.ops:
        if g.name(i) in CONSTANTS:
            continue
        for r in g.ops[i].results:
            if r not in outputs:
                total += byte_size(r) * (1 + len(g.value_users(r)))
    return total


def outline(
    module: ir.Module, g: BlockGraph, io: RegionIO, kind: str, fname: str, replaced: dict
) -> ir.Operation:
    """Move the ops of ``io`` into ``func.func private @fname`` and put a
    composite calling it in their place. ``replaced`` maps values of this
    block that earlier outlines replaced to their composites' results; this
    one adds its outputs."""
    inputs = [replaced.get(v, v) for v in io.inputs]
    in_types = [v.type for v in inputs]
    out_types = [v.type for v in io.outputs]
    with ir.InsertionPoint(module.body):
        func = ir.Operation.create(
            "func.func",
            attributes={
                "sym_name": ir.StringAttr.get(fname),
                "function_type": ir.TypeAttr.get(ir.FunctionType.get(in_types, out_types)),
                "sym_visibility": ir.StringAttr.get("private"),
            },
            regions=1,
        )
    block = func.regions[0].blocks.append(*in_types)
    last = g.ops[io.ops[-1]]
    composite = ir.Operation.create(
        "stablehlo.composite",
        results=out_types,
        operands=inputs,
        attributes={
            "name": ir.StringAttr.get("neuron." + kind),
            "decomposition": ir.FlatSymbolRefAttr.get(fname),
        },
        loc=last.location,
        ip=ir.InsertionPoint(last),
    )
    # Every use of an output now reads the composite: the outside ones as
    # wanted, the region's own ones are pointed back below.
    rewire: dict = {}
    for v, new in zip(io.outputs, composite.results):
        v.replace_all_uses_with(new)
        replaced[v] = new
        rewire[new] = v
    ret = ir.Operation.create("func.return", operands=io.outputs, ip=ir.InsertionPoint(block))
    for v, arg in zip(inputs, block.arguments):
        rewire[v] = arg
    consts = set(io.consts)
    body_ip = ir.InsertionPoint(ret)
    for i in sorted(consts.union(io.ops)):  # program order, constants cloned where they were
        op = g.ops[i]
        if i in consts:
            rewire[op.result] = op.clone(ip=body_ip).result
            continue
        op.move_before(ret)
        _rewire_operands(op, rewire)
        if g.captures(i):
            for nested in nested_ops(op):
                _rewire_operands(nested, rewire)
    return composite


def _rewire_operands(op, rewire: dict) -> None:
    operands = op.operands
    for n, v in enumerate(operands):
        new = rewire.get(v)
        if new is not None:
            operands[n] = new
