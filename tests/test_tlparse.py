"""``TORCH_TRACE`` + ``tlparse``: our stages of each compiled graph beside Dynamo's (``structured_trace``).

A GPT-2 (transformers, a small config, random weights) is compiled and
trained one step in a child process under ``TORCH_TRACE``; ``tlparse`` renders
the log, and its pages must hold our artifacts for the forward and the
backward graph, under the frame's compile id (the backward compiles at its
first call, after Dynamo's compile has returned).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32))
ids = torch.randint(0, 128, (2, 16))
loss = torch.compile(model, backend="neuron")(input_ids=ids, labels=ids).loss
loss.backward()
print("LOSS", loss.item())
"""


def _tlparse() -> str | None:
    beside = Path(sys.executable).with_name("tlparse")
    return str(beside) if beside.exists() else shutil.which("tlparse")


def test_tlparse_lists_our_artifacts_for_a_compiled_gpt2(tmp_path):
    pytest.importorskip("transformers")
    tlparse = _tlparse()
    if tlparse is None:
        pytest.skip("the tlparse binary is missing (pip install tlparse: the test extra has it)")
    trace = tmp_path / "trace"
    script = tmp_path / "gpt2.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TORCH_TRACE=str(trace), NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    logs = sorted(trace.glob("*.log"))
    assert logs
    out = tmp_path / "tl_out"
    parsed = subprocess.run([tlparse, str(logs[0]), "-o", str(out), "--overwrite", "--no-browser"],
                            capture_output=True, text=True, timeout=300)
    assert parsed.returncode == 0, parsed.stderr[-3000:]

    files = {p.name: p for p in out.rglob("neuron_*")}
    for kind in ("forward", "backward"):
        for what, suffix in (("stablehlo_lowered", ".txt"), ("stablehlo_final", ".txt"), ("passes", ".json"),
                             ("cache", ".json"), ("compile_report", ".json")):
            found = [p for n, p in files.items() if n.startswith(f"neuron_{what}_g0.{kind}") and n.endswith(suffix)]
            assert found, (what, kind, sorted(files))
            # under the frame's compile id (tlparse's folder "-_0_0_0"), not among the unattributed ("-_-_-_-")
            assert found[0].parent.name != "-_-_-_-", found[0]
    final = next(p for n, p in files.items() if n.startswith("neuron_stablehlo_final_g0.forward"))
    assert "func.func" in final.read_text() and "stablehlo." in final.read_text()
    report = json.loads(next(p for n, p in files.items() if n.startswith("neuron_compile_report_g0.forward")).read_text())
    assert report["graph"] == "g0.forward" and "xla-compile" in report["stages"]
    cache = json.loads(next(p for n, p in files.items() if n.startswith("neuron_cache_g0.forward")).read_text())
    assert cache["result"] == "miss" and len(cache["key"]) == 64 and cache["key_parts"]
    # the compile id's page links them beside Dynamo's and AOTAutograd's artifacts
    page = next(p for p in out.rglob("*.html") if "neuron_stablehlo_final_g0.forward" in p.read_text())
    assert "aot_forward_graph" in page.read_text() or "dynamo_output_graph" in page.read_text()
