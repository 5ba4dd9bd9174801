"""The def-use graph of one block, by op index, for region formation.

Fusion patterns reason about "the ops between x and y" and "can these ops
become one kernel". Both are questions about the block's dataflow graph, so
this module numbers the ops of a block in order and answers them:

- ``producers(i)`` / ``users(i)``: neighbours inside the block (a use by the
  terminator, e.g. ``func.return``, is reported as ``OUTSIDE``);
- ``forward(seeds)`` / ``backward(seeds)``: reachability;
- ``between(src, dst)``: ops on some path from ``src`` to ``dst``;
- ``is_convex(region)``: no path leaves the region and comes back, also
  through regions already claimed (``claim``), each of which becomes one op:
  the condition for outlining them all without creating a cycle;
- ``absorb_feeders(region, claimed)``: pull in constants and layout ops
  (broadcast, reshape, transpose, convert, pad, slice) whose every user is in
  the region, e.g. a bias broadcast or a weight transpose.

An op reads its operands and the values its regions capture from the block
(``captured_values``): both are edges. The graph is built in one sweep over
the block, keyed by ``ir.Value`` (see ``stablehlo_ops`` on why never by op),
and is a snapshot: it does not follow later rewrites of the block. Every
query is bounded by the index window it is about (indices are a topological
order), so a pass over all anchors stays linear in the block for local
patterns.
"""
from __future__ import annotations

import bisect
import heapq

from torch_mlir import ir

from .stablehlo_ops import CONSTANTS, LAYOUT, captured_values

OUTSIDE = -1
FEEDERS = LAYOUT | CONSTANTS | {"stablehlo.convert", "stablehlo.pad", "stablehlo.slice"}


class BlockGraph:
    def __init__(self, block: ir.Block):
        ops = list(block.operations)
        self.terminator = ops[-1]
        self.ops = ops[:-1]
        self.names = [op.name for op in self.ops]
        n = len(self.ops)
        # value -> index of the op defining it in this block
        self._defined_by: dict[ir.Value, int] = {}
        for i, op in enumerate(self.ops):
            for r in op.results:
                self._defined_by[r] = i
        self._value_users: dict[ir.Value, list[int]] = {}
        self._captures: dict[int, list[ir.Value]] = {}
        self._producers: list[list[int]] = [[] for _ in range(n)]
        self._users: list[list[int]] = [[] for _ in range(n)]
        for i, op in enumerate(self.ops):
            reads = list(op.operands)
            captured = captured_values(op)
            if captured:
                self._captures[i] = captured
                reads += captured
            producers = self._producers[i]
            for v in reads:
                self._value_users.setdefault(v, []).append(i)
                j = self._defined_by.get(v)
                if j is not None and j != i and j not in producers:
                    producers.append(j)
                    self._users[j].append(i)
        for v in self.terminator.operands:
            self._value_users.setdefault(v, []).append(OUTSIDE)
            j = self._defined_by.get(v)
            if j is not None and OUTSIDE not in self._users[j]:
                self._users[j].append(OUTSIDE)
        # claimed regions: op index -> region id, region id -> op indices
        self._group: dict[int, int] = {}
        self._groups: list[list[int]] = []
        self._spans: list[tuple[int, int]] = []  # (first, last) member of each claimed region, sorted

    def __len__(self) -> int:
        return len(self.ops)

    def name(self, i: int) -> str:
        return self.names[i]

    def producer(self, value: ir.Value):
        """Index of the op defining ``value`` in this block, or None."""
        return self._defined_by.get(value)

    def producers(self, i: int) -> list[int]:
        return self._producers[i]

    def users(self, i: int) -> list[int]:
        return self._users[i]

    def captures(self, i: int) -> list[ir.Value]:
        """Values op i's regions read from outside op i."""
        return self._captures.get(i, [])

    def value_users(self, value: ir.Value) -> list[int]:
        """One entry per use of ``value`` (an operand, or a capture by an op's
        regions), OUTSIDE for the terminator."""
        return self._value_users.get(value, [])

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

    def reaches(self, src: int, dst: int) -> bool:
        """Is there a path from op ``src`` to op ``dst``?"""
        return src == dst or (src < dst and dst in self.forward([src], limit=dst))

    def nearest_above(self, seed: int, names) -> int | None:
        """The highest-index op named in ``names`` that ``seed`` depends on
        (seed included), searching nearest first and stopping there."""
        heap, seen = [-seed], {seed}
        while heap:
            i = -heapq.heappop(heap)
            if self.names[i] in names:
                return i
            for p in self._producers[i]:
                if p not in seen:
                    seen.add(p)
                    heapq.heappush(heap, -p)
        return None

    def between(self, src: int, dst: int) -> set[int]:
        """Ops on some path from op ``src`` to op ``dst`` (both included)."""
        if src > dst:
            return set()
        return self.forward([src], limit=dst) & self.backward([dst], floor=src)

    def claim(self, region) -> None:
        """Record ``region`` as one future op (a composite) for ``is_convex``."""
        gid = len(self._groups)
        self._groups.append(sorted(region))
        bisect.insort(self._spans, (self._groups[-1][0], self._groups[-1][-1]))
        for i in region:
            self._group[i] = gid

    def _return_bound(self, hi: int) -> int:
        """The highest index a path that leaves a region ending at ``hi`` and
        comes back into it can pass through.

        Def-use edges only go up in index, so for single ops that is ``hi``.
        A claimed region is one op, though: entering it at a member above
        ``hi`` reaches its members below ``hi`` as well. So every claimed
        region with a member at or below the bound extends the bound to its
        highest member, to a fixpoint (a path above it can never get back).
        """
        bound = hi
        for first, last in self._spans:
            if first > bound:
                break
            bound = max(bound, last)
        return bound

    def is_convex(self, region: set[int]) -> bool:
        """No path region -> outside op(s) -> region, where reaching an op of
        a claimed region reaches all of it (it will be one op)."""
        if not region:
            return True
        bound = self._return_bound(max(region))
        seen: set[int] = set()
        frontier: list[int] = []
        entered: set[int] = set()

        def reach(u: int) -> bool:
            """Mark u reached; False if that closes a cycle through region."""
            if u in region:
                return False
            if u in seen:
                return True
            seen.add(u)
            frontier.append(u)
            gid = self._group.get(u)
            if gid is not None and gid not in entered:
                entered.add(gid)
                for w in self._groups[gid]:
                    if w <= bound and not reach(w):
                        return False
            return True

        for i in region:
            for u in self._users[i]:
                if u != OUTSIDE and u <= bound and u not in region and not reach(u):
                    return False
        while frontier:
            for u in self._users[frontier.pop()]:
                if u != OUTSIDE and u <= bound and not reach(u):
                    return False
        return True

    def absorb_feeders(self, region: set[int], claimed: set[int]) -> set[int]:
        """Grow ``region`` by feeder ops used only inside it (to a fixpoint)."""
        region = set(region)
        candidates = {p for r in region for p in self._producers[r]} - region - claimed
        while candidates:
            i = max(candidates)  # users first: a feeder of a feeder joins after it
            candidates.discard(i)
            if self.names[i] in FEEDERS and all(u in region for u in self._users[i]):
                region.add(i)
                candidates |= set(self._producers[i]) - region - claimed
        return region
