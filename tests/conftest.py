"""Shared fixtures: every test gets a fresh Dynamo state and counters, and no test touches ~/.cache."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest
import torch

# Before anything compiles: keep the artifact cache and reproducers out of the user's home.
_SESSION_DIR = tempfile.mkdtemp(prefix="neuron_compile_tests-")
os.environ.setdefault("NEURON_COMPILE_CACHE_DIR", os.path.join(_SESSION_DIR, "cache"))
os.environ.setdefault("NEURON_COMPILE_REPRO_DIR", os.path.join(_SESSION_DIR, "repro"))


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core this process may use, at most 4 (each holds torch, jax and
    XLA's compiler; more workers mostly wait on each other's compiles)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture(autouse=True)
def _fresh_state():
    import neuron_compile

    torch._dynamo.reset()
    neuron_compile.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder for tests that count compiles or hits."""
    path = tmp_path / "cache"
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(path))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_killing_the_group(command, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)``, in a session of its own:
    past the timeout the whole process group is killed (torchrun's ranks too, which a kill of torchrun
    alone leaves running, spinning on a dead store for the rest of the suite), then TimeoutExpired."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, out, err) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _launch_two_ranks(folder, worker: str, args=(), env=None, timeout=300, ranks=(0, 1), nproc=2) -> list[dict]:
    """Write ``worker`` to ``folder/worker.py`` and run it on 2 ranks under torchrun (gloo's address
    127.0.0.1, a free port; ``worker.py FOLDER *args``); each rank writes ``FOLDER/rank<R>.json``,
    returned for ``ranks``. ``env``: variables set (a None value removes one); ``nproc``: ranks to launch."""
    script = folder / "worker.py"
    script.write_text(worker)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script), str(folder),
               *map(str, args)]
    environ = dict(os.environ, OMP_NUM_THREADS="1")
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    done = run_killing_the_group(command, env=environ, timeout=timeout)
    results = []
    for rank in ranks:
        path = folder / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing (rc {done.returncode}):\n{done.stderr[-6000:]}"
        results.append(json.loads(path.read_text()))
    return results


def _cold_then_warm(script: str, cache_dir, timeout: float = 300) -> tuple[dict, dict]:
    """Run ``python -c script`` twice in new processes sharing the artifact cache ``cache_dir`` (the first
    fills it, the second finds it warm); each prints a JSON object as its last line: (first's, second's)."""
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(cache_dir))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs[0], runs[1]


@pytest.fixture(scope="session")
def cold_then_warm():
    """``cold_then_warm(script, cache_dir, timeout=300)``: a script's JSON result from a cold process, then
    from a warm one (``_cold_then_warm``)."""
    return _cold_then_warm


@pytest.fixture(scope="session")
def launch_two_ranks():
    """``launch_two_ranks(folder, worker_source, args=(), env=None, timeout=300, ranks=(0, 1))``: one
    torchrun launch of 2 ranks, their JSON results (``_launch_two_ranks``)."""
    return _launch_two_ranks
