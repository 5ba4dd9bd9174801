"""The pipeline interface the backend calls: parsing, canonical spec,
profiles, errors, stats, verify-each with a reproducer."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from neuron_compile.passes import DEFAULT_PIPELINE, PROFILES, PipelineError, parse_pipeline
from neuron_compile.passes.pad_to_multiple import PadToMultiple
from neuron_compile.passes.pipeline import new_context

MLIR = (Path(__file__).parent / "filecheck" / "pad_to_multiple.mlir").read_text()


def test_parse_and_canonical_spec():
    p = parse_pipeline("canonicalize, pad-to-multiple{multiple=128} ,fuse")
    assert p.spec == "canonicalize,pad-to-multiple{multiple=128,max-ratio=4.0,free-dims=lhs},fuse"
    assert parse_pipeline(p.spec).spec == p.spec  # round trip
    assert p.passes[1] == PadToMultiple(multiple=128, max_ratio=4.0)
    q = parse_pipeline("pad-to-multiple{max-ratio=inf,multiple=64,free-dims=both}")
    assert math.isinf(q.passes[0].max_ratio) and q.passes[0].multiple == 64
    assert q.spec == "pad-to-multiple{multiple=64,max-ratio=inf,free-dims=both}"


def test_passes_are_frozen_dataclasses():
    p = parse_pipeline("pad-to-multiple").passes[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.multiple = 3


def test_profiles_and_empty():
    assert parse_pipeline("").passes == () and parse_pipeline("").spec == ""
    assert parse_pipeline("none").spec == ""
    assert DEFAULT_PIPELINE == PROFILES["default"]
    assert parse_pipeline("default").spec == parse_pipeline(DEFAULT_PIPELINE).spec
    neuron = parse_pipeline("neuron").passes
    pad = [p for p in neuron if p.name == "pad-to-multiple"][0]
    assert pad.multiple == 128 and math.isinf(pad.max_ratio)


@pytest.mark.parametrize(
    "text, words",
    [
        ("canonicalize,frobnicate", ["frobnicate", "known passes", "pad-to-multiple"]),
        ("pad-to-multiple{multipl=3}", ["multipl", "max-ratio"]),
        ("pad-to-multiple{multiple=abc}", ["multiple", "int", "abc"]),
        ("pad-to-multiple{multiple=0}", ["multiple"]),
        ("pad-to-multiple{free-dims=rhs}", ["free-dims"]),
        ("pad-to-multiple{multiple=3", ["unbalanced"]),
        ("fuse{x}", ["name=value"]),
    ],
)
def test_errors_name_the_problem(text, words):
    with pytest.raises(PipelineError) as e:
        parse_pipeline(text)
    assert isinstance(e.value, ValueError)
    for w in words:
        assert w in str(e.value)


def test_stats_and_run_on_text():
    text, stats = parse_pipeline("canonicalize,pad-to-multiple{max-ratio=inf},fuse").run_on_text(MLIR)
    assert [s.name for s in stats] == ["canonicalize", "pad-to-multiple", "fuse"]
    pad = stats[1]
    assert pad.options == {"multiple": 128, "max-ratio": math.inf, "free-dims": "lhs"}
    assert pad.fired == 2 and pad.details["dot_general"] == 2 and pad.details["reused_pads"] == 1
    assert all(s.seconds >= 0 for s in stats)
    assert stats[2].details["regions"] == {} and "bytes_saved" in stats[2].details
    assert "tensor<128x128xf32>" in text


def test_run_mutates_module_in_place():
    from torch_mlir import ir

    with new_context():
        module = ir.Module.parse(MLIR)
        stats = parse_pipeline("pad-to-multiple{max-ratio=inf}").run(module, verify_each=True)
        assert stats[0].fired == 2
        assert "stablehlo.pad" in str(module)


@dataclasses.dataclass(frozen=True)
class BreakIt:
    """A pass that leaves a use above its definition."""

    name = "break-it"

    def apply(self, module):
        from neuron_compile.passes.pass_result import PassResult
        from neuron_compile.passes.stablehlo_ops import entry_block, public_functions

        ops = list(entry_block(public_functions(module)[0]).operations)
        ops[0].operands[0] = ops[1].results[0]
        return PassResult(fired=1)


def test_verify_each_names_the_pass_and_saves_the_ir():
    from torch_mlir import ir

    from neuron_compile.passes.pipeline import Pipeline

    pipeline = Pipeline((parse_pipeline("canonicalize").passes[0], BreakIt()))
    with new_context():
        module = ir.Module.parse(MLIR)
        with pytest.raises(PipelineError) as e:
            pipeline.run(module, verify_each=True)
    msg = str(e.value)
    assert "break-it" in msg and "python -m neuron_compile.passes" in msg
    path = Path(msg.split("saved to ")[1].split()[0])
    try:
        assert "stablehlo.dot_general" in path.read_text()
    finally:
        path.unlink()


def test_cli(tmp_path):
    from neuron_compile.passes.__main__ import main

    src = tmp_path / "in.mlir"
    src.write_text(MLIR)
    out = tmp_path / "out.mlir"
    assert main([str(src), "--pipeline", "neuron", "--verify-each", "-o", str(out)]) == 0
    assert "stablehlo.pad" in out.read_text()
    assert main([str(src), "--pipeline", "nope"]) == 1


def test_stablehlo_op_lookups_find_a_module_once():
    # The bindings import a dialect's Python module for every op they hand out
    # and cache only imports that succeed; without passes.dialect_stubs each
    # StableHLO op cost a failed import (~30 us, 90% of the passes' time).
    import sys

    from torch_mlir import ir
    from torch_mlir._mlir_libs import _mlir

    assert "neuron_compile.passes.dialect_stubs" in _mlir.globals.dialect_search_modules
    with new_context():
        module = ir.Module.parse(MLIR)
        from neuron_compile.passes.stablehlo_ops import entry_block, public_functions

        names = [op.name for op in entry_block(public_functions(module)[0]).operations]  # OpViews
    assert "stablehlo.dot_general" in names
    assert "neuron_compile.passes.dialect_stubs.stablehlo" in sys.modules
