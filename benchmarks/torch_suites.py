"""PyTorch's own device-generic test files on ``neuron``, against the same tests on CPU.

PyTorch tests every backend in its tree with the same files:
``instantiate_device_type_tests`` makes a class per device type from a generic
one, and an out-of-tree PrivateUse1 backend gets its own (``TestViewOpsNEURON``,
``test_t_inplace_view_neuron``) once ``neuron`` is registered, which installing
this package does at ``import torch``. This harness runs PyTorch's
``test_view_ops.py``, ``test_optim.py`` and a fixed sample of ``test_modules.py``
(one test in 8, the same on both sides: ``--sample``) for both ``cpu`` and
``neuron`` and compares them test by test, with the time each side took.

The files are PyTorch's, not ours: nothing of them is committed here.
``torch_suites_files.py`` pins each to a commit of a public repository with
its sha256 (and the few recorded edits that make it import under torch
2.13), and puts it in ``~/.cache/neuron_compile/torch_suites/files/``
(``--files-dir``): downloaded from raw.githubusercontent.com, or, without the
internet, seeded from a local copy with ``--tests-dir DIR`` (the pinned
commit's file, raw or edited). A file whose sha256 is not the recorded one is
refused. A file of ``--files`` that is not pinned (a test's own) runs from
``--tests-dir`` as it is.

Each (file, device) runs in pytest processes with ``torch_suites_plugin``:
every test writes a ``start`` and a ``result`` line to a JSONL file as it
runs. A test that kills its process (a segfault) is a ``crash``; one that
runs past ``--timeout`` seconds is a ``hang`` (a watchdog ends the process);
either way pytest starts again from the next test, so one crash costs one
test, never the run. Tests that are not device-generic (no CPU/neuron class,
or a class made for CPU only) are left out on both sides.

The score (the bar issues 39 and 40 set): of the tests that pass on CPU, the
share that passes on ``neuron``. A test skipped on ``neuron`` but not on CPU is
not a pass, unless PyTorch's own device rules skip it (``onlyCPU``,
``onlyNativeDeviceTypes``, "fewer than 2 devices": ``PYTORCH_SKIPS``): those are
taken out of the count and shown apart. The rest are listed by cause (the
error's first line, numbers blanked).

    python benchmarks/torch_suites.py                                            # all three, both devices
    python benchmarks/torch_suites.py --tests-dir DIR                            # seeded from local copies
    python benchmarks/torch_suites.py --files test_view_ops.py -k inplace_view
    python benchmarks/torch_suites.py --table                                    # rebuild the table only

Raw records: ``~/.cache/neuron_compile/torch_suites/<file>.<device>.jsonl``
(``--raw``); ``--resume`` keeps them and runs only the tests without a record.
The device's caches (artifacts, op index) go in ``<raw>/compile-cache`` unless
``NEURON_COMPILE_CACHE_DIR`` says otherwise: a suite's run neither reads nor
fills the cache other work on the machine uses.
Table: ``benchmarks/results/torch_suites.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_suites_files as suite_files  # noqa: E402

HERE = Path(__file__).resolve().parent
FILES = ("test_view_ops.py", "test_modules.py", "test_optim.py")
DEVICES = ("cpu", "neuron")
RAW = Path.home() / ".cache" / "neuron_compile" / "torch_suites"
RESULTS = HERE / "results" / "torch_suites"
SAMPLE_RULE = ("one test in K: zlib.crc32 of the test's id with the device word replaced by DEV "
               "(torch_suites.generic_id), modulo K, equal to 0; the same tests on both devices")
# skip reasons of PyTorch's device-type decorators (common_device_type): the test's authors keep it off
# every backend but some; not a gap of ours. test_optim.py's fused tests skip a device missing from the
# optimizer's ``supports_fused_on`` in PyTorch's optim_db (cpu, cuda, xpu, mps: a fixed list in the test
# database, not a property the device reports)
PYTORCH_SKIPS = ("Only runs on ", "onlyNativeDeviceTypes", "fewer than ", "onlyAccelerator", "doesn't run on ",
                 "is not supported for fused on ")


# --- running ---------------------------------------------------------------------------------

def run_suite(tests_dir: Path, file: str, device: str, raw: Path, keyword: str | None, timeout: float,
              budget: float | None, sample: int = 1) -> Path:
    """Run ``file``'s tests for ``device`` until every collected test has a record; returns the JSONL."""
    records = raw / f"{file}.{device}.jsonl"
    env = dict(os.environ)
    env.update(TORCH_SUITES_RECORDS=str(records), TORCH_SUITES_TIMEOUT=str(timeout),
               TORCH_SUITES_DEVICE=device, TORCH_SUITES_SAMPLE=str(sample), PYTHONPATH=os.pathsep.join(
                   [str(HERE), str(tests_dir)] + [p for p in [env.get("PYTHONPATH")] if p]),
               NEURON_COMPILE_FALLBACK="error")
    env.setdefault("NEURON_COMPILE_CACHE_DIR", str(raw / "compile-cache"))
    command = [sys.executable, "-m", "pytest", file, "-q", "-p", "torch_suites_plugin", "-p", "no:cacheprovider",
               "-o", "addopts=", "--tb=short", "-rN", "--continue-on-collection-errors"]
    if keyword:
        command += ["-k", keyword]
    started = time.monotonic()
    while True:
        before = _record_count(records)
        left = None if budget is None else budget - (time.monotonic() - started)
        if left is not None and left <= 0:
            print(f"  {file} [{device}]: time budget spent; --resume goes on", flush=True)
            break
        try:
            proc = subprocess.run(command, cwd=tests_dir, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=left)
        except subprocess.TimeoutExpired:  # the budget ran out mid-run: the test that was running goes on later
            print(f"  {file} [{device}]: time budget spent; --resume goes on", flush=True)
            break
        dead = _mark_crash(records, proc.returncode)
        after = _record_count(records)
        print(f"  {file} [{device}]: pytest exited {proc.returncode}, {after} tests recorded"
              + (f", crash in {dead}" if dead else ""), flush=True)
        if proc.returncode in (0, 1, 5) and not dead:
            break  # a full pass: every collected test has a record
        if after == before and not dead:
            break  # nothing moved (a collection error): stop rather than loop
    return records


