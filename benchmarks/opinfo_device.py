"""Device mode of the OpInfo harness: every sample run EAGERLY on the ``neuron`` device, against CPU eager.

``python benchmarks/opinfo_coverage.py --device ...`` (or this file, the same
options): no ``torch.compile``. Each sample's tensors (input, args, kwargs,
recursively through lists, tuples and dicts) are copied to ``"neuron"``
(``requires_grad`` kept: the device copies are the leaves; ``HOST_ARGS``, the
arguments PyTorch wants on the host for any device, stay there; a factory's
``device="cpu"`` becomes ``"neuron"``), the op is
called there (each ATen op it reaches is traced and compiled per signature by
``neuron_compile.device``) after the same ``torch.manual_seed`` as the CPU run
(the device draws from CPU's generator), the results come back with ``.cpu()``
and are compared with CPU eager's by ``opinfo_coverage.compare_op`` (non-unique outputs
judged as in the other modes). Backward (float32, ops that support autograd):
the input gradients of ``sum(out * w)`` over the float outputs, ``w`` fixed
random weights (the compiled mode's loss; a plain ``.sum()`` makes the
gradients of normalizing ops such as softmax and layer_norm zero, which
compares nothing), computed on the device against CPU's. Statuses:

    pass            the device's result equals CPU eager's
    mismatch        it ran, the numbers differ (the difference is kept)
    does-not-lower  LoweringError while compiling an ATen op for the device
    xla-rejects     XlaCompileError
    crash           anything else (the error's first line, and the ATen op
                    being dispatched, from the traceback, in ``aten``), a
                    segfault or a timeout of the worker

Each record names, in ``aten``, the innermost ATen op the device was running
when it failed. Workers run with ``NEURON_COMPILE_FALLBACK=error`` (an op that
does not lower is a failure, not a silent host run) and the artifact cache as
the environment sets it (on by default: ``NEURON_COMPILE_CACHE_DIR``); a worker
handles ``--ops-per-worker`` ops, then the next one starts (its executables
are freed). Raw records: ``~/.cache/neuron_compile/opinfo_device.jsonl``;
table: ``benchmarks/results/opinfo_device.{md,json}``, beside the compiled
single-sample results of ``benchmarks/results/opinfo.json`` (which ops pass
compiled and not on the device, by cause).

    nice -n 10 python benchmarks/opinfo_coverage.py --device --max-samples 2 --resume
    python benchmarks/opinfo_coverage.py --device --ops add,softmax --raw /tmp/d.jsonl --table-to /tmp/d
    python benchmarks/opinfo_coverage.py --device --table          # rebuild the table only
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from opinfo_coverage import (RAW, RESULTS, STATUSES, _compare, _first_line, _jobs, _make_fn,  # noqa: E402
                             _split, compare_op, first_samples, is_shape_only, load_raw, ops_by_name)

RAW_DEVICE = RAW.with_name("opinfo_device.jsonl")
DEVICE_JOBS = ("float32 forward", "float32 backward", "int64 forward")
DEVICE_STATUSES = tuple(s for s in STATUSES if s != "graph-break")
_ATEN_IN_TEXT = re.compile(r"aten(?:::|\.)[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?")
# c10's "convolution_overrideable not implemented", raised below the Python kernels
_NOT_IMPLEMENTED = re.compile(r"^([a-z_][a-z0-9_]*) not implemented")
# Tensor arguments PyTorch requires on the host whatever the input's device (a CUDA run keeps them on CPU
# too): op -> positions among the sample's args.
HOST_ARGS = {"tensor_split": (0,)}


def device_mode(dtypes, backward: bool) -> str:
    """The mode of this run's "done" records: a resumed run skips only ops finished with the same jobs."""
    return f"device {','.join(dtypes)}" + ("" if backward else " no-backward")


# --------------------------------------------------------------------------- worker


