"""`fuse`: group ops into kernels and outline each as a named composite.

A Neuron-style compiler keeps a kernel's intermediates in SBUF; what crosses
a kernel boundary goes through HBM. This pass finds the regions worth one
kernel (patterns in ``fusion_patterns``: attention, layer/RMS norm, matmul
with its epilogue, elementwise chains), and outlines each as
``stablehlo.composite "neuron.<kind>"`` with a private decomposition function
holding the original ops (``outline``). Numerics are unchanged: executors run
a composite through its decomposition.

Per graph it reports regions by kind, ops per region, and an estimate of the
bytes that no longer cross a kernel boundary: for every intermediate value
that stays inside a region, one write plus one read per use, as an
op-per-kernel executor would move them.

Regions are formed on the public functions only (the graph), in three
steps per function: find every region on one ``BlockGraph`` snapshot (each
claimed region counts as one op for the convexity of the next, so the
composites cannot form a cycle), fix every region's inputs and outputs on
that snapshot, then outline them all and put the block back in a valid
order. No step looks an op up by identity after the block changed.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from torch_mlir import ir

from .dataflow import OUTSIDE, BlockGraph
from .fusion_patterns import PATTERNS
from .outline import RegionIO, intermediate_bytes, outline, region_io
from .pass_result import PassResult
from .stablehlo_ops import entry_block, public_functions


def existing_symbols(module: ir.Module) -> set[str]:
    return {
        ir.StringAttr(op.attributes["sym_name"]).value
        for op in module.body.operations
        if "sym_name" in op.attributes
    }


class SymbolNames:
    """``neuron.<kind>_<n>``: the lowest n per kind not taken, counting up."""

    def __init__(self, taken: set[str]):
        self.taken = taken
        self.next: dict[str, int] = {}

    def fresh(self, kind: str) -> str:
        n = self.next.get(kind, 0)
        while f"neuron.{kind}_{n}" in self.taken:
            n += 1
        self.next[kind] = n + 1
        name = f"neuron.{kind}_{n}"
        self.taken.add(name)
        return name


def find_regions(g: BlockGraph) -> list[tuple[str, list[int]]]:
    """Disjoint regions of g, by pattern priority, as sorted indices; each
    convex with the earlier ones contracted to single ops (``g.claim``)."""
    claimed: set[int] = set()
    found = []
    for _, is_anchor, matcher in PATTERNS:
        for i in range(len(g)):
            if i in claimed or not is_anchor(g.name(i)):
                continue
            m = matcher(g, i, claimed)
            if m is None:
                continue
            kind, region = m
            claimed |= region
            g.claim(region)
            found.append((kind, sorted(region)))
    return found


def order_block(g: BlockGraph, ios: list[RegionIO], composites: list, dead: set[int]) -> bool:
    """Re-sort the block after outlining: every untouched op and every
    composite is a unit placed at its old position (a composite at its
    region's last op), then a stable topological sort over units (ties by
    old position) moves only what must move. Returns whether anything moved."""
    unit_of: dict[int, int] = {}
    keys: list[int] = []
    unit_ops: list = []
    for u, (io, comp) in enumerate(zip(ios, composites)):
        for i in io.ops:
            unit_of[i] = u
        keys.append(io.ops[-1])
        unit_ops.append(comp)
    for i in range(len(g)):
        if i not in unit_of and i not in dead:
            unit_of[i] = len(keys)
            keys.append(i)
            unit_ops.append(g.ops[i])
    n = len(keys)
    deps = [set() for _ in range(n)]
    for i, u in unit_of.items():
        for p in g.producers(i):
            q = unit_of.get(p)
            if q is not None and q != u:
                deps[u].add(q)
    users: list[list[int]] = [[] for _ in range(n)]
    for u, ds in enumerate(deps):
        for q in ds:
            users[q].append(u)
    waiting = [len(ds) for ds in deps]
    ready = [(keys[u], u) for u in range(n) if not waiting[u]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(u)
        for w in users[u]:
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(ready, (keys[w], w))
    if len(order) != n:
        raise RuntimeError("fuse: cycle between outlined regions")
    if all(keys[a] < keys[b] for a, b in zip(order, order[1:])):
        return False
    for u in order:
        unit_ops[u].move_before(g.terminator)
    return True


@dataclass(frozen=True)
class Fuse:
    name = "fuse"

    def apply(self, module: ir.Module) -> PassResult:
        regions: dict[str, int] = {}
        ops_per_region: dict[str, list[int]] = {}
        bytes_by_kind: dict[str, int] = {}
        with module.context, ir.Location.unknown():
            names = SymbolNames(existing_symbols(module))
            for func in public_functions(module):
                g = BlockGraph(entry_block(func))
                # name in program order; outline last-first (any order is valid)
                plan = [
                    (kind, region_io(g, region), names.fresh(kind))
                    for kind, region in sorted(find_regions(g), key=lambda kr: kr[1][0])
                ]
                replaced: dict = {}
                ios, composites = [], []
                for kind, io, fname in sorted(plan, key=lambda p: -p[1].ops[-1]):
                    saved = intermediate_bytes(g, io)
                    composites.append(outline(module, g, io, kind, fname, replaced))
                    ios.append(io)
                    regions[kind] = regions.get(kind, 0) + 1
                    ops_per_region.setdefault(kind, []).append(len(io.ops))
                    bytes_by_kind[kind] = bytes_by_kind.get(kind, 0) + saved
                dead = erase_cloned_constants(g, ios)
                order_block(g, ios, composites, dead)
        return PassResult(
            fired=sum(regions.values()),
            details={
                "regions": dict(sorted(regions.items())),
                "ops_per_region": {k: sorted(v) for k, v in sorted(ops_per_region.items())},
                "bytes_saved": sum(bytes_by_kind.values()),
                "bytes_saved_by_kind": dict(sorted(bytes_by_kind.items())),
            },
        )


def erase_cloned_constants(g: BlockGraph, ios: list[RegionIO]) -> set[int]:
    """Erase the constants that every region reading them cloned and nothing
    else reads; their indices."""
    outlined = {i for io in ios for i in io.ops}
    dead = set()
    for c in sorted({c for io in ios for c in io.consts}):
        if all(u != OUTSIDE and u in outlined for u in g.users(c)):
            g.ops[c].erase()
            dead.add(c)
    return dead
