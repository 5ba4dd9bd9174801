"""The neuron backend against eager PyTorch: models, dtypes, shapes, mutations, errors."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_compile
from neuron_compile import COUNTERS, LoweringError


def compiled(fn, **kw):
    return torch.compile(fn, backend="neuron", **kw)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def check_training(model, *inputs, rtol=1e-4, atol=1e-5):
    """Loss and every parameter's gradient of the compiled model equal eager's."""
    model.zero_grad()
    ref = model(*inputs)
    ref.sum().backward()
    ref_grads = grads(model)
    model.zero_grad()
    out = compiled(model)(*inputs)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    got = grads(model)
    assert got.keys() == ref_grads.keys() and got
    for name in ref_grads:
        torch.testing.assert_close(got[name], ref_grads[name], rtol=rtol, atol=atol, msg=name)


class MLP(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, 10)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def test_mlp_inference_and_training():
    model = MLP()
    x = torch.randn(8, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x))
    torch._dynamo.reset()
    check_training(model, x)
    kinds = sorted(r.kind for r in neuron_compile.compile_reports())
    assert kinds == ["backward", "forward", "inference"]


OPTIMIZERS = {  # the README's list
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),  # addcmul_/addcdiv_ with value=: prims.fma
    "adam-foreach": lambda params: torch.optim.Adam(params, lr=1e-2, foreach=True),  # torch._foreach_*
    "adam-fused": lambda params: torch.optim.Adam(params, lr=1e-2, fused=True),
    "sgd-nesterov-foreach": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True,
                                                           foreach=True),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=1e-2),
    "adamax": lambda params: torch.optim.Adamax(params, lr=1e-2),
    "nadam": lambda params: torch.optim.NAdam(params, lr=1e-2),
    "radam": lambda params: torch.optim.RAdam(params, lr=1e-2),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_whole_training_step_with_the_optimizer_compiled(name):
    make_optimizer = OPTIMIZERS[name]
    torch.manual_seed(0)
    model, twin = MLP(), MLP()
    twin.load_state_dict(model.state_dict())
    opt, opt_twin = make_optimizer(model.parameters()), make_optimizer(twin.parameters())
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))

    def step(net, optimizer):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    compiled_step = compiled(step)
    for _ in range(3):
        torch.testing.assert_close(compiled_step(model, opt), step(twin, opt_twin), rtol=1e-5, atol=1e-6)
    for (param, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=param)
    # forward, backward and the optimizer's update were compiled; PyTorch keeps fused optimizers
    # out of Dynamo (torch.compiler.disable on _fused_adam), so those update eagerly
    graphs = COUNTERS["graphs"]
    assert (graphs == 2 if name == "adam-fused" else graphs >= 3), graphs


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(p=0.0)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.head = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv1(x))))
        x = self.drop(F.relu(self.conv2(x)))
        return self.head(x.flatten(1))


def test_cnn_train_mode_updates_batchnorm_statistics():
    model = CNN().train()
    twin = CNN().train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 16, 16)
    check_training(model, x)
    # the compiled forward ran once, the eager reference once: same running stats as a twin run twice eagerly
    twin(x)
    twin(x)
    torch.testing.assert_close(model.bn.running_mean, twin.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, twin.bn.running_var)
    assert model.bn.num_batches_tracked.item() == 2


def test_cnn_eval_mode():
    model = CNN().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x), rtol=1e-4, atol=1e-5)


class Attention(nn.Module):
    """A hand-written causal self-attention block (no SDPA)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = scores.softmax(-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


def test_hand_written_attention():
    model = Attention()
    x = torch.randn(2, 16, 32)
    check_training(model, x)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal-bool", "causal-float", "both"])
def test_transformer_encoder_fast_path(norm_first, activation, masks):
    # In eval mode without grad, nn.TransformerEncoderLayer runs the fused
    # aten._transformer_encoder_layer_fwd, which torch-mlir does not lower
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 7, 32)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:] = True
    padding[2, 3:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(7)  # float, -inf above the diagonal
    kwargs = {"none": {}, "padding": {"src_key_padding_mask": padding},
              "causal-bool": {"mask": causal.isinf()}, "causal-float": {"mask": causal},
              "both": {"mask": causal.isinf(), "src_key_padding_mask": padding}}[masks]

    class Ops(TorchDispatchMode):
        seen: set = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.seen.add(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        with Ops():
            want = encoder(x, **kwargs)
        assert torch.ops.aten._transformer_encoder_layer_fwd.default in Ops.seen  # the fast path ran
        got = compiled(encoder)(x, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


CONVOLUTIONS = {  # torch-mlir lowered the backward only of the plain 2-D case (the last one)
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, padding=1), (2, 4, 9)),
    "conv1d-stride-dilation-groups": (lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2, groups=2, padding=2),
                                      (2, 4, 11)),
    "conv-transpose1d": (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1), (2, 4, 9)),
    "conv-transpose2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=1, padding=1), (2, 4, 5, 5)),
    "conv-transpose2d-groups-dilation": (lambda: nn.ConvTranspose2d(4, 6, 3, groups=2, dilation=2), (2, 4, 5, 5)),
    # output padding at the stride, which the dilation allows: the adjoint runs one row long
    "conv-transpose2d-output-padding-past-stride": (
        lambda: nn.ConvTranspose2d(2, 2, 3, stride=(1, 2), dilation=(2, 2), output_padding=(1, 1)), (2, 2, 4, 4)),
    "conv3d": (lambda: nn.Conv3d(2, 3, 3), (1, 2, 5, 5, 5)),
    "conv2d-dilation": (lambda: nn.Conv2d(2, 3, 3, stride=2, dilation=2), (1, 2, 9, 9)),
    "conv2d-depthwise": (lambda: nn.Conv2d(4, 4, 3, groups=4, padding=1), (1, 4, 7, 7)),
    "conv2d-no-bias-rectangular": (lambda: nn.Conv2d(4, 6, (3, 2), stride=(3, 1), bias=False), (2, 4, 10, 9)),
    "conv2d": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1), (2, 4, 9, 9)),
}


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_convolution_training_weight_bias_and_input_gradients(name):
    make, shape = CONVOLUTIONS[name]
    torch.manual_seed(0)
    model = nn.Sequential(make(), nn.GELU())
    check_training(model, torch.randn(*shape))
    x = torch.randn(*shape, requires_grad=True)
    model(x).sum().backward()
    want, x.grad = x.grad, None
    compiled(model)(x).sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_weight_norm_training(dim):
    # training through weight_norm (wav2vec2's positional conv uses dim=2) meets the opaque
    # _weight_norm_interface_backward
    torch.manual_seed(0)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1), dim=dim)
    model = nn.Sequential(conv, nn.GELU())
    check_training(model, torch.randn(2, 4, 9))