def _aten_op(exc: BaseException) -> str:
    """The innermost ATen op the neuron device was dispatching when ``exc`` was raised (from its traceback's
    frames in neuron_compile/device: their ``op`` local), else the first ATen op its messages name."""
    import torch

    from neuron_compile.lowering import exception_chain

    found = None
    for e in exception_chain(exc):
        tb = e.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if "neuron_compile" in frame.f_code.co_filename and "device" in frame.f_code.co_filename:
                op = frame.f_locals.get("op")
                if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                    found = str(op)
            tb = tb.tb_next
        if found:
            return found.replace("aten::", "aten.")
    for e in exception_chain(exc):
        m = _ATEN_IN_TEXT.search(str(e))
        if m:
            return m.group(0).replace("aten::", "aten.")
        m = _NOT_IMPLEMENTED.match(str(e).strip())
        if m:
            return f"aten.{m.group(1)}"
    return ""


def _classify(exc: BaseException) -> tuple[str, str, str]:
    """(status, message, aten op) of an exception raised on the device."""
    from neuron_compile.lowering import LoweringError, exception_chain, innermost_exception
    from neuron_compile.runtime.executor import XlaCompileError

    aten = _aten_op(exc)
    for e in exception_chain(exc):
        if isinstance(e, LoweringError):
            said = next((line.split(" said: ", 1)[1] for line in str(e).splitlines() if " said: " in line), "")
            return "does-not-lower", f"{e.op or '?'} [{e.stage}]" + (f": {said[:200]}" if said else ""), aten
        if isinstance(e, XlaCompileError):
            return "xla-rejects", _first_line(e), aten
    inner = innermost_exception(exc)
    return "crash", f"{type(inner).__name__}: {_first_line(inner)}", aten


def _device_kwargs(sample) -> None:
    """A factory's ``device=`` of the sample's device (cpu) becomes neuron: what OpInfo generates for a device."""
    import torch

    device = sample.kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        sample.kwargs = {**sample.kwargs, "device": "neuron"}


def _device_tensors(op, sample, tensors: list) -> list:
    """The sample's tensor leaves (``_split``'s order) on neuron, except those in ``HOST_ARGS``."""
    from torch.utils._pytree import tree_flatten

    keep = set()
    for position in HOST_ARGS.get(op.name, ()):
        if position < len(sample.args):
            keep.update(id(t) for t in tree_flatten(sample.args[position])[0])
    return [t if id(t) in keep else _to_device(t) for t in tensors]


def _to_device(obj):
    """Every tensor of a sample's (input, args, kwargs) copied to neuron; requires_grad kept (as a leaf)."""
    import torch

    if type(obj) in (list, tuple):
        return type(obj)(_to_device(x) for x in obj)
    if type(obj) is dict:
        return {k: _to_device(v) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("neuron").requires_grad_(obj.requires_grad)
    return obj


def _to_cpu(obj, seen: list):
    """A device result on the host (any pytree: return_types keep their type); ``seen`` collects the
    devices of its tensors."""
    import torch
    from torch.utils._pytree import tree_map

    def one(x):
        if isinstance(x, torch.Tensor):
            seen.append(x.device.type)
            return x.cpu()
        return x

    return tree_map(one, obj, is_leaf=lambda x: isinstance(x, torch.Size))  # a Size stays a Size, not a tuple


class _Failed(Exception):
    """A device step failed: carries the status triple."""

    def __init__(self, status, message, aten=""):
        super().__init__(message)
        self.triple = (status, message, aten)


def _on_device(step: str, fn):
    try:
        return fn()
    except Exception as exc:
        status, msg, aten = _classify(exc)
        if step and status == "crash":
            msg = f"{step}: {msg}"
        raise _Failed(status, msg, aten) from exc


def run_forward(op, sample, dtype_name, shape_only) -> dict:
    """The op on CPU, then on neuron; the same seed before each (the device draws from CPU's generator)."""
    import torch

    tensors, rebuild = _split(sample)
    fn = _make_fn(op, rebuild)
    try:
        torch.manual_seed(0)
        ref = fn(*[t.clone() for t in tensors])
    except Exception as exc:
        return dict(status="eager-error", error=_first_line(exc))
    try:
        inputs, out = _call_on_device(op, sample, tensors, "")
        devices: list = []
        got = _on_device("reading the result back (.cpu())", lambda: _to_cpu(out, devices))
    except _Failed as f:
        status, msg, aten = f.triple
        return dict(status=status, error=msg, aten=aten)
    extra = {"host_outputs": devices.count("cpu")} if "cpu" in devices else {}
    try:
        compare_op(op, sample, got, ref, dtype_name, shape_only)
        return dict(status="pass", error="", **extra)
    except AssertionError as exc:
        return dict(status="mismatch", error=" ".join(str(exc).split())[:300], **extra)


def _call_on_device(op, sample, tensors, stage: str):
    """The sample moved to neuron (its kwargs too) and the op called on it under seed 0: (inputs, output)."""
    import torch

    inputs = _on_device("moving the sample to neuron", lambda: _device_tensors(op, sample, tensors))
    _device_kwargs(sample)
    fn = _make_fn(op, _split(sample)[1])
    torch.manual_seed(0)
    return inputs, _on_device(stage, lambda: fn(*inputs))


def _weights(outputs):
    import torch

    gen = torch.Generator().manual_seed(0)
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outputs]