def _record_count(records: Path) -> int:
    return sum(1 for r in load(records).values())


def _mark_crash(records: Path, returncode: int) -> str | None:
    """A ``start`` with nothing after it: the test killed the process."""
    if not records.exists():
        return None
    last_start, finished = None, set()
    for record in _lines(records):
        if record["event"] == "start":
            last_start = record["id"]
        else:
            finished.add(record["id"])
    if last_start is None or last_start in finished:
        return None
    with open(records, "a") as f:
        f.write(json.dumps({"event": "crash", "id": last_start, "returncode": returncode}) + "\n")
    return last_start


def _lines(path: Path):
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def load_seconds(path: Path) -> dict:
    """nodeid -> seconds the test ran (its last ``result`` record; a hang counts its timeout)."""
    out = {}
    if path.exists():
        for record in _lines(path):
            if record["event"] == "result" and "seconds" in record:
                out[record["id"]] = float(record["seconds"])
            elif record["event"] == "hang":
                out[record["id"]] = float(record.get("seconds") or 0.0)
    return out


def load(path: Path) -> dict:
    """nodeid -> (outcome, message) for every test with a final record."""
    out = {}
    if not path.exists():
        return out
    for record in _lines(path):
        event = record["event"]
        if event == "result":
            out[record["id"]] = (record["outcome"], record.get("message", ""))
        elif event == "crash":
            out[record["id"]] = ("crash", f"process died (return code {record.get('returncode')})")
        elif event == "hang":
            out[record["id"]] = ("hang", f"still running after {record.get('seconds')} s")
    return out


# --- comparing -------------------------------------------------------------------------------

