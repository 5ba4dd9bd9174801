"""The direct lowering (``lowering/direct.py``): an eager op's graph written as StableHLO with no Torch-MLIR.

Each case runs on the ``neuron`` device against CPU eager, at several shapes (a kernel is built per
signature), and checks which path built its kernels: every graph of the case written directly (the
compile report has a ``direct`` stage and no Torch-MLIR stage), and the same results with
``lowering="torch-mlir"``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neuron_compile.report as report
from neuron_compile.graph_keys import fx_cache_key
from neuron_compile.options import Options
from neuron_compile.lowering import direct, direct_ir

TORCH_MLIR_STAGES = {"import", "torch-backend", "stablehlo"}

# name -> (function of (x, y, index), shapes of x at each call); y is x's last dim, index six int64 rows below 3
CASES = {
    "add_alpha": lambda x, y, i: torch.add(x, y, alpha=0.5),
    "sub_scalar": lambda x, y, i: x - 2,
    "mul_broadcast": lambda x, y, i: x * y,
    "div": lambda x, y, i: x / (y.abs() + 1),
    "maximum": lambda x, y, i: torch.maximum(x, y),
    "compare_int_float": lambda x, y, i: (x * 4).long() <= y,
    "where": lambda x, y, i: torch.where(x > 0, x, y),
    "unary": lambda x, y, i: torch.stack([x.exp(), x.tanh(), x.sigmoid(), x.abs().sqrt(), x.abs().log1p(), x.sin(),
                                          x.floor(), x.ceil(), x.neg(), (x.abs() + 1).reciprocal()]),
    "pow": lambda x, y, i: torch.stack([x ** 2, x ** 3, x.abs() ** 0.5, x.abs() ** -0.5, x.abs() ** 1.7]),
    "logical": lambda x, y, i: torch.logical_and(x > 0, y < 0.5) | torch.logical_not(x > 1),
    "bitwise": lambda x, y, i: ((x * 10).long() & 6) ^ (~(x * 10).long()) | i[:1],
    "clamp": lambda x, y, i: x.clamp(-0.5, 0.25),
    "layout": lambda x, y, i: x.t().contiguous().unsqueeze(0).expand(2, -1, -1).reshape(-1) * 1,
    "slice_select": lambda x, y, i: x[1::2, ::3] * 1 + x[-1, 1:2],
    "cat_pad": lambda x, y, i: F.pad(torch.cat([x, x * 2], 1), (1, 2, -1, 0), value=3.0),
    "to_dtypes": lambda x, y, i: torch.stack([(x * 10).long().float(), x.half().float(), x.bool().float()]),
    "creation": lambda x, y, i: torch.arange(3, 3 + 2 * x.shape[0], 2, device=x.device) * 1.5 + torch.ones(
        x.shape[0], device=x.device) + torch.full((x.shape[0],), 2, device=x.device),
    "reductions": lambda x, y, i: torch.stack([x.sum(1), x.mean(1), x.amax(1), x.amin(1)]),
    "sum_all_and_bool": lambda x, y, i: torch.stack([x.sum(), (x > 0).sum().float(), (x > -9).all().float()]),
    "half_sum": lambda x, y, i: (x.half() * 3).sum(1),
    "matmul": lambda x, y, i: torch.stack([x @ x.t(), torch.bmm(x[None], x.t()[None])[0]]),
    "softmax": lambda x, y, i: torch.stack([x.softmax(-1), x.log_softmax(0).t().t()]),
    "layer_norm": lambda x, y, i: F.layer_norm(x, x.shape[-1:]),
    "index_select": lambda x, y, i: x.index_select(0, i),
    "gather": lambda x, y, i: x.gather(1, i[:3].view(-1, 1).expand(-1, 2)),
    "nll_loss": lambda x, y, i: F.nll_loss(x.log_softmax(1), i[:x.shape[0]]),
    "index_put": lambda x, y, i: torch.stack([x.index_put((i - 1,), y), x.index_put((i[:2],), y[:1] * 2, True),
                                              x.index_put((i.view(2, 3),), torch.ones(()), accumulate=True)]),
    # along an inner dim (leading full slices): index_copy's decomposition, a KV cache's update
    "index_put_inner": lambda x, y, i: torch.stack([
        x.index_copy(1, i[1:4], x[:, :3] * 2), torch.ops.aten.index_put.default(x, [None, i[1:4] - 3], x[:, 3:6] - 1),
        torch.ops.aten.index_put.default(x, [None, i[:2]], torch.ones(()), True),
        x.index_copy(1, i[3:4], x[:, :1] * 3), torch.ops.aten.index_put.default(x, [None, i[4:5] - 3], y[:1])]),
    "tril": lambda x, y, i: x.tril(),
}
SHAPES = [(4, 6), (5, 6), (3, 7)]
OTHER_SHAPES = [(6, 5), (4, 9)]  # the Torch-MLIR half's: new signatures, so kernels are built again


def _run(fn, device, shapes=SHAPES, widen=0):
    """``fn`` at each shape, its last dim widened by ``widen``: each case its own signatures, so no case finds
    its kernels built by another (in this process's op cache, which knows no lowering)."""
    torch.manual_seed(0)
    outs = []
    for rows, cols in shapes:
        shape = (rows, cols + widen)
        x, y = torch.randn(shape), torch.randn(shape[-1])
        index = torch.tensor([2, 0, 2, 1, 0, 2])
        out = fn(*(t.to(device) for t in (x, y, index)))
        outs.append(out.cpu())
    return outs


def _lowered(before: int) -> list:
    """The eager kernels lowered since ``before`` (a kernel found in the artifact cache lowers nothing)."""
    return [r for r in report.compile_reports()[before:]
            if r.kind == "eager" and ({"direct"} | TORCH_MLIR_STAGES) & r.stages.keys()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_eager_op_written_directly_matches_cpu(name, monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))  # nothing compiled elsewhere
    fn, widen = CASES[name], 6 * sorted(CASES).index(name)
    expected = _run(fn, "cpu", widen=widen)
    before = len(report.compile_reports())
    got = _run(fn, "neuron", widen=widen)
    built = _lowered(before)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, equal_nan=True)
    assert built and all("direct" in r.stages and not TORCH_MLIR_STAGES & r.stages.keys() for r in built), \
        [(r.graph, r.stages) for r in built]

    monkeypatch.setenv("NEURON_COMPILE_LOWERING", "torch-mlir")  # the same ops through Torch-MLIR
    expected = _run(fn, "cpu", OTHER_SHAPES, widen)
    before = len(report.compile_reports())
    through = _run(fn, "neuron", OTHER_SHAPES, widen)
    for g, e in zip(through, expected):
        torch.testing.assert_close(g, e, equal_nan=True)
    rebuilt = _lowered(before)
    assert rebuilt and all("torch-backend" in r.stages for r in rebuilt), [(r.graph, r.stages) for r in rebuilt]


