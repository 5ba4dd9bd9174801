"""An index out of range raises on the ``neuron`` device as it does on CPU (``device/bounds.py``).

XLA's gather clamps and its scatter drops: before the check, ``embedding`` of an id
past the vocabulary returned another id's row and ``cross_entropy`` of a label past
the classes returned a loss, silently. Each case runs an op several times on the
same kernel: in range (negative and boundary values where CPU accepts them), out
of range, in range again; values and errors are CPU's.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops
from neuron_compile.device.opkernel import COUNTS

N = 6  # the indexed dim's size


def _t(values, device):
    return torch.tensor(values, device=device) if values else torch.tensor(values, dtype=torch.long, device=device)


# name: (op(values, device) -> tensor, values CPU accepts, values it refuses)
CASES = {
    "embedding": (lambda v, d: torch.nn.functional.embedding(_t(v, d), torch.arange(2. * N, device=d).view(N, 2)),
                  [[0, N - 1], [3, 2]], [[1, N], [-1, 0]]),
    "index_select": (lambda v, d: torch.arange(N * 2., device=d).view(N, 2).index_select(0, _t(v, d)),
                     [[N - 1, 0], [2, 2]], [[N], [-1]]),
    "gather": (lambda v, d: torch.arange(2. * N, device=d).view(2, N).gather(1, _t(v, d)),
               [[[0, N - 1]], [[3, 1]]], [[[0, N]], [[-1, 0]]]),
    "advanced_index": (lambda v, d: torch.arange(2. * N, device=d).view(2, N)[:, _t(v, d)],
                       [[-N, N - 1], [-1, 0]], [[N], [-N - 1]]),
    "advanced_index_3d": (lambda v, d: torch.zeros(2, 3, N, device=d)[_t([True, False], d), :, _t(v, d)],
                          [[N - 1], [-N]], [[N], [0, -N - 1]]),
    "advanced_index_empty_dim": (lambda v, d: torch.zeros(2, 0, device=d)[:, _t(v, d)], [[]], [[1], [-1]]),
    "index_put_": (lambda v, d: torch.zeros(N, device=d).index_put_((_t(v, d),), torch.ones(len(v), device=d)),
                   [[-N], [N - 1]], [[N], [-N - 1]]),
    "index_put_accumulate": (lambda v, d: torch.zeros(N, device=d).index_put_(
        (_t(v, d),), torch.ones(len(v), device=d), accumulate=True), [[-1, -1], [0, 3]], [[0, N]]),
    "index_copy_": (lambda v, d: torch.zeros(N, 2, device=d).index_copy_(0, _t(v, d), torch.ones(len(v), 2, device=d)),
                    [[N - 1], [0]], [[N], [-1]]),
    "index_add_": (lambda v, d: torch.zeros(N, device=d).index_add_(0, _t(v, d), torch.ones(len(v), device=d)),
                   [[0, 0, N - 1]], [[0, N, 1]]),
    "index_fill_": (lambda v, d: torch.zeros(N, device=d).index_fill_(0, _t(v, d), 2.0), [[-N, N - 1]], [[N]]),
    "scatter_": (lambda v, d: torch.zeros(N, device=d).scatter_(0, _t(v, d), torch.ones(len(v), device=d)),
                 [[N - 1, 0]], [[N, 0], [-1, 0]]),
    "scatter_add": (lambda v, d: torch.zeros(N, device=d).scatter_add(0, _t(v, d), torch.ones(len(v), device=d)),
                    [[1, 1]], [[1, N + 3]]),
    "take": (lambda v, d: torch.arange(N * 1., device=d).take(_t(v, d)), [[-N, N - 1]], [[N], [-N - 1]]),
    "put_": (lambda v, d: torch.zeros(N, device=d).put_(_t(v, d), torch.ones(len(v), device=d)), [[-1]], [[N]]),
    "cross_entropy": (lambda v, d: torch.nn.functional.cross_entropy(
        torch.arange(len(v) * N * 1., device=d).view(len(v), N).sin(), _t(v, d)),
        [[0, N - 1], [-100, 2]], [[0, N], [-1, 0]]),
}
# a bool mask's selection depends on its data: the op runs on host copies (kernels._index), where CPU raises
ON_HOST = {"advanced_index_3d"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_index_out_of_range_raises_cpus_error_and_in_range_values_give_cpus(name):
    op, good, bad = CASES[name]
    for values in good + bad + good:  # one kernel, called again after the error
        try:
            expected = op(values, "cpu")
        except Exception as cpu_error:
            with pytest.raises(type(cpu_error)) as raised:
                op(values, "neuron")
            message = str(raised.value)
            assert message.startswith(str(cpu_error)), (message, str(cpu_error))
            if name not in ON_HOST:
                assert "on the neuron device, called at" in message and "test_device_bounds.py" in message
            continue
        assert values in good, (name, values)  # the cases say which values CPU refuses
        assert_close(op(values, "neuron").cpu(), expected)


def test_index_put_with_no_index_raises_cpus_error():
    """PyTorch's test_index_put_accumulate_empty: Torch-MLIR's lowering of the traced graph crashed the process;
    and its test_index_tensor_empty_indices (the meta kernel's RuntimeError, where CPU's is an IndexError)."""
    with pytest.raises(IndexError, match="at least one index must be provided"):
        torch.ops.aten.index.Tensor(torch.tensor([1.0], device="neuron"), [])
    for accumulate in (True, False):
        with pytest.raises(RuntimeError) as cpu:
            torch.rand(()).index_put([], torch.tensor([1.0]), accumulate)
        with pytest.raises(RuntimeError, match=re.escape(cpu.value.args[0])):
            torch.rand((), device="neuron").index_put([], torch.tensor([1.0], device="neuron"), accumulate)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_index_fill_with_a_complex_value_on_a_real_tensor_raises_cpus_error(dtype):
    """PyTorch's test_index_fill: an integer tensor took the value's real part, silently."""
    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match="Converting complex Scalar to non-complex type"):
            torch.zeros(3, dtype=dtype, device=device).index_fill_(0, _t([1], device), 1 + 1j)
    assert_close(torch.zeros(3, device="neuron").index_fill_(0, _t([1], "neuron"), 2.5).cpu(),
                 torch.tensor([0., 2.5, 0.]))


def test_an_in_place_op_refused_leaves_its_target_as_it_was():
    target = torch.arange(4., device="neuron")
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        target.index_put_((_t([1, 9], "neuron"),), _t([7., 8.], "neuron"))
    assert_close(target.cpu(), torch.arange(4.))


def test_ids_sliced_from_a_resident_corpus_are_checked_on_the_slice_alone():
    """A batch of ids sliced at a new offset from a large resident tensor (word_language_model's corpus):
    the check reads the batch's values where the corpus's buffer lies (``storage.resident_extremes``), and
    compiles nothing after the first batch."""
    corpus_cpu = torch.randint(0, 50, (40000,))
    corpus = corpus_cpu.to("neuron")
    table_cpu = torch.randn(50, 4)
    table = table_cpu.to("neuron")
    for i, start in enumerate(range(0, 400, 40)):
        if i == 2:
            compiles, copies, checks = COUNTS["op_compiles"], COUNTS["host_copies"], COUNTS["index_checks"]
        batch = corpus[start:start + 40]
        assert_close(torch.nn.functional.embedding(batch, table).cpu(),
                     torch.nn.functional.embedding(corpus_cpu[start:start + 40], table_cpu))
    assert COUNTS["op_compiles"] == compiles
    assert COUNTS["index_checks"] - checks == 8
    assert COUNTS["host_copies"] - copies == 8  # each result's .cpu(); the checks count apart


def test_a_resident_slices_check_reads_its_values_in_place_and_only_its_own(monkeypatch):
    """The values checked are the view's alone (an id out of range beside it in the corpus raises nothing),
    read with no op run on the device (no clone: ``transfers.alone`` is never called) and no copy of the
    corpus; one inside the view raises CPU's error."""
    from neuron_compile.device import transfers

    corpus_cpu = torch.randint(0, 50, (3, 4000))
    corpus_cpu[1, 100] = 77  # out of range, beside the slices below
    corpus = corpus_cpu.to("neuron")
    table_cpu = torch.randn(50, 4)
    table = table_cpu.to("neuron")

    alone = transfers.alone
    for view in (lambda c: c[1, 40:80], lambda c: c[:, 7], lambda c: c[1, 101:300:3]):  # offsets, strides
        checks = COUNTS["index_checks"]
        monkeypatch.setattr(transfers, "alone", lambda x: pytest.fail("the check ran a device op"))
        got = torch.nn.functional.embedding(view(corpus), table)
        monkeypatch.setattr(transfers, "alone", alone)  # (.cpu() of a view clones it alone)
        assert_close(got.cpu(), torch.nn.functional.embedding(view(corpus_cpu), table_cpu))
        assert COUNTS["index_checks"] == checks + 1
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.nn.functional.embedding(corpus[1, 90:110], table)
    labels_cpu = torch.tensor([3, -100, 7, -100, 49])  # ignore_index counted as in range, as CPU does
    logits = torch.randn(5, 50)
    assert_close(torch.nn.functional.cross_entropy(logits.to("neuron"), labels_cpu.to("neuron")).cpu(),
                 torch.nn.functional.cross_entropy(logits, labels_cpu))
    labels_cpu[1] = -99
    with pytest.raises(IndexError, match="Target -99 is out of bounds"):
        torch.nn.functional.cross_entropy(logits.to("neuron"), labels_cpu.to("neuron"))


def test_hugging_face_labels_with_ignore_index_pass_and_a_token_past_the_vocabulary_raises():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 50, (2, 8))
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt masked out of the loss, as Hugging Face's collators do
    with torch.no_grad():
        expected = model(input_ids=ids, labels=labels).loss
        model.to("neuron")
        assert_close(model(input_ids=ids.to("neuron"), labels=labels.to("neuron")).loss.cpu(), expected)
        ids[1, 4] = 50  # one past the vocabulary: CPU raises; the device must not return another row's loss
        with pytest.raises(IndexError, match="index out of range in self"):
            model(input_ids=ids.to("neuron"))


