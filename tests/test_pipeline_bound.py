"""A pass pipeline that cannot finish is a ``LoweringError`` with a reproducer, never a hang.

torch-mlir's ``PassManager.run`` holds the GIL, so ``diagnostics.run_pipeline`` runs
the pipeline through the C API (``lowering/_mlir_capi.py``, ctypes, the GIL
released) on a thread and stops waiting after ``NEURON_COMPILE_PIPELINE_TIMEOUT``
seconds. The looping pass used here is real: Torch-MLIR's
``torch-decompose-complex-ops`` on a 0-d ``aten._softmax`` (the device now
decomposes that op before Torch-MLIR sees it; the raw graph still loops).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from neuron_compile.lowering import _mlir_capi
from neuron_compile.lowering.diagnostics import _PipelineFailed, new_context, pipeline_timeout, run_pipeline
from neuron_compile.lowering.fx_to_stablehlo import CLEANUP_PIPELINE

ADD_TWICE = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  %1 = stablehlo.add %0, %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


def test_torch_mlir_c_api_layout_is_what_the_bound_relies_on():
    """Fails loudly when torch-mlir renames its C-API library, the symbols, or the capsules."""
    from torch_mlir import ir
    from torch_mlir.passmanager import PassManager

    lib, _, _ = _mlir_capi._library()
    for symbol in ("mlirPassManagerRunOnOp", "mlirContextAttachDiagnosticHandler", "mlirDiagnosticPrint"):
        assert hasattr(lib, symbol), symbol
    ctx = new_context()
    module = ir.Module.parse(ADD_TWICE, ctx)
    with ctx:
        pm = PassManager.parse(CLEANUP_PIPELINE)
    for obj in (pm, module.operation, ctx):
        assert _mlir_capi._pointer(obj) != 0
    seen = []
    assert _mlir_capi.run_pass_manager(pm, module.operation, seen.extend)
    assert seen == [] and "stablehlo.add" in str(module)


def test_a_failing_pipeline_reports_its_diagnostics_with_locations():
    from torch_mlir import ir

    from neuron_compile.lowering.fx_to_stablehlo import TORCH_BACKEND_PIPELINE

    ctx = new_context()
    module = ir.Module.parse("""
      func.func @main(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
        %0 = torch.operator "neuron_test.mystery"(%a) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> loc("model.py":7:3)
        return %0 : !torch.vtensor<[4],f32>
      }""", ctx)
    with pytest.raises(_PipelineFailed) as failed:
        run_pipeline(module, TORCH_BACKEND_PIPELINE)
    assert not failed.value.timed_out
    assert any(d.startswith('loc("model.py":7:3): ') and "torch.operator" in d for d in failed.value.diagnostics), \
        failed.value.diagnostics
    assert any("neuron_test.mystery" in d for d in failed.value.diagnostics)
    module = ir.Module.parse(ADD_TWICE, ctx)
    assert run_pipeline(module, CLEANUP_PIPELINE, timeout=0) == []  # 0: inline, no thread
    assert run_pipeline(ir.Module.parse(ADD_TWICE, ctx), CLEANUP_PIPELINE, timeout=30) == []


def test_the_timeout_variable(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_PIPELINE_TIMEOUT", "2.5")
    assert pipeline_timeout() == 2.5
    monkeypatch.setenv("NEURON_COMPILE_PIPELINE_TIMEOUT", "0")
    assert pipeline_timeout() == 0
    monkeypatch.setenv("NEURON_COMPILE_PIPELINE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="NEURON_COMPILE_PIPELINE_TIMEOUT='soon'"):
        pipeline_timeout()
    monkeypatch.delenv("NEURON_COMPILE_PIPELINE_TIMEOUT")
    assert pipeline_timeout() > 0


_LOOPING = textwrap.dedent("""
    import os, time, torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from neuron_compile.lowering.fx_to_stablehlo import lower_to_stablehlo
    from neuron_compile.lowering.diagnostics import LoweringError, shared_context
    gm = make_fx(lambda x: torch.ops.aten._softmax.default(x, 0, False))(torch.tensor(1.0))
    looped_in = shared_context()  # the context the lowering below reuses
    start = time.perf_counter()
    try:
        lower_to_stablehlo(gm, graph_name="softmax0d")
        raise SystemExit("lowered: the looping pass finished")
    except LoweringError as error:
        print("SECONDS", time.perf_counter() - start)
        print("OP", error.op, "STAGE", error.stage)
        print("REPRO", sorted(os.listdir(error.repro_dir)))
        print(error)
    # the process goes on: the next graph lowers, and Python code runs at full speed
    gm = make_fx(lambda x: torch.ops.aten._softmax.default(x, 0, False))(torch.ones(3))
    module = lower_to_stablehlo(gm).module
    print("NEXT", "stablehlo.exponential" in str(module))
    # the abandoned pipeline's diagnostic handler stays attached to its context: later lowerings use another
    print("RETIRED", module.context is not looped_in, shared_context() is module.context)
""")


@pytest.mark.slow
def test_a_looping_pass_is_a_lowering_error_and_the_process_exits_cleanly(tmp_path):
    env = dict(os.environ, NEURON_COMPILE_PIPELINE_TIMEOUT="1", NEURON_COMPILE_REPRO_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _LOOPING], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]  # no crash at exit with the pass thread still there
    out = run.stdout
    assert "OP aten._softmax STAGE torch-backend" in out, out
    assert "did not finish in 1 s (NEURON_COMPILE_PIPELINE_TIMEOUT)" in out
    assert "REPRO ['diagnostics.txt', 'graph.py', 'input.mlir', 'pipeline.txt']" in out
    assert "NEXT True" in out
    assert "RETIRED True True" in out
    seconds = float(out.split("SECONDS ")[1].split()[0])
    assert seconds < 60, seconds  # bounded (1 s of pipeline, the rest is Torch-MLIR's first import)