def run_backward(op, sample, shape_only) -> dict:
    """Input gradients of sum(out * w) over the float outputs: on neuron against CPU."""
    import torch
    from torch.utils._pytree import tree_flatten

    tensors, rebuild = _split(sample)
    fn = _make_fn(op, rebuild)

    def float_outputs(out):
        return [o for o in tree_flatten(out)[0]
                if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]

    try:
        inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        torch.manual_seed(0)
        leaves = float_outputs(fn(*inputs))
        wanted = [t for t in inputs if t.requires_grad]
        if not leaves or not wanted:
            return dict(status="no-grad", error="")
        loss = sum((o * w).sum() for o, w in zip(leaves, _weights(leaves)))
        ref = torch.autograd.grad(loss, wanted, allow_unused=True)
    except Exception as exc:
        return dict(status="eager-error", error=_first_line(exc))
    try:
        dev, out = _call_on_device(op, sample, tensors, "forward")
        leaves = float_outputs(out)
        wanted = [t for t in dev if t.requires_grad]
        if not leaves:
            return dict(status="mismatch", error="no float output requires grad on the device (CPU's does)")
        weights = _on_device("moving the weights to neuron",
                             lambda: [w.to(o.device) for o, w in zip(leaves, _weights(leaves))])
        loss = _on_device("forward (the loss)", lambda: sum((o * w).sum() for o, w in zip(leaves, weights)))
        grads = _on_device("backward", lambda: torch.autograd.grad(loss, wanted, allow_unused=True))
        devices: list = []
        got = _on_device("reading the gradients back (.cpu())", lambda: _to_cpu(tuple(grads), devices))
    except _Failed as f:
        status, msg, aten = f.triple
        return dict(status=status, error=msg, aten=aten)
    extra = {"host_outputs": devices.count("cpu")} if "cpu" in devices else {}
    try:
        _compare(got, tuple(ref), "float32", shape_only)
        return dict(status="pass", error="", **extra)
    except AssertionError as exc:
        return dict(status="mismatch", error=" ".join(str(exc).split())[:300], **extra)


def worker(names: list[str], dtypes, max_samples: int, backward: bool, skip: set, ops_per_worker: int) -> None:
    """Run ops on the device; one JSON line per event on stdout, as ``opinfo_coverage.worker`` writes them.
    Stops after ``ops_per_worker`` ops (the supervisor starts the next worker for the rest)."""
    import logging
    import warnings

    import neuron_compile.device

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.CRITICAL)
    neuron_compile.device.register()  # import torch did, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0
    by_name = ops_by_name()
    mode = device_mode(dtypes, backward)

    def emit(**record):
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    for name in names[:max(ops_per_worker, 1)]:
        op = by_name[name]
        for dtype_name, direction in _jobs(op, dtypes, max_samples, backward):
            try:
                samples = first_samples(op, dtype_name, direction, max_samples)
            except Exception as exc:
                emit(kind="note", op=name, dtype=dtype_name, direction=direction,
                     note=f"sample_inputs failed: {_first_line(exc)}")
                continue
            for index, sample in enumerate(samples):
                key = f"{dtype_name}:{direction}:{index}"
                if f"{name}|{key}" in skip:
                    continue
                emit(kind="begin", op=name, key=key)
                shape_only = is_shape_only(op, sample)
                start = time.perf_counter()
                try:
                    if direction == "forward":
                        result = run_forward(op, sample, dtype_name, shape_only)
                    else:
                        result = run_backward(op, sample, shape_only)
                except Exception as exc:  # the harness itself must not die on one sample
                    result = dict(status="crash", error=f"harness: {type(exc).__name__}: {_first_line(exc)}")
                    traceback.print_exc(file=sys.stderr)
                emit(kind="sample", op=name, dtype=dtype_name, direction=direction, index=index,
                     seconds=round(time.perf_counter() - start, 3), shape_only=shape_only or None,
                     **{"aten": "", **result})
        emit(kind="done", op=name, mode=mode)


