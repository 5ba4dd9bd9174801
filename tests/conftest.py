"""Shared fixtures: every test gets a fresh Dynamo state and counters, and no test touches ~/.cache."""

import os
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
