"""The def-use graph of one block, by op index, for region formation.

Fusion patterns reason about "the ops between x and y" and "can these ops
become one kernel". Both are questions about the block's dataflow graph, so
this module numbers the ops of a block in order and answers them:

- ``producers(i)`` / ``users(i)``: neighbours inside the block (a user outside
  the block, e.g. ``func.return``, is reported as ``OUTSIDE``);
- ``forward(seeds)`` / ``backward(seeds)``: reachability;
- ``between(src, dst)``: ops on some path from ``src`` to ``dst``;
- ``is_convex(region)``: no path leaves the region and comes back, the
  condition for outlining it as one op without creating a cycle;
- ``absorb_feeders(region, claimed)``: pull in constants and layout ops
  (broadcast, reshape, transpose, convert, pad, slice) whose every user is in
  the region, e.g. a bias broadcast or a weight transpose.
"""
from __future__ import annotations

from torch_mlir import ir

from .stablehlo_ops import CONSTANTS, LAYOUT, defining_op, key

OUTSIDE = -1
FEEDERS = LAYOUT | CONSTANTS | {"stablehlo.convert", "stablehlo.pad", "stablehlo.slice"}


class BlockGraph:
    def __init__(self, block: ir.Block):
        self.ops = list(block.operations)[:-1]  # terminator excluded
        self.index = {key(op): i for i, op in enumerate(self.ops)}
        n = len(self.ops)
        self._producers: list[list[int]] = [[] for _ in range(n)]
        self._users: list[list[int]] = [[] for _ in range(n)]
        for i, op in enumerate(self.ops):
            for v in op.operands:
                j = self.producer(v)
                if j is not None and j not in self._producers[i]:
                    self._producers[i].append(j)
            for r in op.results:
                for use in r.uses:
                    u = self.index.get(key(use.owner), OUTSIDE)
                    if u not in self._users[i]:
                        self._users[i].append(u)

    def __len__(self) -> int:
        return len(self.ops)

    def name(self, i: int) -> str:
        return self.ops[i].name

    def producer(self, value: ir.Value):
        """Index of the op defining ``value`` in this block, or None."""
        op = defining_op(value)
        return None if op is None else self.index.get(key(op))

    def producers(self, i: int) -> list[int]:
        return self._producers[i]

    def users(self, i: int) -> list[int]:
        return self._users[i]

    def value_users(self, value: ir.Value) -> list[int]:
        return [self.index.get(key(u.owner), OUTSIDE) for u in value.uses]

    def forward(self, seeds, limit: int | None = None) -> set[int]:
        """Ops reachable from ``seeds`` along def-use edges (seeds included)."""
        seen, stack = set(seeds), list(seeds)
        while stack:
            for u in self._users[stack.pop()]:
                if u != OUTSIDE and u not in seen and (limit is None or u <= limit):
                    seen.add(u)
                    stack.append(u)
        return seen

    def backward(self, seeds, floor: int | None = None) -> set[int]:
        """Ops that ``seeds`` depend on (seeds included)."""
        seen, stack = set(seeds), list(seeds)
        while stack:
            for p in self._producers[stack.pop()]:
                if p not in seen and (floor is None or p >= floor):
                    seen.add(p)
                    stack.append(p)
        return seen

    def between(self, src: int, dst: int) -> set[int]:
        """Ops on some path from op ``src`` to op ``dst`` (both included)."""
        if src > dst:
            return set()
        return self.forward([src], limit=dst) & self.backward([dst], floor=src)

    def is_convex(self, region: set[int]) -> bool:
        """No path region -> outside op -> region."""
        if not region:
            return True
        hi = max(region)
        frontier = [u for i in region for u in self._users[i] if u != OUTSIDE and u not in region and u < hi]
        seen = set(frontier)
        while frontier:
            i = frontier.pop()
            for u in self._users[i]:
                if u == OUTSIDE or u > hi:
                    continue
                if u in region:
                    return False
                if u not in seen:
                    seen.add(u)
                    frontier.append(u)
        return True

    def absorb_feeders(self, region: set[int], claimed: set[int]) -> set[int]:
        """Grow ``region`` by feeder ops used only inside it (to a fixpoint)."""
        region = set(region)
        changed = True
        while changed:
            changed = False
            for i in sorted({p for r in region for p in self._producers[r]} - region - claimed):
                if self.name(i) in FEEDERS and all(u in region for u in self._users[i]):
                    region.add(i)
                    changed = True
        return region