def test_the_variable_turns_the_check_off(monkeypatch):
    from neuron_compile.device import index_checks as bounds

    monkeypatch.setenv("NEURON_COMPILE_INDEX_CHECKS", "0")
    assert not bounds.enabled()  # what ops reads when it is imported
    monkeypatch.setattr(device_ops, "_INDEX_CHECKS", bounds.enabled())
    checks = COUNTS["index_checks"]
    out = torch.arange(4., device="neuron").index_select(0, _t([1, 2], "neuron"))
    assert_close(out.cpu(), torch.tensor([1., 2.]))
    assert COUNTS["index_checks"] == checks


# --- graphs compiled by torch.compile: index_bounds.add_checks ----------------------------------

def _lookup_and_loss(emb, lin):
    def step(ids, labels):
        logits = lin(emb(ids))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    return step


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_compiled_graph_raises_cpus_error_for_an_index_out_of_range_and_compiles_nothing_more(device):
    from neuron_compile import report

    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 10)
    eager = _lookup_and_loss(emb, lin)
    compiled = torch.compile(_lookup_and_loss(copy.deepcopy(emb).to(device), copy.deepcopy(lin).to(device)),
                             backend="neuron")
    ids, labels = torch.randint(0, 50, (2, 5)), torch.randint(0, 10, (2, 5))
    labels[0, :2] = -100  # ignore_index: in range
    cases = [((0, 0, 49), (1, 1, 9)), ((0, 0, 50), None), (None, (1, 1, 10)), (None, (1, 2, -5)),
             ((1, 4, -1), None), ((0, 0, 3), (1, 1, 0))]
    for step, (id_at, label_at) in enumerate(cases):
        if step == 1:
            lowerings = report.COUNTERS["lowerings"]
        ids_now, labels_now = ids.clone(), labels.clone()
        if id_at:
            ids_now[id_at[:2]] = id_at[2]
        if label_at:
            labels_now[label_at[:2]] = label_at[2]
        try:
            expected = eager(ids_now, labels_now)
        except IndexError as cpu_error:
            with pytest.raises(IndexError) as raised:
                compiled(ids_now.to(device), labels_now.to(device))
            message = str(raised.value)
            assert message.startswith(str(cpu_error)), (message, str(cpu_error))
            assert "compiled by torch.compile" in message and "test_device_bounds.py" in message, message
            continue
        assert_close(compiled(ids_now.to(device), labels_now.to(device)).cpu(), expected)
    assert report.COUNTERS["lowerings"] == lowerings  # the check is part of the executable: no recompile