def test_an_op_with_no_rule_takes_torch_mlir():
    """gelu's graph holds an erf, which has no rule here: the graph is Torch-MLIR's, unchanged."""
    x = torch.randn(5, 7)
    before = len(report.compile_reports())
    torch.testing.assert_close(F.gelu(x.to("neuron")).cpu(), F.gelu(x))
    gelu = [r for r in report.compile_reports()[before:] if "gelu" in r.graph]
    assert gelu and all({"direct", "torch-backend"} <= r.stages.keys() for r in gelu)


def test_lower_refuses_what_it_cannot_write_exactly():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.aten.add.Tensor(x, x))(torch.ones(3))
    text = direct.lower(gm)
    assert text is not None and '"stablehlo.add"' in text and "tensor<3xf32>" in text
    for fn, example in [(lambda x: torch.ops.aten.erf.default(x), torch.ones(3)),  # no rule
                        (lambda x: torch.ops.aten.add.Tensor(x, x), torch.ones(3, dtype=torch.complex64)),
                        (lambda x: torch.ops.aten.div.Tensor_mode(x, x, rounding_mode="floor"), torch.ones(3))]:
        assert direct.lower(make_fx(fn)(example)) is None
    symbolic = make_fx(lambda x: torch.ops.aten.add.Tensor(x, x), tracing_mode="symbolic")(torch.ones(3))
    assert direct.lower(symbolic) is None


