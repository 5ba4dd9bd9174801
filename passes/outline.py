"""Outline a set of ops as ``stablehlo.composite "neuron.<kind>"``.

    %r = stablehlo.composite "neuron.attention" %q, %k, %v, %mask
           {decomposition = @neuron.attention_0} : (...) -> ...
    func.func private @neuron.attention_0(...) { <the original ops> }

The decomposition holds the original ops unchanged, so XLA and the StableHLO
interpreter (which both run a composite through its decomposition) compute
exactly what they computed before, while a kernel library can replace the
composite by name. Inputs are the values the region reads from outside, in
order of first use; constants are cloned into the body instead of passed in.
Outputs are the region's values used outside it (several for e.g. a norm
whose mean escapes). The composite goes where the region's last op was; the
caller re-sorts the block afterwards, as an outside user of an early output
may sit above that point (the region is convex, so a valid order exists).
"""
from __future__ import annotations

from torch_mlir import ir

from .dataflow import OUTSIDE, BlockGraph
from .stablehlo_ops import CONSTANTS, byte_size, defining_op, key


def value_key(v: ir.Value):
    owner = defining_op(v)
    if owner is None:
        return ("arg", key(v.owner.region.owner) if hasattr(v.owner, "region") else None, v.arg_number)
    return (key(owner), v.result_number)


def region_io(g: BlockGraph, region: list[int]):
    """(inputs, constants_to_clone, outputs) of a region given as sorted indices."""
    inside = set(region)
    inputs, consts, seen = [], [], set()
    for i in region:
        for v in g.ops[i].operands:
            p = g.producer(v)
            if p is not None and p in inside:
                continue
            k = value_key(v)
            if k in seen:
                continue
            seen.add(k)
            if p is not None and g.name(p) in CONSTANTS:
                consts.append(p)
            else:
                inputs.append(v)
    outputs = [
        r for i in region for r in g.ops[i].results
        if any(u == OUTSIDE or u not in inside for u in g.value_users(r))
    ]
    return inputs, consts, outputs


def intermediate_bytes(g: BlockGraph, region: list[int], outputs) -> int:
    """Bytes of traffic kept on chip: each non-constant intermediate that no
    longer leaves the kernel would be written once and read once per use."""
    out_keys = {value_key(v) for v in outputs}
    total = 0
    for i in region:
        if g.name(i) in CONSTANTS:
            continue
        for r in g.ops[i].results:
            if value_key(r) not in out_keys:
                total += byte_size(r) * (1 + len(list(r.uses)))
    return total


def outline(module: ir.Module, g: BlockGraph, region: list[int], kind: str, fname: str) -> ir.Operation:
    """Replace the ops ``region`` (sorted indices into g) by a composite."""
    inputs, consts, outputs = region_io(g, region)
    in_types = [v.type for v in inputs]
    out_types = [v.type for v in outputs]
    func_type = ir.FunctionType.get(in_types, out_types)
    with ir.InsertionPoint(module.body):
        func = ir.Operation.create(
            "func.func",
            attributes={
                "sym_name": ir.StringAttr.get(fname),
                "function_type": ir.TypeAttr.get(func_type),
                "sym_visibility": ir.StringAttr.get("private"),
            },
            regions=1,
        )
    block = func.regions[0].blocks.append(*in_types)
    mapping = {value_key(v): a for v, a in zip(inputs, block.arguments)}
    body_ip = ir.InsertionPoint(block)
    for i in sorted(set(region) | set(consts)):
        src = g.ops[i]
        clone = src.clone(ip=body_ip)
        for n, v in enumerate(src.operands):
            clone.operands[n] = mapping[value_key(v)]
        for r_src, r_new in zip(src.results, clone.results):
            mapping[value_key(r_src)] = r_new
    ir.Operation.create(
        "func.return", operands=[mapping[value_key(v)] for v in outputs], ip=body_ip
    )
    last = g.ops[max(region)]
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
    for v, new in zip(outputs, composite.results):
        v.replace_all_uses_with(new)
    for i in sorted(region, reverse=True):
        g.ops[i].erase()
    for c in consts:
        if all(not list(r.uses) for r in g.ops[c].results):
            g.ops[c].erase()
    return composite
