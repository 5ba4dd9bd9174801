"""The disk cache across processes: a warm new process compiles nothing; four racing processes compile once.

Each worker is a fresh Python process (subprocess), so nothing in memory is
shared: only the cache folder under tmp_path.
"""

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

WORKER = r'''
import json, os, sys, time
import torch
import torch.nn as nn
import neuron_compile

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
x = torch.randn(16, 32)
compiled = torch.compile(model, backend="neuron")
go = os.environ.get("GO_FILE")
if go:
    open(os.environ["READY_FILE"], "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
with torch.no_grad():
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
report = neuron_compile.compile_reports()[-1]
c = neuron_compile.COUNTERS
print("RESULT " + json.dumps({
    "cache": report.cache, "stages": report.stages,
    "xla_compiles": c["xla_compiles"], "lowerings": c["lowerings"],
    "disk_hits": c["disk_hits"], "misses": c["misses"],
}))
'''


def _env(cache_dir, **extra):
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(cache_dir), **extra)
    env.pop("NEURON_COMPILE_CACHE", None)
    return env


def _result(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _run(script, env) -> dict:
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result(done.stdout)


def test_warm_new_process_does_no_lowering_and_no_compile(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cache = tmp_path / "cache"
    cold = _run(script, _env(cache))
    assert cold["cache"] == "miss" and cold["xla_compiles"] == 1 and cold["lowerings"] == 1
    warm = _run(script, _env(cache))
    assert warm["cache"] == "disk", warm
    assert warm["xla_compiles"] == 0 and warm["lowerings"] == 0 and warm["disk_hits"] == 1
    for stage in ("import", "torch-backend", "stablehlo", "passes", "xla-compile"):
        assert stage not in warm["stages"], warm["stages"]


def test_four_racing_processes_compile_once(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs, ready = [], []
    for i in range(4):
        ready.append(tmp_path / f"ready{i}")
        env = _env(cache, GO_FILE=str(go), READY_FILE=str(ready[-1]))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 240
    while not all(r.exists() for r in ready):  # all four imported and traced nothing yet: start together
        assert time.time() < deadline and all(p.poll() is None for p in procs), "a worker died before the start"
        time.sleep(0.05)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(_result(out))
    assert sum(r["xla_compiles"] for r in results) == 1, results
    assert sum(r["lowerings"] for r in results) == 1, results  # the others waited on the FX key's lock
    assert sorted(r["cache"] for r in results) == ["disk", "disk", "disk", "miss"]
    assert len(list(cache.glob("artifacts/*/*.ncart"))) == 1
    assert not list(cache.glob("artifacts/*/.tmp-*"))  # no torn or leftover temp files


LINALG_WORKER = r'''
import json, os, warnings
import torch
import neuron_compile

warnings.simplefilter("always")
if os.environ.get("OTHER_GRAPH_FIRST"):  # jax is imported (and its linalg module) before the load
    torch.compile(lambda x: x + 1, backend="neuron")(torch.randn(3))
a = torch.randn(6, 6, generator=torch.Generator().manual_seed(0)) / 4
with warnings.catch_warnings(record=True) as caught:
    out = torch.compile(torch.linalg.matrix_exp, backend="neuron")(a)
torch.testing.assert_close(out, torch.linalg.matrix_exp(a), rtol=1e-4, atol=1e-4)
c = neuron_compile.COUNTERS
print("RESULT " + json.dumps({"xla_compiles": c["xla_compiles"], "disk_hits": c["disk_hits"],
                              "warnings": [str(w.message)[:200] for w in caught if "neuron_compile" in str(w.message)]}))
'''


@pytest.mark.parametrize("other_graph_first", [False, True], ids=["lapack-first", "other-graph-first"])
def test_lapack_executable_loads_in_a_new_process(tmp_path, other_graph_first):
    """An executable that calls LAPACK through jaxlib's FFI (matrix_exp's LU solve) needs handlers that only
    jax's linalg module registers, and kernels that find LAPACK only after initialize_lapack: a
    process that only read the cache took the entry for broken, warned and recompiled, every time;
    one that had compiled another graph first loaded it and segfaulted running it."""
    script = tmp_path / "linalg_worker.py"
    script.write_text(LINALG_WORKER)
    env = _env(tmp_path / "cache")
    first = _run(script, env)
    assert first["xla_compiles"] >= 1
    if other_graph_first:
        env["OTHER_GRAPH_FIRST"] = "1"
    second = _run(script, env)
    assert second["warnings"] == []
    assert second["disk_hits"] >= 1 and second["xla_compiles"] == (1 if other_graph_first else 0), second


BLAS_THREADS_WORKER = r'''
import ctypes, importlib, json
import torch
import neuron_compile

blas = ctypes.CDLL(importlib.import_module("scipy.linalg.cython_blas").__file__)
get = getattr(blas, "scipy_openblas_get_num_threads", None) or getattr(blas, "openblas_get_num_threads", None)
before = get() if get is not None else None
g = torch.Generator().manual_seed(0)
a, b = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 4, 16, 8, generator=g)
solve = torch.compile(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
                      backend="neuron")
torch.testing.assert_close(solve(a, b), torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
                           rtol=1e-4, atol=1e-4)
c = neuron_compile.COUNTERS
print("RESULT " + json.dumps({"before": before, "after": get() if get is not None else None,
                              "xla_compiles": c["xla_compiles"], "disk_hits": c["disk_hits"]}))
'''


def test_a_graph_calling_lapack_runs_openblas_on_xlas_threads_alone(tmp_path):
    """jaxlib's LAPACK kernels (a triangular solve's ``lapack_strsm_ffi``) call scipy's OpenBLAS from XLA's
    threads; OpenBLAS's own threads spinning beside them made such a graph 40x slower with a second busy
    process on 2 cores (and a CI run hung inside one, twice). Compiling or loading such an executable
    sets OpenBLAS to one thread, unless the user set ``OPENBLAS_NUM_THREADS``."""
    script = tmp_path / "blas_threads_worker.py"
    script.write_text(BLAS_THREADS_WORKER)
    env = _env(tmp_path / "cache")
    env.pop("OPENBLAS_NUM_THREADS", None)
    cold = _run(script, env)
    if cold["before"] is None:
        pytest.skip("scipy's BLAS here is not OpenBLAS: its thread count is left as it is")
    if cold["before"] == 1:
        pytest.skip("OpenBLAS starts with one thread on this machine (one core): nothing to change")
    assert cold["xla_compiles"] >= 1 and cold["after"] == 1, cold
    warm = _run(script, env)  # the executable loaded from the cache, not compiled
    assert warm["xla_compiles"] == 0 and warm["disk_hits"] >= 1 and warm["after"] == 1, warm
    chosen = _run(script, dict(env, OPENBLAS_NUM_THREADS="2"))
    assert chosen["before"] == chosen["after"] == 2, chosen
