"""Compile reports: what happened to each graph, stage by stage.

A ``CompileReport`` travels with a graph through the pipeline and grows one
line per stage (``report.stage("lowering")`` times a block). Reports are kept
in a process-wide list readable through ``neuron_compile.compile_reports()``,
and each finished report is logged at DEBUG level on the ``neuron_compile``
logger. Counters (graphs compiled, cache hits, fallbacks...) are plain ints in
``COUNTERS`` so tests can assert them the way Inductor's tests assert
``counters["inductor"]``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("neuron_compile")

COUNTERS: collections.Counter = collections.Counter()
_REPORTS: list["CompileReport"] = []
_LOCK = threading.Lock()


@dataclass
class CompileReport:
    """One graph's compile: identity, sizes, and seconds per stage."""

    graph: str  # e.g. "g3.forward"
    kind: str  # "inference", "forward" or "backward"
    nodes: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # ATen op -> count
    stages: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    passes: list = field(default_factory=list)  # passes.PassStat per pass
    cache: str = ""  # "", "memory", "disk" or "miss"
    signature: str = ""  # concrete input signature the executable was built for
    padded: bool = False  # built at a bucket's sizes: padded rows hold anything (no index checks)
    notes: list[str] = field(default_factory=list)
    fallback: dict[str, int] = field(default_factory=dict)  # ATen op run eagerly -> node count (fallback=eager)
    kernels: list[dict] = field(default_factory=list)  # {site, kernel, origin}: a registered kernel served it
    collectives: dict[str, int] = field(default_factory=dict)  # "compiled"/"eager" -> collective nodes
    compile_id: object = field(default=None, repr=False)  # Dynamo's, for TORCH_TRACE (structured_trace)

    @contextlib.contextmanager
    def stage(self, name: str):
        from . import _profiler_hooks  # here: importing it imports torch, and this module must not

        start = time.perf_counter()
        try:
            if _profiler_hooks.STATE._is_profiler_enabled:  # torch.profiler records: neuron::compile.<stage>
                with _profiler_hooks.event(f"neuron::compile.{name}"):
                    yield
            else:
                yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def remainder(self, name: str):
        """Time a block whose inner parts time their own stages: what they leave goes under ``name``."""
        start, before = time.perf_counter(), self.total_seconds
        try:
            yield
        finally:
            rest = time.perf_counter() - start - (self.total_seconds - before)
            self.stages[name] = self.stages.get(name, 0.0) + max(0.0, rest)

    @property
    def total_seconds(self) -> float:
        return sum(self.stages.values())

    def as_dict(self) -> dict:
        return {
            "graph": self.graph,
            "kind": self.kind,
            "nodes": self.nodes,
            "ops": dict(self.ops),
            "stages": {k: round(v, 6) for k, v in self.stages.items()},
            "passes": [p.as_dict() if hasattr(p, "as_dict") else dict(p.__dict__) for p in self.passes],
            "cache": self.cache,
            "signature": self.signature,
            "notes": list(self.notes),
            "fallback": dict(self.fallback),
            "kernels": [dict(k) for k in self.kernels],
            "collectives": dict(self.collectives),
        }

    def summary(self) -> str:
        stages = "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in self.stages.items())
        cache = f" cache={self.cache}" if self.cache else ""
        eager = f" eager={dict(self.fallback)}" if self.fallback else ""
        kernels = f" kernels={len(self.kernels)}" if self.kernels else ""
        return (f"{self.graph} [{self.kind}] {self.nodes} nodes, {sum(self.ops.values())} ops{cache}{eager}{kernels}: "
                f"{stages}")


def record(report: CompileReport) -> None:
    with _LOCK:
        _REPORTS.append(report)
    log.debug("compiled %s", report.summary())


def compile_reports() -> list[CompileReport]:
    """Every graph compiled in this process so far, oldest first."""
    with _LOCK:
        return list(_REPORTS)


def reset() -> None:
    """Forget reports and zero the counters (tests call this between cases)."""
    with _LOCK:
        _REPORTS.clear()
        COUNTERS.clear()


def format_table(reports: list[CompileReport]) -> str:
    """Per-graph stage times as a text table (the demo and the CLI print it)."""
    from tabulate import tabulate

    stage_names: list[str] = []
    for r in reports:
        for name in r.stages:
            if name not in stage_names:
                stage_names.append(name)
    kernels = any(r.kernels for r in reports)  # a column only where a registered kernel served something
    rows = []
    for r in reports:
        rows.append(
            [r.graph, r.kind, r.nodes, r.cache or "-"] + ([len(r.kernels)] if kernels else [])
            + [f"{r.stages[s] * 1e3:.1f}" if s in r.stages else "" for s in stage_names]
            + [f"{r.total_seconds * 1e3:.1f}"]
        )
    headers = (["graph", "kind", "nodes", "cache"] + (["kernels"] if kernels else [])
               + [f"{s} ms" for s in stage_names] + ["total ms"])
    return tabulate(rows, headers=headers, tablefmt="simple")
