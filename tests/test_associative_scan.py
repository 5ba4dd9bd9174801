"""``associative_scan`` (decompositions/associative_scan.py): a generic-mode scan is one op under our backend,
bucketed as a prefix scan, expanded to PyTorch's recursion at concrete sizes; every result is eager's.

Mamba's selective scan in transformers is the model these exist for (mamba, falcon_mamba, zamba,
jamba call ``associative_scan(..., combine_mode="generic")`` off CUDA).
"""

import logging
import sys

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan

import neuron_compile
from neuron_compile import COUNTERS
from neuron_compile.decompositions import associative_scan as ours

LENGTHS = [37, 64, 100, 129, 200, 250]


def linear_recurrence(a, b):
    """Mamba's ``h[t] = a[t] h[t-1] + b[t]`` as an associative scan of (a, b) pairs along the tokens."""

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, h = associative_scan(combine, (a.sigmoid(), b), dim=1, combine_mode="generic")
    return h * 2


def pairs(t, grad=False):
    a, b = torch.randn(2, t, 4, requires_grad=grad), torch.randn(2, t, 4, requires_grad=grad)
    torch._dynamo.mark_static(a, 0)
    torch._dynamo.mark_static(b, 0)
    return a, b


def scan_ops(gm):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is ours.scan_op())


def test_the_private_names_this_module_uses_are_there():
    """Fails loudly when PyTorch moves what the substitution and the expansion use."""
    module = sys.modules["torch._higher_order_ops.associative_scan"]
    for name in ("associative_scan", "generic_associative_scan", "wrap_combine_fn_flat", "associative_scan_op"):
        assert callable(getattr(module, name)), name
    assert ours.scan_op() is module.associative_scan_op
    from torch._dynamo.symbolic_convert import InstructionTranslator

    assert callable(InstructionTranslator.current_tx)


def test_a_generic_scan_is_one_op_for_our_backend_and_the_recursion_for_others():
    import neuron_compile.capture.backend  # noqa: F401  (installs the substitution, as torch.compile does)

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(linear_recurrence, backend=capture, dynamic=True)(*pairs(9))
    assert len(graphs) == 1 and scan_ops(graphs[0]) == 0  # another backend traces PyTorch's recursion

    seen = {}
    real = ours.expand_associative_scans

    def count(gm):
        seen["ops"] = seen.get("ops", 0) + scan_ops(gm)
        return real(gm)

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(neuron_compile.compiler, "expand_associative_scans", count)
        a, b = pairs(9)
        torch.testing.assert_close(torch.compile(linear_recurrence, backend="neuron", dynamic=True)(a, b),
                                   linear_recurrence(a, b))
    assert seen["ops"] == 1


@pytest.mark.parametrize("hidden", [False, True], ids=["plain", "capture-hidden-from-dynamo"])
def test_a_linear_recurrence_over_padded_tokens_is_one_executable_per_bucket(hidden):
    if hidden:  # as after the first neuron op (neuron_compile.dynamo_skips hides the compile stack)
        from neuron_compile import dynamo_skips

        dynamo_skips.skip_in_dynamo("neuron_compile.capture")
    compiled = torch.compile(linear_recurrence, backend="neuron", dynamic=True)
    for t in LENGTHS:
        a, b = pairs(t)
        torch.testing.assert_close(compiled(a, b), linear_recurrence(a, b), rtol=1e-5, atol=1e-5)
    assert COUNTERS["bucketing_fallbacks"] == 0
    signatures = {(r.graph, r.signature) for r in neuron_compile.compile_reports()}
    assert len({g for g, _ in signatures}) == 1 and len(signatures) == 2, signatures
    assert all(s.startswith("bucket") for _, s in signatures)


def test_static_sizes_and_a_reverse_scan_equal_eager():
    def suffix(a, b):
        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]

        return associative_scan(combine, (a.tanh(), b), dim=0, reverse=True, combine_mode="generic")[1]

    compiled = torch.compile(suffix, backend="neuron")
    for t in (5, 16):
        a, b = torch.randn(t, 3), torch.randn(t, 3)
        torch.testing.assert_close(compiled(a, b), suffix(a, b), rtol=1e-5, atol=1e-5)


def test_a_scan_along_padded_blocks_keeps_exact_shapes_and_says_why(caplog):
    def over_rows(a, b):
        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]

        flat = associative_scan(combine, (a.sigmoid().reshape(-1), b.reshape(-1)), dim=0, combine_mode="generic")
        return flat[1].reshape(a.shape)

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    compiled = torch.compile(over_rows, backend="neuron", dynamic=True)
    for t in (37, 64):
        a, b = torch.randn(2, t), torch.randn(2, t)
        torch._dynamo.mark_static(a, 0)
        torch.testing.assert_close(compiled(a, b), over_rows(a, b), rtol=1e-5, atol=1e-5)
    reasons = [r.getMessage() for r in caplog.records if "compiles per exact shape" in r.getMessage()]
    assert reasons and "associative_scan along padded blocks" in reasons[0]
    assert "test_associative_scan.py" in reasons[0]  # the user's line, not ours


def test_a_scan_that_needs_a_gradient_trains_as_eager():
    compiled = torch.compile(linear_recurrence, backend="neuron", dynamic=True)
    for t in (5, 12):  # PyTorch's recursion, unrolled by Dynamo: short, to keep the test quick
        a, b = pairs(t, grad=True)
        compiled(a, b).square().sum().backward()
        got = a.grad, b.grad
        a.grad = b.grad = None
        linear_recurrence(a, b).square().sum().backward()
        torch.testing.assert_close(got, (a.grad, b.grad), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_hugging_face_mamba_inference_is_one_executable_per_bucket():
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    cfg = transformers.MambaConfig(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2,
                                   expand=2, conv_kernel=4, use_associative_scan=True)
    model = transformers.MambaForCausalLM(cfg).eval()
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    for t in LENGTHS:
        ids = torch.randint(0, 128, (2, t))
        torch._dynamo.mark_static(ids, 0)
        with torch.no_grad():
            torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits,
                                       rtol=1e-4, atol=1e-4)
    assert COUNTERS["bucketing_fallbacks"] == 0
    signatures = {(r.graph, r.signature) for r in neuron_compile.compile_reports()}
    assert len(signatures) == 2 and all(s.startswith("bucket") for _, s in signatures), signatures
