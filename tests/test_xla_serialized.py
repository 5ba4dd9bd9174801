"""XLA's compile, serialize and deserialize on the local PJRT client run one at a time, whatever thread asks
(``runtime/executor.XLA_LOCK``): the eager queue builds fused runs on a background thread while the main
thread compiles its ops' kernels, and torch_suites' SIGSEGVs (issue 54) came with the background thread
inside ``compile_and_load`` / ``serialize_executable`` while the main thread compiled or ran ops."""

from __future__ import annotations

import threading
import time

import torch

from runtime import executor
from runtime.executor import XlaExecutable

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

    def _watch(self, name):
        real = getattr(self._client, name)

        def call(*args, **kwargs):
            with self._guard:
                self.inside += 1
                self.calls += 1
                self.most = max(self.most, self.inside)
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
