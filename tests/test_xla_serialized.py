"""XLA's compile, serialize and deserialize on the local PJRT client run one at a time, whatever thread asks
(``runtime/executor.XLA_LOCK``), and a background build (the eager queue's fused runs) compiles on a client
of its own and only loads its bytes on the local one (``XlaExecutable.compile_beside``), so a cold op never
waits for a build's compile. torch_suites' SIGSEGVs (issue 54) came with the fused-run builder thread inside
``compile_and_load`` / ``serialize_executable`` on the local client while the main thread compiled or ran
ops on it."""

from __future__ import annotations

import threading
import time

import torch

from neuron_compile.runtime import executor
from neuron_compile.runtime.executor import XlaExecutable

_TEXT = """module {{
  func.func @main(%arg0: tensor<{n}xf32>, %arg1: tensor<{n}xf32>) -> tensor<{n}xf32> {{
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<{n}xf32>
    %1 = stablehlo.add %0, %arg0 : tensor<{n}xf32>
    %2 = stablehlo.tanh %1 : tensor<{n}xf32>
    return %2 : tensor<{n}xf32>
  }}
}}
"""


class _Watched:
    """The real client, with its compile/serialize/deserialize counted while inside (and held a moment, so
    two threads' calls overlap unless something keeps them apart)."""

    def __init__(self, client):
        self._client = client
        self._guard = threading.Lock()
        self.inside = 0
        self.most = 0
        self.calls = 0
        self.by_thread = []  # (thread name, call)

    def _watch(self, name):
        real = getattr(self._client, name)

        def call(*args, **kwargs):
            with self._guard:
                self.inside += 1
                self.calls += 1
                self.most = max(self.most, self.inside)
                self.by_thread.append((threading.current_thread().name, name))
            try:
                time.sleep(0.002)
                return real(*args, **kwargs)
            finally:
                with self._guard:
                    self.inside -= 1

        return call

    def __getattr__(self, name):
        if name in ("compile_and_load", "serialize_executable", "deserialize_executable"):
            return self._watch(name)
        return getattr(self._client, name)


def test_xla_compiles_serializes_and_loads_one_at_a_time_across_threads(monkeypatch):
    watched = _Watched(executor._client())
    monkeypatch.setattr(executor, "_client", lambda: watched)
    errors = []

    def work(first):
        try:
            for n in range(first, first + 24):  # distinct shapes: each a real compile
                xla = XlaExecutable.compile(_TEXT.format(n=n))
                again = XlaExecutable.deserialize(xla.serialize())
                x = torch.randn(n)
                torch.testing.assert_close(again([x, x])[0], torch.tanh(x * x + x))
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(first,)) for first in (3, 103)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert watched.calls == 2 * 24 * 3
    assert watched.most == 1, "two XLA compiles/serializes/loads ran at once on the local client"


def _chain(length: int) -> str:
    body = ["%v0 = stablehlo.add %arg0, %arg1 : tensor<64x7xf32>"]
    for i in range(1, length):
        op = ("multiply", "add", "tanh", "subtract")[i % 4]
        operands = f"%v{i - 1}" if op == "tanh" else f"%v{i - 1}, %arg{i % 2}"
        body.append(f"%v{i} = stablehlo.{op} {operands} : tensor<64x7xf32>")
    return ("module {\n  func.func @main(%arg0: tensor<64x7xf32>, %arg1: tensor<64x7xf32>) -> tensor<64x7xf32> {\n    "
            + "\n    ".join(body) + f"\n    return %v{length - 1} : tensor<64x7xf32>\n  }}\n}}\n")


def test_a_background_build_loads_on_the_local_client_and_a_cold_compile_does_not_wait_for_it(monkeypatch):
    watched = _Watched(executor._client())
    monkeypatch.setattr(executor, "_client", lambda: watched)
    text = _chain(1200)  # a long fused run: its compile takes about a second here
    done = {}

    def build():
        done["built"] = XlaExecutable.compile_beside(text)
        done["build_end"] = time.perf_counter()

    builder = threading.Thread(target=build, name="builder")
    builder.start()
    time.sleep(0.05)
    XlaExecutable.compile(_TEXT.format(n=77))  # a cold op's kernel, on the main thread, while the build compiles
    cold_end = time.perf_counter()
    builder.join()
    assert cold_end < done["build_end"], "the cold compile waited for the background build's compile"
    assert [call for thread, call in watched.by_thread if thread == "builder"] == ["deserialize_executable"], \
        "the background build compiled or serialized on the local client"
    built = done["built"]
    assert XlaExecutable.deserialize(built.serialize()).stablehlo() is None  # its bytes load again
    x, y = torch.randn(64, 7), torch.randn(64, 7)
    reference = XlaExecutable.compile(text)([x, y])[0]
    torch.testing.assert_close(built([x, y])[0], reference, rtol=0, atol=0)
