"""`torch.compile(backend="neuron")` works in a fresh interpreter with no import of ours."""

import subprocess
import sys
import textwrap


def test_backend_found_through_entry_point_without_import(tmp_path):
    script = textwrap.dedent(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        x = torch.randn(4, 8)
        assert "neuron_compile" not in sys.modules
        out = torch.compile(model, backend="neuron")(x)
        torch.testing.assert_close(out, model(x))
        import neuron_compile
        assert len(neuron_compile.compile_reports()) >= 1
        print("OK", [r.graph for r in neuron_compile.compile_reports()])
        """
    )
    env_script = tmp_path / "script.py"
    env_script.write_text(script)
    result = subprocess.run([sys.executable, str(env_script)], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_unknown_option_is_a_clear_error():
    import pytest
    import torch

    with pytest.raises(Exception, match="unknown neuron backend option"):
        torch.compile(torch.nn.Linear(2, 2), backend="neuron", options={"pases": "fuse"})(torch.randn(1, 2))
