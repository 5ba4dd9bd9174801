"""`torch.compile(backend="neuron")` works in a fresh interpreter with no import of ours, and
`import torch` (which registers the neuron device) loads none of the heavy parts."""

import subprocess
import sys
import textwrap


def test_backend_found_through_entry_point_without_import(tmp_path):
    script = textwrap.dedent(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        x = torch.randn(4, 8)
        # import torch loads only the device's registration (torch.backends entry point): not the
        # backend (found through torch_dynamo_backends when asked for), the compiler, jax or torch-mlir
        heavy = [m for m in ("neuron_compile.capture.backend", "neuron_compile.compiler", "jax", "torch_mlir")
                 if m in sys.modules]
        assert not heavy, heavy
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


def test_the_device_autoload_can_be_turned_off(tmp_path):
    script = "import sys, torch; print(torch._C._get_privateuse1_backend_name(), 'neuron_compile' in sys.modules)"
    env = {**__import__("os").environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    off = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    on = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert off.stdout.split() == ["privateuseone", "False"], off.stderr[-2000:]
    assert on.stdout.split() == ["neuron", "True"], on.stderr[-2000:]


def test_unknown_option_is_a_clear_error():
    import pytest
    import torch

    with pytest.raises(Exception, match="unknown neuron backend option"):
        torch.compile(torch.nn.Linear(2, 2), backend="neuron", options={"pases": "fuse"})(torch.randn(1, 2))


def test_registering_before_torch_is_imported_registers_once():
    # register() imports torch, whose autoload runs register() again from inside that import
    script = ("import neuron_compile.device as d; d.register(); d.register(); import torch; "
              "print(torch.randn(2, device='neuron').device)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-1] == "neuron:0", out.stderr[-2000:]
