"""Whole ops (``device/whole_ops.py``): ``nn.LSTM``/``GRU``/``RNN`` and ``scaled_dot_product_attention`` run
as one device op forward and one backward once built (in the background, from their second sighting), with
CPU's values and gradients; their decompositions wherever op-by-op's bits are asked for."""

from __future__ import annotations

import contextlib
import gc
import textwrap
import weakref

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.device import op_queue, op_tracking, whole_ops

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _queue_on():
    op_queue.set_enabled(True)
    yield
    op_queue.set_enabled(True)


def _turns(make, inputs, turns=4, create_graph=False):
    """``turns`` forward-backward passes of ``make()`` on CPU and on neuron (the same weights, new inputs each
    turn), compared each turn: outputs, input gradients, parameter gradients."""
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    for _ in range(turns):
        xs = inputs()
        results = []
        for model, args in ((cpu, xs), (dev, [x.detach().to("neuron").requires_grad_(x.requires_grad) for x in xs])):
            outs = torch.utils._pytree.tree_leaves(model(*args))
            loss = sum((o * o).sum() for o in outs)
            if create_graph:  # a gradient penalty: the gradient itself is differentiated
                grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
                loss = sum((g * g).sum() for g in grads)
            loss.backward()
            results.append([o.detach() for o in outs] + [x.grad for x in args if x.requires_grad]
                           + [p.grad for p in model.parameters()])
            model.zero_grad(set_to_none=True)
        for want, got in zip(*results):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
        op_queue.wait_for_builds()


def _lstm():
    return torch.nn.LSTM(8, 12, 2)


def _lstm_inputs():
    return [torch.randn(6, 3, 8, requires_grad=True), torch.randn(2, 3, 12), torch.randn(2, 3, 12)]


class _LSTMWithState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = _lstm()

    def forward(self, x, h, c):
        return self.rnn(x, (h, c))


def test_an_lstm_trains_as_one_op_each_way_with_cpus_values_and_gradients():
    before = dict(whole_ops.COUNTS)
    _turns(_LSTMWithState, _lstm_inputs, turns=5)
    # turns 1-2 ran the decomposition (the forward is built from its second sighting), the backward's first
    # whole turn recomputed the decomposition while its own kernel built; the rest were whole
    assert whole_ops.COUNTS["whole_forward"] - before["whole_forward"] >= 2
    assert whole_ops.COUNTS["whole_backward"] - before["whole_backward"] >= 1
    assert whole_ops.COUNTS["failures"] == before["failures"]


def test_a_whole_lstm_step_dispatches_a_handful_of_ops_not_its_pieces():
    model = _LSTMWithState().to("neuron")
    xs = [x.detach().to("neuron").requires_grad_(x.requires_grad) for x in _lstm_inputs()]

    def step():
        out, (h, c) = model(*xs)
        (out.sum() + h.sum()).backward()
        return out.sum().item()

    def ops_a_step():
        for _ in range(4):
            step()
            op_queue.wait_for_builds()
        before = sum(op_tracking.EXECUTED.values())
        step()
        return sum(op_tracking.EXECUTED.values()) - before

    whole = ops_a_step()
    whole_ops.ENABLED = False
    try:
        pieces = ops_a_step()
    finally:
        whole_ops.ENABLED = True
    # as its pieces: some 250 ops for 6 steps of 2 layers; whole: one op each way, the sums, their backward,
    # the gradients autograd fills in and the read
    assert whole < 30 and pieces > 8 * whole, (whole, pieces)


def test_a_calls_tensors_die_with_their_last_reference_not_at_pythons_cyclic_collection():
    """Seeing whether a call may run whole must not hold its tensors: a reference cycle did (a closure that
    called itself), so an LSTM's input, state and output lived on until Python's cyclic collector ran, and
    where it ran mid-step it changed which results that step's fused run returned (a step run op by op)."""
    model = _LSTMWithState().to("neuron")
    before = whole_ops.COUNTS["whole_forward"]
    gc.collect()
    gc.disable()
    try:
        for turn in range(6):
            x, h, c = (t.detach().to("neuron") for t in _lstm_inputs())
            x.requires_grad_(True)
            out, (h1, c1) = model(x, h, c)
            (out.sum() + h1.sum()).backward()
            x.grad.sum().item()  # a read ends the turn
            refs = [weakref.ref(t) for t in (x, h, c, out, h1, c1, x.grad)]
            del x, h, c, out, h1, c1
            op_queue.wait_for_builds()
            if turn >= 3:  # built (the first turns' traces leave cycles of their own, once)
                assert [r() is None for r in refs] == [True] * len(refs), turn
    finally:
        gc.enable()
    assert whole_ops.COUNTS["whole_forward"] - before >= 3


