"""TorchTitan 0.2.2 trains its llama3 debug model on the ``neuron`` device as on CPU (issue 54, item 5).

TorchTitan's own trainer from its command line (``benchmarks/torchtitan_runs.py``, which runs every
scenario and writes benchmarks/results/torchtitan.md): one process eager for 3 steps against the same
run on CPU, and FSDP2 on 2 ranks (torchrun, the ``neuron`` process group) for 2 steps against one CPU
process with the same global batch; losses within 1e-4 relative. Kept small (seq_len 128, local batch
2) so each test stays near a minute on two cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: torchtitan 0.2.2 imports it at start-up "
                              "(pip install -e '.[test]' pins it)")
pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[test]' pins 0.2.2)")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import torchtitan_assets  # noqa: E402
import torchtitan_runs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

SEQ, BATCH = 128, 2


@pytest.fixture(scope="module")
def cache():
    try:
        return torchtitan_assets.third_party_files()
    except torchtitan_assets.AssetsMissing as missing:
        pytest.skip(f"TorchTitan's debug config and test tokenizer are not on this machine: {missing}")


def _pair(cache, tmp_path, scenario: str, steps: int):
    reference = torchtitan_runs.SCENARIOS[scenario].reference
    kwargs = dict(cache=cache, seq=SEQ, batch=BATCH, steps=steps, docs=2 * BATCH * steps, work=tmp_path)
    want = torchtitan_runs.run(torchtitan_runs.SCENARIOS[reference], **kwargs)
    got = torchtitan_runs.run(torchtitan_runs.SCENARIOS[scenario], **kwargs)
    for result in (want, got):
        assert result.returncode == 0 and len(result.losses) == steps, (result.error, result.log[-3000:])
    return got.losses, want.losses


def test_one_process_eager_matches_cpu(cache, tmp_path):
    got, want = _pair(cache, tmp_path, "eager", steps=3)
    assert torchtitan_runs.max_rel_diff(got, want) <= torchtitan_runs.TOLERANCE, (got, want)


def test_fsdp2_two_ranks_matches_one_cpu_process(cache, tmp_path):
    got, want = _pair(cache, tmp_path, "fsdp2", steps=2)
    assert torchtitan_runs.max_rel_diff(got, want) <= torchtitan_runs.TOLERANCE, (got, want)
