"""Our stages in ``TORCH_TRACE``, for ``tlparse``: one artifact per stage of each graph the backend compiles.

``TORCH_TRACE=/tmp/trace python train.py`` makes torch write its structured log
(Dynamo's frames, AOTAutograd's graphs, guards...); ``tlparse /tmp/trace/*.log``
renders it as a page per compile id. Every graph ``torch.compile`` hands our
backend logs beside those, under the same compile id
(``_profiler_hooks.trace_artifact``: a ``trace_structured`` artifact):

    neuron_bucketing_<graph>          json    the bucketing analysis: bucketed or not, and why
    neuron_stablehlo_lowered_<graph>  string  StableHLO as lowering gives it (before our passes)
    neuron_stablehlo_final_<graph>    string  StableHLO after our passes, as XLA gets it
    neuron_passes_<graph>             json    the pass report (padding, fusions... per pass)
    neuron_cache_<graph>              json    the cache key (digest and each part's hash) and hit or miss
    neuron_compile_report_<graph>     json    the compile report: stage times, ops, cache, signature
    neuron_lowering_error_<graph>     json    a lowering or pass failure: message, op, source line, repro folder

Eager ops (``kind == "eager"``) log nothing: they have no compile id, and a
trace of a training step would hold thousands. With no trace written each
function costs one check of the trace log's handlers.
"""

from __future__ import annotations

from ._profiler_hooks import trace_active
from ._profiler_hooks import trace_artifact as _artifact


def trace_artifact(compile_id, name: str, encoding: str, payload_fn) -> None:
    _artifact(name, encoding, payload_fn, compile_id=compile_id)


def _logged(report) -> bool:
    return report.kind != "eager" and trace_active()


def _name(what: str, report) -> str:
    return f"neuron_{what}_{report.graph}"


def bucketing(graph: str, kind: str, analysis, buckets) -> None:
    """The bucketing decision of a graph with symbolic sizes (``bucketing.analyze``)."""
    if kind == "eager" or not trace_active():
        return

    def payload():
        return {"graph": graph, "buckets": buckets if isinstance(buckets, int) else list(buckets),
                "bucketed": bool(analysis.ok), "reason": analysis.reason or "",
                "symbols": [str(s) for s in getattr(analysis, "symbols", ()) or ()],
                "one_size": bool(getattr(analysis, "one_size", False))}

    _artifact(f"neuron_bucketing_{graph}", "json", payload)


def stablehlo(report, stage: str, module) -> None:
    """``stage`` "lowered" (before the passes) or "final" (what XLA compiles); ``module``: an MLIR module or its text."""
    if _logged(report):
        trace_artifact(report.compile_id, _name(f"stablehlo_{stage}", report), "string",
                       lambda: module if isinstance(module, str) else str(module))


def passes(report) -> None:
    if _logged(report):
        trace_artifact(report.compile_id, _name("passes", report), "json",
                       lambda: [p.as_dict() if hasattr(p, "as_dict") else dict(p.__dict__) for p in report.passes])


def cache(report, front, result) -> None:
    """The FX-level key ``front`` and where the executable came from (memory, disk or a miss: compiled)."""
    if _logged(report):
        trace_artifact(report.compile_id, _name("cache", report), "json", lambda: {
            "graph": report.graph, "result": result.source, "key": front.digest if front is not None else None,
            "key_parts": front.part_hashes() if front is not None else {},
            "seconds_saved": round(result.seconds_saved, 6), "bytes_read": result.bytes_read,
            "bytes_written": result.bytes_written})


def compile_report(report) -> None:
    if _logged(report):
        trace_artifact(report.compile_id, _name("compile_report", report), "json", report.as_dict)


def lowering_error(report, exc: BaseException) -> None:
    if _logged(report):
        trace_artifact(report.compile_id, _name("lowering_error", report), "json", lambda: {
            "graph": report.graph, "error": type(exc).__name__, "message": str(exc),
            "op": getattr(exc, "op", None), "source": getattr(exc, "source", None),
            "stage": getattr(exc, "stage", None), "repro_dir": getattr(exc, "repro_dir", None)})