# --------------------------------------------------------------------------- table


def _counted(counts: dict) -> int:
    return sum(counts.get(s, 0) for s in DEVICE_STATUSES)


def _failure_cause(rec) -> str:
    """What groups failures: the status and the error with numbers of a sample's own (sizes, values) blurred."""
    error = rec.get("error", "")
    if rec["status"] == "mismatch":
        error = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", error)
        error = error.split(" Greatest")[0][:120]
    elif rec["status"] == "does-not-lower":  # SSA names and constants of one graph
        error = re.sub(r"value = -?\d+", "value = N", re.sub(r"%\d+", "%N", error))
    return f"{rec['status']}: {error[:160]}"


def summarize(raw: Path, *more: Path) -> dict:
    samples, _ = load_raw(raw, *more)
    done = defaultdict(set)
    for one in (raw, *more):
        if one.exists():
            for line in one.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("kind") == "done":
                    done[rec.get("mode", "")].add(rec["op"])
    per_op = {}
    totals = defaultdict(Counter)
    ops_totals = defaultdict(Counter)
    causes = defaultdict(lambda: defaultdict(list))  # job -> cause -> [(op, index, aten)]
    worker_losses = []
    max_samples = 0
    for op in sorted(samples):
        jobs = defaultdict(dict)
        for key, rec in samples[op].items():
            if key != "notes":
                jobs[f"{rec['dtype']} {rec['direction']}"][rec["index"]] = rec
        info = {"jobs": {}, "notes": [n["note"] for n in samples[op].get("notes", [])]}
        for job in sorted(jobs, key=_job_key):
            recs = [jobs[job][i] for i in sorted(jobs[job])]
            max_samples = max(max_samples, len(recs))
            counts = Counter(r["status"] for r in recs)
            totals[job].update(counts)
            if _counted(counts):
                ops_totals[job]["ops"] += 1
                ops_totals[job]["all pass"] += counts["pass"] == _counted(counts)
            failing = [r for r in recs if r["status"] in DEVICE_STATUSES and r["status"] != "pass"]
            for r in failing:
                causes[job][_failure_cause(r)].append((op, r["index"], r.get("aten", "")))
                if r["status"] == "crash" and r.get("seconds") is None:
                    worker_losses.append({"op": op, "job": job, "index": r["index"], "error": r["error"]})
            first = failing[0] if failing else None
            info["jobs"][job] = {"counts": dict(counts),
                                 "first_error": first and {k: first.get(k)
                                                           for k in ("index", "status", "error", "aten")},
                                 "host_outputs": sum(r.get("host_outputs", 0) for r in recs) or None}
        per_op[op] = info
    return {"ops": per_op, "totals": {job: dict(c) for job, c in totals.items()},
            "ops_totals": {job: dict(c) for job, c in ops_totals.items()},
            "causes": {job: {cause: [{"op": o, "index": i, "aten": a} for o, i, a in hits]
                             for cause, hits in sorted(c.items(), key=lambda kv: -len(kv[1]))}
                       for job, c in sorted(causes.items(), key=lambda kv: _job_key(kv[0]))},
            "worker_losses": worker_losses, "max_samples": max_samples,
            "ops_done": {mode: len(ops) for mode, ops in sorted(done.items())}}


def _job_key(job: str):
    return DEVICE_JOBS.index(job) if job in DEVICE_JOBS else len(DEVICE_JOBS)


