"""Golden-IR tests: each tests/filecheck/*.mlir names its pipeline on the first
line (`// PIPELINE: ...`); the output of that pipeline must match the file's
CHECK lines (filecheck 1.0, the Python clone of LLVM FileCheck)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_compile.passes import parse_pipeline
from neuron_compile.passes.pass_registry import PASSES

CASES = sorted((Path(__file__).parent / "filecheck").glob("*.mlir"))
FILECHECK = Path(sys.executable).with_name("filecheck")


def pipeline_of(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("// PIPELINE:"), f"{path.name}: first line must be '// PIPELINE: <spec>'"
    return first.split(":", 1)[1].strip()


def test_every_pass_has_a_golden_file():
    covered = {p.name for c in CASES for p in parse_pipeline(pipeline_of(c)).passes}
    assert covered >= set(PASSES)


@pytest.mark.parametrize("path", CASES, ids=[c.stem for c in CASES])
def test_golden(path: Path, tmp_path: Path):
    text, stats = parse_pipeline(pipeline_of(path)).run_on_text(path.read_text(), verify_each=True)
    assert all(s.fired > 0 or s.name == "pad-to-multiple" for s in stats)
    out = tmp_path / "out.mlir"
    out.write_text(text)
    proc = subprocess.run(
        [str(FILECHECK), str(path), "--input-file", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\n--- output ---\n" + text