def test_constants_are_exact_bit_patterns():
    assert direct_ir._literal(float("inf"), torch.float32) == "0x7F800000"
    assert direct_ir._literal(-0.0, torch.float16) == "0x8000"
    assert direct_ir._literal(1.0, torch.bfloat16) == "0x3F80"
    assert direct_ir._literal(0.1, torch.float64) == "0x3FB999999999999A"
    assert direct_ir._literal(2.9, torch.int64) == "2" and direct_ir._literal(3, torch.bool) == "true"


def test_the_lowering_option_is_checked_and_keyed(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_LOWERING", "fast")
    with pytest.raises(ValueError, match="lowering must be 'direct' or 'torch-mlir'"):
        Options.resolve()
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x + 1)(torch.ones(3))
    assert fx_cache_key(gm, "default", "direct").digest != fx_cache_key(gm, "default", "torch-mlir").digest


def test_a_warm_cache_serves_each_lowering_its_own_kernels(tmp_path):
    """The persistent op index is salted with the lowering: a process that asks for Torch-MLIR after a
    direct one traced the same ops gets Torch-MLIR's kernels, and a third direct process traces nothing."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import json, torch
        import neuron_compile.report as report
        from neuron_compile.device import ops
        a, b = torch.randn(3, 5, device="neuron"), torch.randn(5, device="neuron")
        (a * b).sum().cpu()
        stages = [sorted(r.stages) for r in report.compile_reports() if r.kind == "eager"]
        print(json.dumps({"torch_mlir": any("torch-backend" in s for s in stages), "traced": ops.COUNTS["op_compiles"],
                          "index_hits": ops.COUNTS["index_hits"]}))
    """)
    runs = []
    for lowering in ("direct", "torch-mlir", "direct"):
        env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"), NEURON_COMPILE_LOWERING=lowering)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, other, again = runs
    assert not first["torch_mlir"] and first["traced"] >= 2
    assert other["torch_mlir"] and other["index_hits"] == 0, other
    assert again["traced"] == 0 and again["index_hits"] == first["traced"], again


def test_one_position_written_along_a_dim_is_a_dynamic_update_slice(monkeypatch):
    """A KV cache's update (``index_copy_`` of one position): XLA runs a dynamic_update_slice in place on the
    donated buffer, where the scatter copied the whole cache; a position out of range writes nothing, as
    the scatter's (the row already there is written back), where the device's index check is off
    (``NEURON_COMPILE_INDEX_CHECKS=0``; on, it raises CPU's error first: test_device_bounds.py)."""
    from neuron_compile.device import ops

    monkeypatch.setattr(ops, "_INDEX_CHECKS", False)
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.decompositions import decomposition_table

    def update(cache, position, row):
        return cache.index_copy(2, position, row)

    gm = make_fx(update, decomposition_table=decomposition_table())(
        torch.zeros(1, 2, 8, 4), torch.tensor([3]), torch.ones(1, 2, 1, 4))
    text = direct.lower(gm)
    assert text is not None and "dynamic_update_slice" in text and "scatter" not in text
    cache = torch.randn(1, 2, 8, 4)
    for position in (3, 7, 8):  # 8 lies outside: index_copy on CPU raises, the unchecked device writes nothing
        got = update(cache.to("neuron"), torch.tensor([position]).to("neuron"), torch.ones(1, 2, 1, 4).to("neuron"))
        want = update(cache, torch.tensor([position]), torch.ones(1, 2, 1, 4)) if 0 <= position < 8 else cache
        torch.testing.assert_close(got.cpu(), want)



def test_index_select_of_a_0d_tensor_is_written_directly(monkeypatch, tmp_path):
    """index_add's and index_copy's backward at a 0-d source select from a 0-d gradient: Torch-MLIR cannot
    lower that (the device's OpInfo sweep counted it does-not-lower); the direct rule gives the element."""
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.tensor(2.5)
    for index in (torch.tensor([0]), torch.tensor(0)):
        got = x.to("neuron").index_select(0, index.to("neuron"))
        torch.testing.assert_close(got.cpu(), x.index_select(0, index))
    grads = []
    for device in ("cpu", "neuron"):
        source = torch.tensor(1.5, device=device, requires_grad=True)
        out = torch.tensor(4.0, device=device).index_add(0, torch.tensor([0], device=device), source, alpha=3)
        (out * 2).backward()
        grads.append(source.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])