@pytest.mark.parametrize("mode, case", [
    (mode, case) for mode in ("sum", "mean", "max")
    for case in ("offsets", "offsets-empty-bag-last-offset", "rows", "padding")] + [("sum", "weights")])
def test_embedding_bag_forward_and_weight_gradient(mode, case):
    # nn.EmbeddingBag (the text-classification tutorial's model) did not lower; per_sample_weights
    # exist only for mode="sum"
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(20, 8, mode=mode, padding_idx=3 if case == "padding" else None,
                          include_last_offset=case == "offsets-empty-bag-last-offset")
    kwargs = {}
    if case == "rows":
        args = (torch.randint(0, 20, (4, 5)),)
    else:
        ids = torch.randint(0, 20, (12,))
        ids[[2, 7]] = 3  # the padding index, where it is one
        offsets = {"offsets-empty-bag-last-offset": [0, 4, 4, 9, 12]}.get(case, [0, 4, 9])
        args = (ids, torch.tensor(offsets))
        if case == "weights":
            kwargs["per_sample_weights"] = torch.rand(12)
    out = compiled(bag)(*args, **kwargs)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    got = bag.weight.grad.clone()
    bag.weight.grad = None
    want = bag(*args, **kwargs)
    (want * torch.arange(want.numel()).reshape(want.shape)).sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(got, bag.weight.grad)


def test_graph_break_in_the_middle():
    def fn(x):
        y = torch.sin(x) * 2
        print("graph break")  # Dynamo splits here
        return torch.cos(y) + y

    x = torch.randn(5, 7)
    torch.testing.assert_close(compiled(fn)(x), fn(x))
    assert COUNTERS["graphs"] >= 2


def test_int64_inputs_stay_int64():
    emb = nn.Embedding(1000, 16)
    ids = torch.tensor([[3, 999, 0, 512]], dtype=torch.int64)

    def fn(ids):
        big = ids * (2**40)  # would overflow int32
        return emb(ids).sum(-1), big

    with torch.no_grad():
        out, big = compiled(fn)(ids)
        ref, ref_big = fn(ids)
    torch.testing.assert_close(out, ref)
    assert big.dtype == torch.int64
    assert torch.equal(big, ref_big)


