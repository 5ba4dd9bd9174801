"""A pytest plugin for ``torch_suites.py``: one JSON line per test, crashes and hangs made records.

Loaded into each pytest process the harness starts (``-p torch_suites_plugin``),
it reads two environment variables:

    TORCH_SUITES_RECORDS   the JSONL file it appends to: a ``start`` line before
                           each test runs, a ``result`` line after it
    TORCH_SUITES_TIMEOUT   seconds a test may run; past them the watchdog
                           appends a ``hang`` line and ends the process
    TORCH_SUITES_DEVICE    ``cpu`` or ``neuron``: only the tests
                           ``instantiate_device_type_tests`` made for that device
                           (PyTorch's ``CPUTestBase`` / ``PrivateUse1TestBase``
                           classes) are kept; tests that are not device-generic
                           are left out
    TORCH_SUITES_SAMPLE    ``K``: only one test in K, picked by a hash of the
                           test's name with the device left out, so both
                           devices run the same tests

Tests that already have a ``result`` (or ``crash``/``hang``) line are
deselected at collection, so the harness restarts pytest after a crash and it
goes on from the next test. A ``start`` line with nothing after it is a test
that killed the process (a segfault): the harness records it as a crash.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

_RECORDS = os.environ.get("TORCH_SUITES_RECORDS")
_TIMEOUT = float(os.environ.get("TORCH_SUITES_TIMEOUT", "180"))
_DEVICE = os.environ.get("TORCH_SUITES_DEVICE")
_SAMPLE = int(os.environ.get("TORCH_SUITES_SAMPLE", "1"))


def _append(record: dict) -> None:
    with open(_RECORDS, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _done() -> set:
    done = set()
    if _RECORDS and os.path.exists(_RECORDS):
        with open(_RECORDS) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") in ("result", "crash", "hang"):
                    done.add(record["id"])
    return done


def pytest_collection_modifyitems(session, config, items):
    if not _RECORDS:
        return
    done = _done()
    for_device = _device_filter()
    kept = [item for item in items if item.nodeid not in done and for_device(item) and _sampled(item.nodeid)]
    if len(kept) != len(items):
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept


def _sampled(nodeid: str) -> bool:
    if _SAMPLE <= 1:
        return True
    import re
    import zlib

    generic = re.sub(r"(?i)(cpu|neuron|privateuse1)", "DEV", nodeid)  # torch_suites.generic_id
    return zlib.crc32(generic.encode()) % _SAMPLE == 0


def _device_filter():
    if not _DEVICE:
        return lambda item: True
    import torch
    from torch.testing._internal.common_device_type import CPUTestBase, PrivateUse1TestBase

    base = CPUTestBase if _DEVICE == "cpu" else PrivateUse1TestBase

    def keep(item) -> bool:
        cls = getattr(item, "cls", None)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            return False
        # a class made for CPU only (instantiate_device_type_tests(..., only_for="cpu")) has no neuron twin:
        # not device-generic, left out on both sides. The twin is named after the backend as PyTorch's
        # PrivateUse1 base had it when the class was made: PRIVATEUSE1 for a file's first
        # instantiate_device_type_tests, the backend's own name (NEURON) for those after it
        if _DEVICE != "cpu" or not cls.__name__.endswith("CPU"):
            return True
        generic = cls.__name__[: -len("CPU")]
        return any(hasattr(item.module, generic + suffix)
                   for suffix in ("PRIVATEUSE1", torch._C._get_privateuse1_backend_name().upper()))

    return keep


class _Watchdog:
    """Ends the process when one test runs past the timeout (a hang in C++ never returns to Python)."""

    def __init__(self):
        self.current: tuple[str, float] | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(1.0)
            with self.lock:
                current = self.current
            if current is not None and time.monotonic() - current[1] > _TIMEOUT:
                _append({"event": "hang", "id": current[0], "seconds": _TIMEOUT})
                os._exit(3)


_watchdog = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _watchdog
    if not _RECORDS:
        yield
        return
    if _watchdog is None:
        _watchdog = _Watchdog()
        _keep_crash_stacks()
    _append({"event": "start", "id": item.nodeid})
    with _watchdog.lock:
        _watchdog.current = (item.nodeid, time.monotonic())
    item._suite_outcome = None
    started = time.monotonic()
    yield
    with _watchdog.lock:
        _watchdog.current = None
    outcome, message = item._suite_outcome or ("error", "no report")
    _append({"event": "result", "id": item.nodeid, "outcome": outcome, "message": message,
             "seconds": round(time.monotonic() - started, 3)})


def _keep_crash_stacks() -> None:
    """A test that kills the process leaves every thread's Python stack in ``<records>.faults``."""
    import faulthandler

    global _faults
    _faults = open(_RECORDS + ".faults", "a")  # noqa: SIM115 (open for the process's life)
    faulthandler.enable(file=_faults, all_threads=True)


_faults = None


def pytest_runtest_logreport(report):
    """Keep the first non-pass outcome of a test's phases (setup, call, teardown) on its item."""
    item = _items.get(report.nodeid)
    if item is None:
        return
    if hasattr(report, "wasxfail"):  # unittest's expectedFailure: a known failure, not a pass
        if item._suite_outcome is None or item._suite_outcome[0] == "passed":
            item._suite_outcome = ("xfailed" if report.skipped else "xpassed", str(report.wasxfail)[:200])
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if item._suite_outcome is None:
            item._suite_outcome = ("skipped", reason)
    elif report.failed:
        if item._suite_outcome is None or item._suite_outcome[0] in ("passed", "skipped"):
            text = report.longreprtext or ""
            item._suite_outcome = ("failed" if report.when == "call" else "error", _error_line(text))
    elif report.when == "call" and item._suite_outcome is None:
        item._suite_outcome = ("passed", "")


_items: dict = {}


def pytest_collection_finish(session):
    _items.update((item.nodeid, item) for item in session.items)


def _error_line(text: str) -> str:
    """The exception line of a pytest failure report (the last ``E   `` line that names an error)."""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    for line in lines:
        if "Error" in line or "Exception" in line or "assert" in line.lower():
            return line[:500]
    return (lines[0] if lines else text.strip().splitlines()[-1] if text.strip() else "")[:500]