_DEVICE_WORD = re.compile(r"(?i)(cpu|neuron|privateuse1)")


def generic_id(nodeid: str) -> str:
    """``test_view_ops.py::TestViewOpsNEURON::test_t_inplace_view_neuron`` and its CPU twin, alike."""
    return _DEVICE_WORD.sub("DEV", nodeid)


def cause(message: str) -> str:
    text = message.strip().splitlines()[0] if message.strip() else "(no message)"
    text = re.sub(r"0x[0-9a-fA-F]+", "<address>", text)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", text)
    return text[:140]


def compare(raw: Path, files=FILES) -> dict:
    summary = {}
    for file in files:
        cpu, dev = load(raw / f"{file}.cpu.jsonl"), load(raw / f"{file}.neuron.jsonl")
        if not cpu and not dev:
            continue
        cpu_seconds, dev_seconds = load_seconds(raw / f"{file}.cpu.jsonl"), load_seconds(raw / f"{file}.neuron.jsonl")
        dev_seconds_by_generic = {generic_id(k): v for k, v in dev_seconds.items()}
        dev_by_generic = {generic_id(k): v for k, v in dev.items()}
        cpu_passing = [k for k, (outcome, _) in cpu.items() if outcome == "passed"]
        rows = Counter()
        causes = defaultdict(list)
        listed = []
        for test in cpu_passing:
            outcome, message = dev_by_generic.get(generic_id(test), ("not run", ""))
            if outcome == "skipped" and any(reason in message for reason in PYTORCH_SKIPS):
                outcome = "pytorch skip"
            rows[outcome] += 1
            if outcome not in ("passed", "pytorch skip"):
                key = f"{outcome}: {cause(message)}" if outcome in ("failed", "error") else \
                    f"{outcome}: {cause(message)}" if outcome in ("skipped", "xfailed") else outcome
                causes[key].append(generic_id(test).split("::")[-1])
                listed.append({"test": generic_id(test), "outcome": outcome, "message": message[:300]})
        dev_crashes = [k for k, (o, _) in dev.items() if o in ("crash", "hang")]
        # time against CPU's: the CPU-passing tests the neuron run reached, each side's seconds summed
        timed = [t for t in cpu_passing if t in cpu_seconds and generic_id(t) in dev_seconds_by_generic]
        seconds_cpu = sum(cpu_seconds[t] for t in timed)
        seconds_dev = sum(dev_seconds_by_generic[generic_id(t)] for t in timed)
        summary[file] = {
            "cpu_collected": len(cpu), "cpu_passed": len(cpu_passing) - rows["pytorch skip"],
            "skipped_by_pytorch_rules": rows["pytorch skip"],
            "neuron_collected": len(dev), "neuron_passed_of_cpu_passing": rows["passed"],
            "outcomes": dict(rows), "crashes": sum(o == "crash" for o, _ in dev.values()),
            "hangs": sum(o == "hang" for o, _ in dev.values()), "crashed_or_hung": dev_crashes,
            "seconds_cpu": round(seconds_cpu, 1), "seconds_neuron": round(seconds_dev, 1),
            "time_ratio": round(seconds_dev / seconds_cpu, 2) if seconds_cpu else None,
            "causes": {k: v for k, v in sorted(causes.items(), key=lambda kv: -len(kv[1]))},
            "not_passing": listed,
        }
    return summary