def test_a_compiled_hugging_face_training_step_checks_its_ids_and_labels():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 50, (2, 8))
    labels = ids.clone()
    labels[:, :3] = -100
    expected = model(input_ids=ids, labels=labels).loss
    expected.backward()
    grad = model.transformer.wte.weight.grad.clone()
    model.zero_grad()
    model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    loss = compiled(input_ids=ids.to("neuron"), labels=labels.to("neuron")).loss
    loss.backward()
    assert_close(loss.cpu(), expected)
    assert_close(model.transformer.wte.weight.grad.cpu(), grad, rtol=1e-4, atol=1e-5)
    ids[0, 2] = 50
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(input_ids=ids.to("neuron"), labels=labels.to("neuron"))


def test_graphs_padded_to_a_bucket_are_not_checked_and_stay_exact():
    """A bucketed graph's padded rows hold anything (``ids - 1`` is -1 there): checked, they would raise, and
    the bucketed path would give up on the graph (a fallback to exact shapes, one compile per length)."""
    from neuron_compile import report

    torch.manual_seed(0)
    table = torch.nn.Embedding(20, 4)

    def f(ids):
        return table(ids - 1).sum(1)

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    fallbacks, buckets = report.COUNTERS["bucketing_fallbacks"], report.COUNTERS["buckets"]
    for length in (5, 9, 12, 7):
        ids = torch.randint(1, 21, (2, length))
        assert_close(compiled(ids), f(ids))
    assert report.COUNTERS["buckets"] == buckets + 1  # one bucket served the lengths after the first
    assert report.COUNTERS["bucketing_fallbacks"] == fallbacks


def test_the_variable_leaves_compiled_graphs_unchecked(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_INDEX_CHECKS", "0")  # read at each compile
    table = torch.randn(5, 2)
    compiled = torch.compile(lambda i: torch.nn.functional.embedding(i, table) * 2, backend="neuron")
    assert_close(compiled(torch.tensor([1, 4])), table[[1, 4]] * 2)
    compiled(torch.tensor([1, 5]))  # XLA clamps, unchecked, as the variable asks: no error