def test_bf16_model():
    model = MLP().to(torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = compiled(model)(x)
        ref = model(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool],
)
def test_dtypes_round_trip_exactly(dtype):
    def fn(a, b):
        return a, torch.where(b, a, a.flip(0)), (a == a.flip(0))

    if dtype == torch.bool:
        a = torch.rand(6, 3) > 0.5
    elif dtype.is_floating_point:
        a = (torch.randn(6, 3) * 100).to(dtype)
    else:
        info = torch.iinfo(dtype)
        a = torch.randint(info.min, info.max, (6, 3), dtype=dtype)
    b = torch.rand(6, 3) > 0.5
    out = compiled(fn)(a, b)
    ref = fn(a, b)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype
        assert torch.equal(o, r)


def test_non_contiguous_zero_size_scalar_and_multiple_outputs():
    def fn(x, empty, s):
        return x.sum(), x * 2, empty + 1, (x * s).mean(0)

    x = torch.randn(8, 6).t()  # non-contiguous
    assert not x.is_contiguous()
    empty = torch.randn(0, 4)
    s = torch.randn(6, 1)
    out = compiled(fn)(x, empty, s)
    ref = fn(x, empty, s)
    assert out[0].shape == () and out[2].shape == (0, 4)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)


def test_outputs_alias_inputs_and_input_mutation():
    def fn(x, buf):
        buf.add_(1)  # functionalized by AOTAutograd, written back after the call
        return x, x.view(-1), buf * 2

    x = torch.randn(3, 4)
    buf = torch.zeros(4)
    ref_buf = torch.zeros(4)
    out = compiled(fn)(x, buf)
    ref = fn(x, ref_buf)
    assert out[0] is x or out[0].data_ptr() == x.data_ptr()
    assert out[1].data_ptr() == x.data_ptr()  # a view of the input, as in eager
    torch.testing.assert_close(out[2], ref[2])
    torch.testing.assert_close(buf, ref_buf)


# A custom op: torch-mlir can never have a lowering for it, whatever decompositions we add.
@torch.library.custom_op("neuron_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.flip(0) * 3


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def test_op_that_does_not_lower_names_op_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_REPRO_DIR", str(tmp_path))

    def fn(x):
        y = x + 1
        return mystery(y) * 2

    with pytest.raises(Exception) as info:
        compiled(fn)(torch.randn(16))
    err = getattr(info.value, "inner_exception", info.value)  # Dynamo wraps backend errors
    assert isinstance(err, LoweringError), info.value
    text = str(err)
    assert "neuron_test.mystery" in text
    assert "test_backend.py" in text and "return mystery(y) * 2" in text
    assert err.repro_dir and err.repro_dir.startswith(str(tmp_path))
    assert f"neuron-compile repro {err.repro_dir}" in text
    assert "mystery" in (tmp_path / err.repro_dir / "graph.py").read_text()
    assert "neuron_test.mystery" in (tmp_path / err.repro_dir / "input.mlir").read_text()
    # the reproducer reproduces
    from neuron_compile.lowering import repro

    assert "mystery" in repro(err.repro_dir)


def test_changing_shapes_match_eager_and_compile_once_per_shape():
    model = MLP(width=16)
    calls = [(1, 16), (3, 16), (5, 16), (3, 16), (9, 16)]
    c = compiled(model, options={"buckets": 0})  # exact shapes: no bucketing
    with torch.no_grad():
        for shape in calls:
            x = torch.randn(*shape)
            torch.testing.assert_close(c(x), model(x))
    # the first shape compiles statically; Dynamo's automatic dynamic shapes hands us a
    # symbolic graph on the second, specialized once per new batch size (3 is reused)
    assert COUNTERS["specializations"] == 3
    assert COUNTERS["bucketed_graphs"] == 0


def test_batch_and_sequence_lengths_change_in_training():
    model = Attention()
    c = compiled(model)
    for b, t in [(2, 8), (3, 8), (3, 12), (1, 5), (3, 12)]:
        x = torch.randn(b, t, 32)
        model.zero_grad()
        out = c(x)
        out.pow(2).mean().backward()
        got = grads(model)
        model.zero_grad()
        ref = model(x)
        ref.pow(2).mean().backward()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        for name, g in grads(model).items():
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-5)


def test_changing_python_scalar():
    def fn(x, scale, n):
        return x * scale + x.shape[0] * n

    c = compiled(fn)
    x = torch.randn(4, 3)
    for scale, n in [(0.5, 1), (2.0, 2), (-3.25, 7), (1e-3, 0)]:
        torch.testing.assert_close(c(x, scale, n), fn(x, scale, n))


def test_zero_dim_tensor_constant_in_graph():
    def fn(y):
        y = y.clone()
        y[y < 0] = 0.0  # a 0-d float constant in the graph (part of the cache key)
        return y * 2

    x = torch.randn(8)
    torch.testing.assert_close(compiled(fn)(x), fn(x))
