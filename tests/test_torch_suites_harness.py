"""The harness that runs PyTorch's device-generic test files on ``neuron`` (benchmarks/torch_suites.py).

A device-generic test file of our own, written the way PyTorch's are
(``instantiate_device_type_tests``), with a test that passes, one that fails,
one that kills its process, one that hangs and one that skips on ``neuron``
only: the harness must count each apart, lose no other test to the crash or
the hang, and score only the tests that pass on CPU.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import torch_suites  # noqa: E402

SUITE = textwrap.dedent('''
    import os, signal, time, unittest
    import torch
    from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCPU
    from torch.testing._internal.common_utils import TestCase


    class TestFake(TestCase):
        def test_passes(self, device):
            self.assertTrue(torch.device(device).type in ("cpu", "neuron"))
            with open(os.environ["TORCH_SUITES_RECORDS"] + ".cache-dir", "w") as f:  # where the device's caches go
                f.write(os.environ.get("NEURON_COMPILE_CACHE_DIR", ""))

        def test_fails_on_neuron(self, device):
            self.assertEqual(torch.device(device).type, "cpu")

        def test_crashes_on_neuron(self, device):
            if torch.device(device).type != "cpu":
                os.kill(os.getpid(), signal.SIGSEGV)

        def test_hangs_on_neuron(self, device):
            if torch.device(device).type != "cpu":
                time.sleep(3600)

        def test_skipped_on_neuron(self, device):
            if torch.device(device).type != "cpu":
                raise unittest.SkipTest("not on this device")

        def test_z_after_the_others(self, device):
            pass

        @onlyCPU
        def test_only_cpu(self, device):
            pass


    class TestNotDeviceGeneric(TestCase):
        def test_plain(self):
            pass


    class TestCpuOnlyClass(TestCase):  # made for CPU only: no neuron twin, so not device-generic
        def test_cpu_only_class(self, device):
            pass


    class TestSecond(TestCase):  # a file's second device-generic class: its twin is TestSecondNEURON
        def test_second(self, device):
            pass


    instantiate_device_type_tests(TestFake, globals())
    instantiate_device_type_tests(TestSecond, globals())
    instantiate_device_type_tests(TestCpuOnlyClass, globals(), only_for="cpu")
''')


@pytest.mark.slow
def test_crashes_and_hangs_are_counted_apart_and_lose_no_other_test(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURON_COMPILE_CACHE_DIR", raising=False)  # (the test session's own otherwise)
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_fake.py").write_text(SUITE)
    raw, out = tmp_path / "raw", tmp_path / "table"
    torch_suites.main(["--tests-dir", str(tmp_path / "suite"), "--files", "test_fake.py", "--raw", str(raw),
                       "--out", str(out), "--timeout", "8"])
    summary = json.loads(out.with_suffix(".json").read_text())["files"]["test_fake.py"]
    # the plain TestCase and the CPU-only class are in neither side; every device-generic test has a record on both
    # PyTorch's own onlyCPU skip is left out of the score
    # (TestSecondCPU counted too: its twin is named TestSecondNEURON, not ...PRIVATEUSE1)
    assert summary["cpu_collected"] == 8 and summary["cpu_passed"] == 7
    assert summary["neuron_collected"] == 8 and summary["skipped_by_pytorch_rules"] == 1
    assert summary["outcomes"] == {"passed": 3, "failed": 1, "crash": 1, "hang": 1, "skipped": 1, "pytorch skip": 1}
    assert summary["crashes"] == 1 and summary["hangs"] == 1
    assert sorted(t.split("::")[-1] for t in summary["crashed_or_hung"]) == [
        "test_crashes_on_neuron_neuron", "test_hangs_on_neuron_neuron"]
    table = out.with_suffix(".md").read_text()
    assert "| test_fake.py | 8 | 7 | 7 | 3 | 42.9% | 42.9% | 1 | 1 | 1 | 1 | 1 |" in table, table
    # the suites' runs keep their own caches, beside their records: not the machine's shared one
    for device in ("cpu", "neuron"):
        assert (raw / f"test_fake.py.{device}.jsonl.cache-dir").read_text() == str(raw / "compile-cache")


def test_cpu_and_neuron_twins_are_matched_by_name():
    assert torch_suites.generic_id("f.py::TestViewOpsNEURON::test_t_inplace_view_neuron") == \
        torch_suites.generic_id("f.py::TestViewOpsCPU::test_t_inplace_view_cpu")
    assert torch_suites.generic_id("f.py::TestOptimRenewedPRIVATEUSE1::test_step_neuron_float32") == \
        torch_suites.generic_id("f.py::TestOptimRenewedCPU::test_step_cpu_float32")
    assert torch_suites.cause("RuntimeError: size 12 at 0x7f00ab") == "RuntimeError: size # at <address>"


def test_a_fused_test_skipped_by_pytorchs_optim_db_is_a_pytorch_rule(tmp_path):
    # test_optim.py skips its fused tests on a device missing from the optimizer's supports_fused_on
    # (a fixed list in PyTorch's optim_db): left out of the score, as onlyCPU is
    def write(device, outcome, message=""):
        test = f"test_optim.py::TestOptimRenewed{device.upper()}::test_fused_matches_forloop_Adam_{device}_float32"
        (tmp_path / f"test_optim.py.{device}.jsonl").write_text(
            json.dumps({"event": "result", "id": test, "outcome": outcome, "message": message}) + "\n")

    write("cpu", "passed")
    write("neuron", "skipped", "Skipped: neuron:0 is not supported for fused on Adam")
    summary = torch_suites.compare(tmp_path, ["test_optim.py"])["test_optim.py"]
    assert summary["cpu_passed"] == 0 and summary["skipped_by_pytorch_rules"] == 1 and not summary["causes"]


def test_table_of_a_partial_run_keeps_the_runs_command(tmp_path):
    # --table rebuilds from the records: its Rerun line is the run's command (from the last table), not
    # "--table"; tests the neuron run has not reached are "not run", and the share over those run is shown
    raw, out = tmp_path / "raw", tmp_path / "table"
    raw.mkdir()
    for device in ("cpu", "neuron"):
        tests = ("a", "b", "c", "d") if device == "cpu" else ("a", "b", "c")
        records = [{"event": "result", "id": f"t.py::TestX{device.upper()}::test_{n}_{device}",
                    "outcome": "failed" if (device, n) == ("neuron", "c") else "passed"} for n in tests]
        (raw / f"t.py.{device}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = "python benchmarks/torch_suites.py --tests-dir DIR --timeout 300"
    out.with_suffix(".json").write_text(json.dumps({"meta": {"command": run}, "files": {}}))
    torch_suites.main(["--table", "--files", "t.py", "--raw", str(raw), "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    assert f"Rerun: `{run}`, then `--table`" in table and "**This run is partial**" in table, table
    assert "| t.py | 4 | 4 | 3 | 2 | 50.0% | 66.7% | 1 | 0 | 0 | 0 | 0 |" in table, table
    assert json.loads(out.with_suffix(".json").read_text())["meta"]["command"] == run
    torch_suites.main(["--table", "--files", "t.py", "--raw", str(raw), "--out", str(out)])  # and again
    assert f"Rerun: `{run}`, then `--table`" in out.with_suffix(".md").read_text()


# --- the pinned files: fetched or seeded, always checked (no internet needed) -----------------

import hashlib  # noqa: E402

import torch_suites_files  # noqa: E402


def _pinned(raw: bytes, edits=()):
    edited = raw
    for old, new in edits:
        edited = edited.replace(old.encode(), new.encode())
    return torch_suites_files.SuiteFile(
        "someone/pytorch", "0" * 40, "test/test_x.py", raw_sha256=hashlib.sha256(raw).hexdigest(), edits=edits,
        sha256=hashlib.sha256(edited).hexdigest())


def _no_network(url):
    raise AssertionError(f"no download expected here: {url}")


def test_a_pinned_file_is_seeded_from_a_local_copy_edited_and_checked(tmp_path):
    raw = b"import a\nfrom optim import b\nx = 1\n"
    sources = {"test_x.py": _pinned(raw, (("from optim import b\n", ""),))}
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "test_x.py").write_bytes(raw)
    files = tmp_path / "files"
    torch_suites_files.ensure_files(["test_x.py"], files, tmp_path / "seed", download=_no_network, sources=sources)
    assert (files / "test_x.py").read_bytes() == b"import a\nx = 1\n"
    # already there and checked: neither the seed nor the network is needed again
    torch_suites_files.ensure_files(["test_x.py"], files, None, download=_no_network, sources=sources)
    # a copy that already has the edits is taken as is
    (tmp_path / "seed" / "test_x.py").write_bytes(b"import a\nx = 1\n")
    torch_suites_files.ensure_files(["test_x.py"], files, tmp_path / "seed", download=_no_network, sources=sources)


def test_a_file_with_the_wrong_sha256_is_refused_with_a_clear_message(tmp_path):
    raw = b"x = 1\n"
    sources = {"test_x.py": _pinned(raw)}
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "test_x.py").write_bytes(b"x = 2\n")  # another version of the file
    files = tmp_path / "files"
    with pytest.raises(torch_suites_files.SuiteFileError) as refused:
        torch_suites_files.ensure_files(["test_x.py"], files, tmp_path / "seed", download=_no_network,
                                        sources=sources)
    message = str(refused.value)
    assert hashlib.sha256(b"x = 2\n").hexdigest() in message and sources["test_x.py"].raw_sha256 in message
    assert "someone/pytorch@" + "0" * 40 in message and not (files / "test_x.py").exists()
    # a download is checked the same way
    with pytest.raises(torch_suites_files.SuiteFileError, match="has sha256"):
        torch_suites_files.ensure_files(["test_x.py"], files, None, download=lambda url: b"x = 3\n", sources=sources)
    # and a good one is kept; the URL is the raw file at the pinned commit
    urls = []
    torch_suites_files.ensure_files(["test_x.py"], files, None, download=lambda url: urls.append(url) or raw,
                                    sources=sources)
    assert urls == [f"https://raw.githubusercontent.com/someone/pytorch/{'0' * 40}/test/test_x.py"]
    assert (files / "test_x.py").read_bytes() == raw


def test_offline_without_a_seed_says_how_to_seed(tmp_path):
    def offline(url):
        raise OSError("Network is unreachable")

    with pytest.raises(torch_suites_files.SuiteFileError, match="--tests-dir"):
        torch_suites_files.ensure_files(["test_x.py"], tmp_path, None, download=offline,
                                        sources={"test_x.py": _pinned(b"x = 1\n")})


def test_the_recorded_edits_match_the_recorded_hashes():
    # each edit of a pinned file removes exactly what the brief names; the three files are pinned
    assert set(torch_suites_files.SOURCES) == set(torch_suites.FILES)
    for name, source in torch_suites_files.SOURCES.items():
        assert len(source.raw_sha256) == 64 and len(source.sha256) == 64
        assert (source.raw_sha256 == source.sha256) == (not source.edits), name
        cached = torch_suites_files.FILES_DIR / name
        if cached.exists():  # on a machine that has run the suites: the cached copy is the pinned one
            assert hashlib.sha256(cached.read_bytes()).hexdigest() == source.sha256, name


def test_a_hand_written_notes_section_outlives_a_table_rebuild(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "table"
    raw.mkdir()
    for device in ("cpu", "neuron"):
        record = {"event": "result", "id": f"t.py::TestX{device.upper()}::test_a_{device}", "outcome": "passed"}
        (raw / f"t.py.{device}.jsonl").write_text(json.dumps(record) + "\n")
    torch_suites.main(["--table", "--files", "t.py", "--raw", str(raw), "--out", str(out)])
    out.with_suffix(".md").write_text(out.with_suffix(".md").read_text() + "\n## Notes\n\nWhy a test fails.\n")
    torch_suites.main(["--table", "--files", "t.py", "--raw", str(raw), "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    assert table.count("## Notes") == 1 and table.endswith("\n## Notes\n\nWhy a test fails.\n"), table
