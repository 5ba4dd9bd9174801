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

Regions are formed on the public functions only (the graph), with the
dataflow graph recomputed after each outlining so indices stay valid.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from .dataflow import BlockGraph
from .fusion_patterns import PATTERNS
from .outline import intermediate_bytes, outline, region_io
from .pass_result import PassResult
from .stablehlo_ops import entry_block, public_functions, sort_block_topologically


def existing_symbols(module: ir.Module) -> set[str]:
    return {
        ir.StringAttr(op.attributes["sym_name"]).value
        for op in module.body.operations
        if "sym_name" in op.attributes
    }


def fresh_name(kind: str, taken: set[str]) -> str:
    n = 0
    while f"neuron.{kind}_{n}" in taken:
        n += 1
    taken.add(f"neuron.{kind}_{n}")
    return f"neuron.{kind}_{n}"


def find_regions(g: BlockGraph) -> list[tuple[str, list[int]]]:
    """Disjoint convex regions of g, by pattern priority, as sorted indices."""
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
            found.append((kind, sorted(region)))
    return found


@dataclass(frozen=True)
class Fuse:
    name = "fuse"

    def apply(self, module: ir.Module) -> PassResult:
        regions: dict[str, int] = {}
        ops_per_region: dict[str, list[int]] = {}
        bytes_by_kind: dict[str, int] = {}
        with module.context, ir.Location.unknown():
            names = existing_symbols(module)
            for func in public_functions(module):
                block = entry_block(func)
                g = BlockGraph(block)
                plan = find_regions(g)
                # name in program order, outline last-first so indices into g stay valid
                named = []
                for kind, region in sorted(plan, key=lambda kr: kr[1][0]):
                    named.append((kind, region, fresh_name(kind, names)))
                for kind, region, fname in sorted(named, key=lambda kr: -kr[1][-1]):
                    _, _, outputs = region_io(g, region)
                    saved = intermediate_bytes(g, region, outputs)
                    outline(module, g, region, kind, fname)
                    regions[kind] = regions.get(kind, 0) + 1
                    ops_per_region.setdefault(kind, []).append(len(region))
                    bytes_by_kind[kind] = bytes_by_kind.get(kind, 0) + saved
                sort_block_topologically(block)
        return PassResult(
            fired=sum(regions.values()),
            details={
                "regions": dict(sorted(regions.items())),
                "ops_per_region": {k: sorted(v) for k, v in sorted(ops_per_region.items())},
                "bytes_saved": sum(bytes_by_kind.values()),
                "bytes_saved_by_kind": dict(sorted(bytes_by_kind.items())),
            },
        )