def test_a_reset_waits_for_the_builds_under_way_so_the_next_count_starts_at_zero():
    """``neuron_compile.reset()`` (every test's fixture) with a whole op's build on the background thread:
    the build's compile was counted after the zeroing, as the next test's compile (a JAX-lowering test
    counted 2 where its graph compiles 1, after an LBFGS test)."""
    import neuron_compile
    from neuron_compile.report import COUNTERS

    model = _LSTMWithState().to("neuron")
    for _ in range(6):  # until a turn starts the whole op's build
        x, h, c = (t.detach().to("neuron") for t in _lstm_inputs())
        model(x, h, c)[0].sum().item()
        building = not op_queue._idle()
        if building:
            break
    assert building, "no whole op was built in the background"
    neuron_compile.reset()
    op_queue.wait_for_builds()
    assert COUNTERS["xla_compiles"] == 0


@pytest.mark.parametrize("kind", ["GRU", "RNN"])
def test_a_batch_first_gru_and_a_relu_rnn_match_cpu(kind):
    def make():
        if kind == "GRU":
            return torch.nn.GRU(8, 12, 2, batch_first=True)
        return torch.nn.RNN(8, 12, 1, nonlinearity="relu", bidirectional=True)

    _turns(make, lambda: [torch.randn(3, 5, 8, requires_grad=True)])


class _Attention(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.options = options

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(self.proj(q), k, v, *mask, **self.options)


@pytest.mark.parametrize("options,mask", [({"is_causal": True}, False), ({"scale": 0.3}, True),
                                          ({"is_causal": True, "enable_gqa": True}, False)])
def test_attention_as_one_op_matches_cpu(options, mask):
    heads_kv = 2 if options.get("enable_gqa") else 4

    def inputs():
        xs = [torch.randn(2, 4, 6, 16), torch.randn(2, heads_kv, 6, 16, requires_grad=True),
              torch.randn(2, heads_kv, 6, 16, requires_grad=True)]
        return xs + ([torch.randn(6, 6) > 0] if mask else [])

    before = whole_ops.COUNTS["whole_backward"]
    _turns(lambda: _Attention(**options), inputs)
    assert whole_ops.COUNTS["whole_backward"] > before


def test_attention_without_a_graph_is_its_decomposition_with_cpus_values():
    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    before = dict(whole_ops.COUNTS)
    with torch.no_grad():  # generate, sampling loops: pieces that fuse in the queue's runs and keep bucketing
        for _ in range(3):
            got = F.scaled_dot_product_attention(*(t.to("neuron") for t in (q, k, v)), is_causal=True)
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
            op_queue.wait_for_builds()
    assert whole_ops.COUNTS == before


def test_a_models_layers_in_one_turn_build_nothing_and_the_next_turn_builds_the_attention():
    """The same attention in six layers of one step is one sighting, not a loop: nothing is traced or built
    during that (cold) step; the step after a host read is the second sighting, and builds it."""
    torch.manual_seed(5)  # a shape no other test gives the attention: its kernel is not built yet
    q, k, v = (torch.randn(3, 2, 7, 8, requires_grad=True) for _ in range(3))

    def step():
        x = q.detach().to("neuron").requires_grad_()
        keys, values = k.detach().to("neuron"), v.detach().to("neuron")
        for _ in range(6):  # six layers
            x = F.scaled_dot_product_attention(x, keys, values, is_causal=True)
        loss = x.square().sum()
        loss.backward()
        return loss.item()  # the host read that ends the turn

    expected = q
    for _ in range(6):
        expected = F.scaled_dot_product_attention(expected, k, v, is_causal=True)
    before = dict(whole_ops.COUNTS)
    torch.testing.assert_close(step(), expected.square().sum().item(), rtol=1e-5, atol=1e-5)
    op_queue.wait_for_builds()
    assert whole_ops.COUNTS == before  # six calls, one turn: nothing traced, nothing built
    step()
    op_queue.wait_for_builds()
    assert whole_ops.COUNTS["builds"] > before["builds"]  # the forward at its second turn (and its backward)
    torch.testing.assert_close(step(), expected.square().sum().item(), rtol=1e-5, atol=1e-5)
    assert whole_ops.COUNTS["whole_forward"] >= before["whole_forward"] + 6


def test_a_gradient_of_a_gradient_differentiates_the_decomposition():
    _turns(_LSTMWithState, _lstm_inputs, turns=4, create_graph=True)


@pytest.mark.parametrize("switch", ["fusion off", "deterministic", "dropout", "float64"])
def test_where_op_by_ops_bits_are_asked_for_the_op_is_its_decomposition(switch):
    torch.manual_seed(0)
    dtype = torch.float64 if switch == "float64" else torch.float32
    model = torch.nn.LSTM(8, 12, 2, dropout=0.5 if switch == "dropout" else 0.0).to(dtype).to("neuron")
    x = torch.randn(6, 3, 8, dtype=dtype).to("neuron")
    before = dict(whole_ops.COUNTS)
    if switch == "fusion off":
        op_queue.set_enabled(False)
    try:
        with _deterministic() if switch == "deterministic" else contextlib.nullcontext():
            for _ in range(4):
                model(x)[0].sum().backward()
                op_queue.wait_for_builds()
    finally:
        op_queue.set_enabled(True)
    assert {k: whole_ops.COUNTS[k] - before[k] for k in ("whole_forward", "builds")} == \
        {"whole_forward": 0, "builds": 0}


class _deterministic:
    def __enter__(self):
        self.was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.was)
        return False