def compare_with_compiled(summary: dict, compiled_path: Path) -> dict:
    """Per job: the ops that pass compiled (every sample of opinfo.json's job), which of them the device run
    covered, which pass there too, and the others by the device's first failure."""
    try:
        compiled = {op: info.get("jobs", {}) for op, info in json.loads(compiled_path.read_text())["ops"].items()}
    except (OSError, json.JSONDecodeError, KeyError):
        return {}
    out = {}
    for job in sorted({j for info in summary["ops"].values() for j in info["jobs"]}, key=_job_key):
        passing, covered, both, fails = [], 0, 0, defaultdict(list)
        for op, info in summary["ops"].items():
            c = compiled.get(op, {}).get(job) or {}
            counted = sum(c.get(s, 0) for s in STATUSES)
            if not counted or c.get("pass", 0) != counted:
                continue
            passing.append(op)
            dev = info["jobs"].get(job)
            if not dev or not _counted(dev["counts"]):
                continue
            covered += 1
            if dev["first_error"] is None:
                both += 1
            else:
                e = dev["first_error"]
                fails[_failure_cause(e)].append({"op": op, "aten": e.get("aten") or "", "index": e["index"]})
        out[job] = {"compiled_pass": len(passing), "covered": covered, "device_pass": both,
                    "compiled_only": {cause: ops for cause, ops in sorted(fails.items(), key=lambda kv: -len(kv[1]))}}
    return out


def _rate(counts: dict) -> str:
    counted = _counted(counts)
    return f"{counts.get('pass', 0)}/{counted} ({100 * counts.get('pass', 0) / max(counted, 1):.1f}%)"


def _cell(text: str, limit: int = 200) -> str:
    return text[:limit].replace("|", "/").replace("\n", " ")