def write_table(summary: dict, out: Path, command: str, samples: dict | None = None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch

    samples = {f: k for f, k in (samples or {}).items() if f in summary and k > 1}
    meta = {"torch": torch.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "command": command, "date": time.strftime("%Y-%m-%d"),
            "sources": {f: src.record() for f, src in suite_files.SOURCES.items()},
            "samples": {f: {"one_in": k, "rule": SAMPLE_RULE} for f, k in samples.items()}}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "files": summary}, indent=1) + "\n")
    total_cpu = sum(s["cpu_passed"] for s in summary.values())
    total_dev = sum(s["neuron_passed_of_cpu_passing"] for s in summary.values())
    total_run = sum(s["cpu_passed"] - s["outcomes"].get("not run", 0) for s in summary.values())
    partial = total_run < total_cpu
    lines = [
        "# PyTorch's device-generic test files on `neuron`",
        "",
        f"torch {meta['torch']}, {meta['machine']}, {meta['date']}. Rerun: `{command}`, then `--table`.",
        "Of the tests that pass on CPU, how many pass on `neuron` (a skip on `neuron` only is not a pass,",
        "unless PyTorch's own device rules make it: `onlyCPU`, `onlyNativeDeviceTypes`, those are left out;",
        "crashes and hangs are counted apart and each costs one test, never the run).",
    ]
    if partial:
        lines += ["", "**This run is partial**: \"not run\" is a CPU-passing test the `neuron` run had not reached "
                  "(`--resume` goes on from the records); the share over the tests that did run is the column that "
                  "says so."]
    lines += [
        "",
        "| file | CPU collected | CPU passed | neuron run (of those) | neuron passed | share | share of those run "
        "| failed | skipped on neuron only | crashes | hangs | skipped by PyTorch's device rules | time vs CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for file, s in summary.items():
        o = s["outcomes"]
        run = s["cpu_passed"] - o.get("not run", 0)
        passed = s["neuron_passed_of_cpu_passing"]
        share = passed / s["cpu_passed"] if s["cpu_passed"] else 0.0
        lines.append(f"| {file} | {s['cpu_collected']} | {s['cpu_passed']} | {run} | {passed} | {share:.1%} | "
                     f"{passed / run if run else 0.0:.1%} | {o.get('failed', 0) + o.get('error', 0)} | "
                     f"{o.get('skipped', 0)} | {s['crashes']} | {s['hangs']} | {s['skipped_by_pytorch_rules']} | "
                     f"{_ratio(s.get('seconds_neuron'), s.get('seconds_cpu'))} |")
    seconds = [sum(s.get(k, 0) for s in summary.values()) for k in ("seconds_neuron", "seconds_cpu")]
    if total_cpu:
        lines.append(f"| **all** | | {total_cpu} | {total_run} | {total_dev} | {total_dev / total_cpu:.1%} | "
                     f"{total_dev / total_run if total_run else 0.0:.1%} | | | "
                     f"{sum(s['crashes'] for s in summary.values())} | {sum(s['hangs'] for s in summary.values())} | | "
                     f"{_ratio(*seconds)} |")
    lines += ["", "Time vs CPU: the seconds the CPU-passing tests took on `neuron` over the same tests' seconds on "
              "CPU (each test timed by the plugin; a hang counts its timeout)."]
    if samples:
        lines += [""] + [f"{f} is sampled, one test in {k}: {SAMPLE_RULE}." for f, k in samples.items()]
    if meta["sources"]:
        lines += ["", "The files (fetched and checked by `benchmarks/torch_suites_files.py`; never committed here):",
                  "",
                  "| file | from | sha256 of the raw file | edits | sha256 of what runs |",
                  "| --- | --- | --- | --- | --- |"]
        for f, src in meta["sources"].items():
            lines.append(f"| {f} | `{src['repo']}@{src['commit'][:12]}:{src['path']}` | `{src['raw_sha256']}` | "
                         f"{_edits_text(src['edits'])} | `{src['sha256']}` |")
    for file, s in summary.items():
        if s["crashed_or_hung"]:
            lines += ["", f"## {file}: crashes and hangs", ""] + [f"- `{t}`" for t in s["crashed_or_hung"]]
        if s["causes"]:
            lines += ["", f"## {file}: tests that pass on CPU and not on neuron, by cause", "",
                      "| tests | cause | examples |", "| ---: | --- | --- |"]
            for key, tests in s["causes"].items():
                examples = ", ".join(f"`{t}`" for t in tests[:3]) + (" ..." if len(tests) > 3 else "")
                lines.append(f"| {len(tests)} | {key.replace('|', '/')} | {examples} |")
    notes = _notes(out.with_suffix(".md"))  # a hand-written "## Notes" section outlives a rebuild
    out.with_suffix(".md").write_text("\n".join(lines) + "\n" + notes)


def _notes(md: Path) -> str:
    try:
        text = md.read_text()
    except OSError:
        return ""
    at = text.find("\n## Notes\n")
    return text[at:] if at >= 0 else ""


def _edits_text(edits: list) -> str:
    words = []
    for edit in edits:
        verb = "drop" if "drop" in edit else "replace"
        first, *more = edit[verb].strip().splitlines()
        words.append(f"{verb} `{first}`" + (f" (+{len(more)} lines)" if more else "")
                     + (f" with `{edit['with']}`" if "with" in edit else ""))
    return ("; ".join(words) or "none").replace("|", "/")


def _ratio(num, den) -> str:
    return f"{num / den:.1f}x" if num and den else "-"


def _last_command(out: Path) -> str | None:
    try:
        command = json.loads(out.with_suffix(".json").read_text())["meta"]["command"]
    except (OSError, ValueError, KeyError):
        return None
    return None if "--table" in command.split() else command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-dir", type=Path, default=os.environ.get("NEURON_TORCH_TESTS"),
                        help="local copies to seed the pinned files from (checked against their sha256), and the "
                             "folder of any file that is not pinned (default $NEURON_TORCH_TESTS)")
    parser.add_argument("--files-dir", type=Path, default=suite_files.FILES_DIR,
                        help="where the pinned files are kept (fetched or seeded, then checked)")
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--devices", default=",".join(DEVICES))
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (the same on both devices)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a test is a hang")
    parser.add_argument("--sample", default="test_modules.py=8",
                        help="FILE=K,...: run one test in K of FILE (the same ones on both devices); "
                             "test_modules.py has about 3,000 tests a device")
    parser.add_argument("--budget", type=float, default=None, help="seconds per (file, device) run")
    parser.add_argument("--raw", type=Path, default=RAW)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--resume", action="store_true", help="keep earlier records, run only the rest")
    parser.add_argument("--table", action="store_true", help="only rebuild the table from the records")
    args = parser.parse_args(argv)
    files = [f for f in args.files.split(",") if f]
    samples = {name: int(k) for name, _, k in (part.partition("=") for part in args.sample.split(",") if part)}
    # the run's command for the Rerun line: ``--table`` keeps the one the records came from (in the last table)
    command = "python benchmarks/torch_suites.py " + " ".join(a for a in (argv or sys.argv[1:]) if a != "--resume")
    if args.table:
        command = _last_command(args.out) or "python benchmarks/torch_suites.py"
    if not args.table:
        pinned = [f for f in files if f in suite_files.SOURCES]
        unpinned = [f for f in files if f not in suite_files.SOURCES]
        if unpinned and (args.tests_dir is None or not all((Path(args.tests_dir) / f).exists() for f in unpinned)):
            parser.error(f"{', '.join(unpinned)}: not a pinned file (torch_suites_files.SOURCES); "
                         "--tests-dir must hold it")
        try:
            suite_files.ensure_files(pinned, args.files_dir, args.tests_dir)
        except suite_files.SuiteFileError as error:
            parser.error(str(error))
        args.raw.mkdir(parents=True, exist_ok=True)
        for file in files:
            folder = args.files_dir if file in suite_files.SOURCES else args.tests_dir
            for device in args.devices.split(","):
                if not args.resume:
                    (args.raw / f"{file}.{device}.jsonl").unlink(missing_ok=True)
                print(f"{file} on {device}", flush=True)
                run_suite(Path(folder).resolve(), file, device, args.raw, args.keyword, args.timeout,
                          args.budget, samples.get(file, 1))
    # the table shows every file with records in --raw, not only those this run ran (--files picks what runs)
    summary = compare(args.raw, list(dict.fromkeys([*FILES, *files])))
    write_table(summary, args.out, command, samples)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
