"""An index out of range raises on the ``neuron`` device as it does on CPU (``device/bounds.py``).

XLA's gather clamps and its scatter drops: before the check, ``embedding`` of an id
past the vocabulary returned another id's row and ``cross_entropy`` of a label past
the classes returned a loss, silently. Each case runs an op several times on the
same kernel: in range (negative and boundary values where CPU accepts them), out
of range, in range again; values and errors are CPU's.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops
from neuron_compile.device.opkernel import COUNTS

N = 6  # the indexed dim's size


def _t(values, device):
    return torch.tensor(values, device=device)


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


def test_an_in_place_op_refused_leaves_its_target_as_it_was():
    target = torch.arange(4., device="neuron")
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        target.index_put_((_t([1, 9], "neuron"),), _t([7., 8.], "neuron"))
    assert_close(target.cpu(), torch.arange(4.))


def test_ids_sliced_from_a_resident_corpus_are_checked_on_the_slice_alone():
    """A batch of ids sliced at a new offset from a large resident tensor (word_language_model's corpus):
    the check reads the batch (cloned on the device at a run-time offset), not the corpus, and compiles
    nothing after the first batch."""
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
    from neuron_compile.device import bounds

    monkeypatch.setenv("NEURON_COMPILE_INDEX_CHECKS", "0")
    assert not bounds.enabled()  # what ops reads when it is imported
    monkeypatch.setattr(device_ops, "_INDEX_CHECKS", bounds.enabled())
    checks = COUNTS["index_checks"]
    out = torch.arange(4., device="neuron").index_select(0, _t([1, 2], "neuron"))
    assert_close(out.cpu(), torch.tensor([1., 2.]))
    assert COUNTS["index_checks"] == checks