def _op_list(hits, limit=12, cause="") -> str:
    """Ops with the ATen op each failed in, where the cause does not name it already (once when they share it)."""
    names = []
    atens = {h.get("aten") or "" for h in hits}
    if len(atens) == 1 and len({h["op"] for h in hits}) > 1 and next(iter(atens)) and next(iter(atens)) not in cause:
        return f"all in {next(iter(atens))}: " + _op_list([{**h, "aten": ""} for h in hits], limit)
    for h in hits:
        label = h["op"] + (f" ({h['aten']})" if h.get("aten") and h["aten"] not in cause else "")
        if label not in names:
            names.append(label)
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def write_table(summary: dict, compare: dict, out_dir: Path, meta: dict, compiled: dict) -> None:
    """``compiled``: op -> job -> counts of the compiled single-sample table (opinfo.json)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "opinfo_device.json").write_text(
        json.dumps({"meta": meta, **summary, "compiled": compare}, indent=1, sort_keys=True) + "\n")
    done = ", ".join(f"{n} ({mode})" for mode, n in summary["ops_done"].items()) or "none"
    lines = ["# OpInfo coverage of the `neuron` device (eager)", "",
             f"Generated by `benchmarks/opinfo_coverage.py --device` ({meta.get('note', '')}). "
             f"Ops finished: {done} of {meta.get('op_db', '?')} OpInfo entries. Each sample runs eagerly on the "
             "neuron device (its tensors copied there, the op called, the results brought back with `.cpu()`) and "
             "is compared with CPU eager; no torch.compile. At most "
             f"{meta.get('max_samples')} samples per op, dtype and direction (the first ones OpInfo generates). "
             "Statuses: pass, mismatch, does-not-lower (LoweringError), xla-rejects (XlaCompileError), crash "
             "(anything else; the ATen op the device was dispatching in parentheses). Backward: input gradients of "
             "sum(out * w) over the float outputs. Samples whose CPU eager run raises are left out.", ""]
    if meta.get("incomplete"):
        lines += [f"**Incomplete run:** {meta['incomplete']}", ""]
    lines += ["## Totals (samples)", "",
              "| job | pass rate | " + " | ".join(DEVICE_STATUSES[1:]) + " | ops all-pass |",
              "| --- | --- | " + " | ".join("---" for _ in DEVICE_STATUSES[1:]) + " | --- |"]
    for job in sorted(summary["totals"], key=_job_key):
        c = summary["totals"][job]
        o = summary["ops_totals"].get(job, {})
        lines.append(f"| {job} | {_rate(c)} | " + " | ".join(str(c.get(s, 0)) for s in DEVICE_STATUSES[1:])
                     + f" | {o.get('all pass', 0)}/{o.get('ops', 0)} |")
    if compare:
        lines += ["", "## Against the compiled single-sample results (`opinfo.json`)", "",
                  "Ops whose every compiled sample passes (`torch.compile(fullgraph=True)`, up to 4 samples), of "
                  "those the ops this run covered, and how many of them pass every device sample.", "",
                  "| job | pass compiled | covered here | also pass on the device | fail on the device |",
                  "| --- | --- | --- | --- | --- |"]
        for job, c in compare.items():
            lines.append(f"| {job} | {c['compiled_pass']} | {c['covered']} | {c['device_pass']} | "
                         f"{c['covered'] - c['device_pass']} |")
        for job, c in compare.items():
            if not c["compiled_only"]:
                continue
            lines += ["", f"### {job}: pass compiled, fail on the device", "",
                      "By the device's first failing sample; op (ATen op dispatched when it failed).", "",
                      "| cause | ops | which |", "| --- | --- | --- |"]
            for cause, ops in c["compiled_only"].items():
                lines.append(f"| {_cell(cause)} | {len(ops)} | {_cell(_op_list(ops, 40, cause), 2000)} |")
    lines += ["", "## Device failures by cause (samples)", ""]
    for job, causes in summary["causes"].items():
        lines += [f"### {job}", "", "| cause | samples | ops (ATen op) |", "| --- | --- | --- |"]
        for cause, hits in causes.items():
            lines.append(f"| {_cell(cause)} | {len(hits)} | {_cell(_op_list(hits, 12, cause), 1200)} |")
        lines.append("")
    if summary["worker_losses"]:
        lines += ["## Samples that killed or hung a worker", "",
                  "| op | job | sample | what |", "| --- | --- | --- | --- |"]
        for w in summary["worker_losses"]:
            lines.append(f"| {w['op']} | {w['job']} | {w['index']} | {w['error']} |")
        lines.append("")
    lines += ["## Failing ops", "",
              "Every (op, job) with a device sample that does not pass: device pass/counted, the compiled result "
              "from `opinfo.json` (pass/counted), the first failing sample's error.", "",
              "| op | job | device | compiled | first error |", "| --- | --- | --- | --- | --- |"]
    for op, info in summary["ops"].items():
        for job, j in info["jobs"].items():
            if not j["first_error"]:
                continue
            c = j["counts"]
            one = compiled.get(op, {}).get(job)
            one_cell = f"{one.get('pass', 0)}/{sum(one.get(s, 0) for s in STATUSES)}" if one else ""
            e = j["first_error"]
            err = f"#{e['index']} {e['status']}: {e['error']}" + (
                f" ({e['aten']})" if e.get("aten") and e["aten"] not in e["error"] else "")
            lines.append(f"| {op} | {job} | {c.get('pass', 0)}/{_counted(c)} | {one_cell} | {_cell(err, 220)} |")
    (out_dir / "opinfo_device.md").write_text("\n".join(lines) + "\n")


def table(raw: Path, more: list[Path], out_dir: Path, meta: dict) -> dict:
    summary = summarize(raw, *more)
    meta = {**meta, "max_samples": summary.pop("max_samples") or meta.get("max_samples")}
    compiled_path = RESULTS / "opinfo.json"
    compare = compare_with_compiled(summary, compiled_path)
    try:
        counts = {op: info.get("jobs", {}) for op, info in json.loads(compiled_path.read_text())["ops"].items()}
    except (OSError, json.JSONDecodeError, KeyError):
        counts = {}
    write_table(summary, compare, out_dir, meta, counts)
    for job, counts_ in sorted(summary["totals"].items(), key=lambda kv: _job_key(kv[0])):
        print(f"{job}: {_rate(counts_)}  " + " ".join(f"{s}={counts_.get(s, 0)}" for s in DEVICE_STATUSES[1:]))
    for job, c in compare.items():
        print(f"{job}: {c['compiled_pass']} ops pass compiled, {c['covered']} covered, "
              f"{c['device_pass']} of them pass on the device")
    return summary


if __name__ == "__main__":
    from opinfo_coverage import main

    sys.exit(main(["--device", *sys.argv[1:]]))
