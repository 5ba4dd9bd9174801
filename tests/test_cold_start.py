"""What a process pays the first time it compiles: imports and their overlap, checked in fresh processes.

Each check runs in a subprocess, because the test process has long imported
jax and Inductor: only a fresh interpreter shows what a first compile pulls in.
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(code: str, tmp_path) -> str:
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


TRAINING = r'''
import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
reference = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
reference.load_state_dict(model.state_dict())
x = torch.randn(8, 16)
compiled = torch.compile(model, backend="neuron")
compiled(x).pow(2).sum().backward()
reference(x).pow(2).sum().backward()
for p, q in zip(model.parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad, q.grad)
print("pattern_matcher", "torch._inductor.pattern_matcher" in sys.modules)
print("lowering", "torch._inductor.lowering" in sys.modules)
'''


def test_training_compile_does_not_import_inductor_lowerings(tmp_path):
    # the min-cut partitioner's CSE pre-pass would import Inductor's pattern matcher, and with it
    # every Inductor lowering (0.64 s); our partition_fn runs the partitioner without it
    out = _run(TRAINING, tmp_path)
    assert "pattern_matcher False" in out and "lowering False" in out, out


COMPILE_IMPORTS_JAX = r'''
import sys, threading
import torch
from neuron_compile.runtime.executor import XlaExecutable, to_buffer, to_tensor

assert "jax" not in sys.modules
TEXT = """module @m { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32> } }"""
results = {}

def compile_and_run(name):
    # two threads at once: each must find jax whole when its compile returns
    executable = XlaExecutable.compile(TEXT)
    assert "jax" in sys.modules and not getattr(sys.modules["jax"].__spec__, "_initializing", False)
    x = torch.arange(4, dtype=torch.float32)
    results[name] = executable([x])[0]

threads = [threading.Thread(target=compile_and_run, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for out in results.values():
    torch.testing.assert_close(out, torch.arange(4, dtype=torch.float32) ** 2)
print("results", len(results))
print("importers", sum(t.name == "neuron_compile-import-jax" for t in threading.enumerate()))
'''


def test_jax_imports_while_xla_compiles(tmp_path):
    # jaxlib imports jax at the first DLPack hand-off; the compile overlaps that import and joins it
    out = _run(COMPILE_IMPORTS_JAX, tmp_path)
    assert "results 2" in out and "importers 0" in out, out
