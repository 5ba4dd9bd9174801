"""`neuron-compile`: every command through its entry point, on built-in specs and on spec files written here.

Most commands run in-process through ``cli.main([...])`` (no interpreter start
per test); the demo, ``compile --jobs`` and one bad spec run the installed
``neuron-compile`` script in a fresh process. Every test has its own cache
folder (``fresh_cache``). Checked: the files each command writes (every dump
parses: FX code as Python, MLIR with the torch-mlir parser, JSON as JSON), the
numbers it prints (hits, compiles, entries, losses) and the exit codes.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_compile import cli

EXE = shutil.which("neuron-compile") or str(Path(sys.executable).parent / "neuron-compile")
COMMANDS = ["demo", "specs", "dump", "compile", "bench", "cache", "inspect", "explain", "repro"]

SPEC_FILE = '''
import torch
import torch.nn as nn


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 6)

    def forward(self, x, scale):
        return torch.tanh(self.proj(x)) * scale


def make():
    torch.manual_seed(0)
    return TwoInputs(), {"x": torch.randn(5, 12), "scale": torch.randn(5, 6)}


def broken():
    raise RuntimeError("weights not found")


@torch.library.custom_op("neuron_test_cli::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    # a custom op: nothing will ever lower it
    return x.flip(0)


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


class BreakAndMystery(nn.Module):
    def forward(self, x):
        y = torch.relu(x) + 1
        print("a graph break")
        return mystery(y) * 2


def unlowerable():
    return BreakAndMystery(), (torch.rand(4, 8) * 8,)


class Flip(nn.Module):
    def forward(self, x):
        return x.flip(0).cumsum(0) * 2


def flipper():
    return Flip(), (torch.randn(5, 8),)
'''


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "my_models.py"
    path.write_text(SPEC_FILE)
    return path


def run_main(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_exe(*argv, env=None, timeout=600):
    proc = subprocess.run([EXE, *map(str, argv)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def parse_mlir(path: Path):
    from torch_mlir import ir

    from neuron_compile.lowering import new_context

    with new_context() as ctx:
        module = ir.Module.parse(path.read_text(), ctx)
        assert module.operation.verify()
        return str(module)


def check_graph_folder(folder: Path, n_passes: int) -> dict:
    names = sorted(p.name for p in folder.iterdir())
    assert names[:3] == ["00-fx-graph.py", "01-torch.mlir", "02-stablehlo.mlir"], names
    passes = [n for n in names if n.startswith("03-pass-")]
    assert len(passes) == n_passes, names
    assert {"04-final.mlir", "report.json", "manifest.json"} <= set(names), names
    ast.parse((folder / "00-fx-graph.py").read_text())  # the FX graph is Python
    assert "torch.aten" in parse_mlir(folder / "01-torch.mlir")
    for name in ["02-stablehlo.mlir", *passes, "04-final.mlir"]:
        assert "stablehlo." in parse_mlir(folder / name), name
    report = json.loads((folder / "report.json").read_text())
    assert report["nodes"] > 0 and report["stages"]["xla-compile"] > 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["graph"] == report["graph"] and len(manifest["key"]) == 64
    return report


# ---- conventions --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(capsys, command):
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    assert "example:" in out and f"neuron-compile {command}" in out


def test_no_command_and_bad_flags_are_usage_errors(capsys):
    assert run_main(capsys, )[0] == 2
    assert run_main(capsys, "dump", "mlp")[0] == 2  # --out is required
    code, _, err = run_main(capsys, "compile", "mlp", "--buckets", "8,x")
    assert code == 2 and "--buckets" in err


def _one_paragraph(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("neuron-compile: error: ")
    return lines[0]


def test_bad_spec_path_is_one_paragraph_exit_2_in_a_fresh_process(tmp_path, fresh_cache):
    code, _, err = run_exe("dump", tmp_path / "missing.py:make", "--out", tmp_path / "d")
    assert code == 2
    assert "there is no file" in _one_paragraph(err)


def test_factory_that_raises_is_one_paragraph_exit_2(capsys, tmp_path, spec_file, fresh_cache):
    code, _, err = run_main(capsys, "compile", f"{spec_file}:broken")
    assert code == 2
    line = _one_paragraph(err)
    assert "factory raised RuntimeError: weights not found" in line and "my_models.py:" in line


def test_unknown_pass_name_is_one_paragraph_exit_2(capsys, tmp_path, fresh_cache):
    code, _, err = run_main(capsys, "dump", "mlp", "--out", tmp_path / "d", "--passes", "canonicalize,no-such-pass")
    assert code == 2
    assert "no-such-pass" in _one_paragraph(err)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").rglob("*.mlir"))


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "neither a built-in name"),
    ("no_such_package_xyz.models:make", "cannot import no_such_package_xyz.models"),
    ("{file}:absent", "has no attribute 'absent'"),
])
def test_other_bad_specs(capsys, spec_file, fresh_cache, spec, message):
    code, _, err = run_main(capsys, "explain", spec.format(file=spec_file))
    assert code == 2 and message in _one_paragraph(err)


# ---- demo ----------------------------------------------------------------------------------------

def test_demo_trains_beside_eager_in_a_fresh_process(fresh_cache):
    code, out, err = run_exe("demo", "--steps", "3", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert result["ok"] and result["max_abs_diff"] <= result["tolerance"]
    assert len(result["steps"]) == 3
    losses = [s["neuron_loss"] for s in result["steps"]]
    assert losses[-1] < losses[0]  # AdamW on one batch: the loss falls
    for step in result["steps"]:
        assert abs(step["neuron_loss"] - step["eager_loss"]) <= 1e-3
    kinds = sorted(r["kind"] for r in result["compile_reports"])
    assert kinds == ["backward", "forward", "inference"]


def test_demo_on_the_device_runs_eager_compiled_and_generates_cpu_tokens(fresh_cache):
    code, out, err = run_exe("demo", "--device", "neuron", "--steps", "2", "--new-tokens", "3", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert result["ok"] and result["generate"]["tokens_equal_cpu"]
    assert [m["mode"] for m in result["modes"]] == ["eager", "compiled"]
    for mode in result["modes"]:
        assert max(abs(a - b) for a, b in zip(mode["losses"], mode["cpu_losses"])) <= 1e-3
    compiled = result["modes"][1]
    assert compiled["host_copies_per_step"] == 0  # the step stays on device buffers


# ---- dump ----------------------------------------------------------------------------------------

def test_dump_builtin_mlp_writes_every_stage_and_parses(capsys, tmp_path, fresh_cache):
    from neuron_compile.passes import parse_pipeline

    code, out, err = run_main(capsys, "dump", "mlp", "--out", tmp_path / "d", "--json")
    assert code == 0, err
    index = json.loads(out)
    assert [g["graph"] for g in index["graphs"]] and len(index["graphs"]) == 1
    folder = Path(index["graphs"][0]["path"])
    assert folder.parent == Path(index["folder"]) and folder.parent.parent == tmp_path / "d"
    report = check_graph_folder(folder, n_passes=len(parse_pipeline("default").passes))
    assert report["kind"] == "inference"
    # the printed index lists exactly the files on disk
    assert [f["name"] for f in index["graphs"][0]["files"]] == sorted(p.name for p in folder.iterdir())


def test_dump_spec_file_with_keyword_inputs_training_and_passes(capsys, tmp_path, spec_file, fresh_cache):
    code, out, err = run_main(capsys, "dump", f"{spec_file}:make", "--out", tmp_path / "d", "--train",
                              "--passes", "canonicalize")
    assert code == 0, err
    assert "2 graph(s)" in out and "03-pass-0-canonicalize.mlir" in out
    folders = sorted(p for p in (tmp_path / "d").glob("pid*/*") if p.is_dir())
    kinds = sorted(check_graph_folder(f, n_passes=1)["kind"] for f in folders)
    assert kinds == ["backward", "forward"]


# ---- compile, cache, inspect ---------------------------------------------------------------------

def test_compile_counts_hits_then_cache_commands(capsys, tmp_path, fresh_cache):
    code, out, err = run_main(capsys, "compile", "mlp", "--buckets", "4,8", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert [i["size"] for i in first["items"]] == [4, 8]
    assert (first["graphs"], first["compiles"], first["hits"]) == (2, 2, 0)
    assert [i["inputs"] for i in first["items"]] == ["(4, 32) float32", "(8, 32) float32"]

    code, out, _ = run_main(capsys, "compile", "mlp", "--buckets", "4,8", "--json")
    again = json.loads(out)
    assert (again["graphs"], again["compiles"], again["hits"]) == (2, 0, 2)

    code, out, _ = run_main(capsys, "cache", "stats", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["entries"] == 2 and stats["path"] == str(fresh_cache)
    assert stats["totals"]["misses"] == 2 and stats["bytes"] > 0

    code, out, _ = run_main(capsys, "cache", "ls", "--json")
    entries = json.loads(out)
    assert len(entries) == 2 and all(Path(e["path"]).is_file() for e in entries)

    code, out, _ = run_main(capsys, "inspect", entries[0]["path"], "--json")
    info = json.loads(out)
    assert code == 0 and info["manifest"]["key"] == entries[0]["key"] and info["executable_bytes"] > 0
    code, out, _ = run_main(capsys, "inspect", entries[0]["key"][:12], "--stablehlo")
    assert code == 0 and "func.func @main" in out
    code, _, err = run_main(capsys, "inspect", tmp_path / "nothing.ncart")
    assert code == 2 and _one_paragraph(err)

    assert run_main(capsys, "cache", "verify")[0] == 0
    broken = Path(entries[1]["path"])
    broken.write_bytes(broken.read_bytes()[:-10] + b"0123456789")  # corrupt the executable bytes
    code, out, err = run_main(capsys, "cache", "verify", "--json")
    assert code == 1
    assert [r["ok"] for r in json.loads(out) if r["path"].endswith(".ncart")].count(False) == 1

    code, out, _ = run_main(capsys, "cache", "prune", "--json")
    assert code == 0 and json.loads(out)["removed"] == 1
    assert json.loads(run_main(capsys, "cache", "stats", "--json")[1])["entries"] == 1
    code, out, _ = run_main(capsys, "cache", "clear")
    assert code == 0 and "removed 1 artifact" in out
    assert json.loads(run_main(capsys, "cache", "stats", "--json")[1])["entries"] == 0


def test_compile_training_graphs_of_builtin_cnn(fresh_cache):
    code, out, err = run_exe("compile", "cnn", "--train", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert [i["mode"] for i in result["items"]] == ["inference", "train"]
    assert [i["graphs"] for i in result["items"]] == [1, 2] and result["compiles"] == 3


def test_compile_jobs_in_worker_processes_share_the_cache(tmp_path, fresh_cache):
    code, out, err = run_exe("compile", "mlp", "--buckets", "2,3,5", "--jobs", "2", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert [i["size"] for i in result["items"]] == [2, 3, 5]
    assert (result["compiles"], result["hits"]) == (3, 0)
    code, out, _ = run_exe("cache", "stats", "--json")
    assert json.loads(out)["entries"] == 3


# ---- explain and repro ---------------------------------------------------------------------------

def test_explain_graph_breaks_recompiles_and_ops_that_do_not_lower(capsys, spec_file, fresh_cache):
    code, out, err = run_main(capsys, "explain", f"{spec_file}:unlowerable", "--sizes", "6", "--json")
    assert code == 1  # a graph does not lower
    result = json.loads(out)  # the model's print() went to stderr, not into the JSON
    assert "a graph break" in err
    assert result["graphs"] == 2 and result["graph_breaks"] == 1
    assert "print" in result["breaks"][0]["reason"] and "my_models.py" in result["breaks"][0]["where"]
    assert any("size mismatch" in r["reason"] for r in result["recompiles"])
    failures = result["lowering_failures"]
    assert failures and all(f["op"] and "neuron_test_cli.mystery" in f["op"] for f in failures)
    assert "bucket" in result["bucketing"]
    repro_dir = failures[0]["repro"]
    assert repro_dir and (Path(repro_dir) / "input.mlir").is_file()

    code, out, err = run_main(capsys, "repro", repro_dir)
    assert code == 1 and "mystery" in out
    assert _one_paragraph(err)


def test_explain_says_why_a_graph_is_not_bucketed(capsys, spec_file, fresh_cache):
    # a flip along the padded dim is not padding-safe: the graph compiles per exact shape, and the
    # backend's one DEBUG line saying why reaches explain
    code, out, err = run_main(capsys, "explain", f"{spec_file}:flipper", "--sizes", "7,9", "--json")
    assert code == 0, err
    result = json.loads(out)
    reasons = result["exact_shape_reasons"]
    assert reasons and all("per exact shape" in r for r in reasons), reasons
    assert any("flip" in r for r in reasons), reasons


def test_explain_builtin_mlp_clean(capsys, fresh_cache):
    code, out, err = run_main(capsys, "explain", "mlp", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["graphs"], result["graph_breaks"], result["lowering_failures"]) == (1, 0, [])
    assert [c["cache"] for c in result["cache"]] == ["miss"]


def test_repro_of_a_folder_that_is_not_one_is_a_usage_error(capsys, tmp_path):
    code, _, err = run_main(capsys, "repro", tmp_path)
    assert code == 2 and "not a reproducer folder" in _one_paragraph(err)


# ---- bench ---------------------------------------------------------------------------------------

def test_bench_cold_and_warm_in_fresh_processes_beside_eager(capsys, tmp_path, fresh_cache):
    plot = tmp_path / "stages.png"
    code, out, err = run_main(capsys, "bench", "mlp", "--vs", "eager", "--calls", "3", "--json", "--plot", plot)
    assert code == 0, err
    result = json.loads(out)
    assert [(r["backend"], r["phase"]) for r in result["runs"]] == [("neuron", "cold"), ("neuron", "warm"),
                                                                    ("eager", "-")]
    cold, warm, eager = result["runs"]
    assert cold["cache"] == ["miss"] and warm["cache"] == ["disk"]  # the warm process found the cold one's artifact
    assert cold["stages"]["xla-compile"] > 0 and "xla-compile" not in warm["stages"]
    assert cold["first_call_s"] > cold["steady_s"] > 0 and eager["graphs"] == 0
    assert {r["backend"] for r in result["summary"]} == {"neuron", "eager"}
    assert result["machine"]["cores"] >= 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(fresh_cache.glob("artifacts/*/*"))  # workers used their own temporary caches


def test_bench_unknown_peer_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "bench", "mlp", "--vs", "no-such-backend")
    assert code == 2 and "no-such-backend" in _one_paragraph(err)