def test_a_second_process_loads_the_whole_ops_from_the_index_and_traces_nothing(tmp_path, cold_then_warm):
    script = textwrap.dedent("""
        import json, sys, torch
        from neuron_compile.device import op_queue, ops, whole_ops
        torch.manual_seed(0)
        model = torch.nn.LSTM(8, 12, 2).to("neuron")
        x = torch.randn(6, 3, 8).to("neuron").requires_grad_()
        for _ in range(5):
            model(x)[0].sum().backward()
            x.grad.sum().item()
            op_queue.wait_for_builds()
        print(json.dumps({"compiles": ops.COUNTS["op_compiles"], "index_hits": ops.COUNTS["index_hits"],
                          **whole_ops.COUNTS}))
    """)
    first, second = cold_then_warm(script, tmp_path)
    assert first["builds"] == 2 and first["whole_backward"] >= 1
    assert second["builds"] == 2 and second["whole_backward"] >= 1
    assert second["compiles"] == 0, second


def test_an_op_taking_a_float_only_as_a_constant_is_not_built_with_one_calls_value():
    """A float argument the executable cannot take at run time (here a comparison's) would be baked into the
    kernel at the value of the call that built it, under a signature that does not say which: the op stays
    its pieces, said once (an LBFGS tolerance so built gave every later fit the first fit's tolerance)."""
    from neuron_compile.device.optim import define

    def body(x, v):
        return (x <= v).to(x.dtype)

    op = define("_test_float_constant", "_test_float_constant(Tensor x, float v) -> Tensor", body, body)
    x = torch.tensor([0.1, 0.5, 0.9])
    device_x = x.to("neuron")
    before = dict(whole_ops.COUNTS)
    with pytest.warns(UserWarning, match="taken only as a constant"):
        for v in (0.3, 0.7, 0.3, 0.7):
            assert not whole_ops.ready(op, (device_x, v), {})
            torch.testing.assert_close(body(device_x, v).cpu(), body(x, v))  # its pieces; the read ends a turn
            op_queue.wait_for_builds()
    assert whole_ops.COUNTS["builds"] == before["builds"]
    assert whole_ops.COUNTS["failures"] == before["failures"] + 1
