"""``neuron-compile ops SCRIPT``: a script's ops on the neuron device and those run on host copies."""

from __future__ import annotations

import json

from neuron_compile import cli

_SCRIPT = """
import sys
import torch

x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="neuron")
for _ in range(int(sys.argv[1])):
    found = torch.nonzero(x * 2)  # nonzero's shape depends on the data: it runs on host copies
assert found.cpu().tolist() == [[0, 1], [1, 0]]
"""


def test_ops_counts_a_scripts_host_fallback_op(tmp_path, capsys):
    script = tmp_path / "uses_nonzero.py"
    script.write_text(_SCRIPT)
    assert cli.main(["ops", "--json", str(script), "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fallback"] == {"aten.nonzero.default": 3}
    assert result["executed"]["aten.nonzero.default"] == 3 and result["executed"]["aten.mul.Tensor"] == 3
    assert cli.main(["ops", str(script), "1"]) == 0
    table = capsys.readouterr().out
    assert "aten.nonzero.default" in table and "ops run on host copies: aten.nonzero.default (1)" in table


def test_ops_reports_a_failing_script_and_exits_1(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("import torch\ntorch.ones(2, device='neuron') + 1\nraise ValueError('boom')\n")
    assert cli.main(["ops", "--json", str(script)]) == 1
    captured = capsys.readouterr()
    assert "ValueError: boom" in captured.err and json.loads(captured.out)["exit"] == 1
    assert cli.main(["ops", str(tmp_path / "missing.py")]) == 2
