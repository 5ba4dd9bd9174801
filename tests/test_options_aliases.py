"""TorchNeuron's environment variables read as aliases of ours (``neuron_compile.options.ALIASES``)."""

from __future__ import annotations

import torch

from neuron_compile.options import ALIASES, Options


def test_torchneuron_cache_and_debug_dirs_are_aliases_ours_first(monkeypatch, tmp_path):
    assert ALIASES == {"NEURON_COMPILE_CACHE_DIR": "TORCH_NEURONX_NEFF_CACHE_DIR",
                       "NEURON_COMPILE_DUMP_DIR": "TORCH_NEURONX_DEBUG_DIR"}
    for ours in ALIASES:
        monkeypatch.delenv(ours, raising=False)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path / "debug"))
    options = Options.resolve()
    assert options.cache_dir == str(tmp_path / "neff") and options.dump_dir == str(tmp_path / "debug")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "ours"))
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", "")  # empty: unset, so the alias holds
    options = Options.resolve()
    assert options.cache_dir == str(tmp_path / "ours") and options.dump_dir == str(tmp_path / "debug")
    assert Options.resolve({"dump_dir": str(tmp_path / "arg")}).dump_dir == str(tmp_path / "arg")


def test_torchneuron_debug_dir_dumps_a_compiled_graph(monkeypatch, tmp_path):
    monkeypatch.delenv("NEURON_COMPILE_DUMP_DIR", raising=False)
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="neuron")
    x = torch.randn(3, 5)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)
    written = {p.name for p in (tmp_path / "debug").rglob("*") if p.is_file()}
    assert "00-fx-graph.py" in written and "04-final.mlir" in written
