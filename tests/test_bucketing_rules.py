"""Padding rules real models need (issue 21), one test each: bucketed where the rule proves the op
exact (each fails without its rule: the graph would compile per exact shape), exact shapes with the
reason where it can't. Every result against eager; 6 lengths over 2 buckets of 128.
"""

import logging

import pytest
import torch

import neuron_compile
from neuron_compile import COUNTERS

LENGTHS = [37, 64, 100, 129, 200, 250]


def bucket_signatures():
    return {(r.graph, r.signature) for r in neuron_compile.compile_reports() if r.signature.startswith("bucket")}


def assert_bucketed(n_buckets=2):
    """One executable per (graph, bucket), every compile a bucket's, no graph at exact shapes."""
    assert COUNTERS["bucketing_fallbacks"] == 0
    reports = neuron_compile.compile_reports()
    assert COUNTERS["xla_compiles"] == len(bucket_signatures()) == len(reports)
    per_graph = {}
    for graph, signature in bucket_signatures():
        per_graph.setdefault(graph, set()).add(signature)
    assert per_graph and all(len(s) == n_buckets for s in per_graph.values()), per_graph


def exact_shape_reasons(caplog):
    return [r.getMessage() for r in caplog.records if "compiles per exact shape" in r.getMessage()]


def rows_static(rows):
    """Arguments for one ``[rows, t]`` tensor whose batch is static: only the length changes."""

    def make_args(t):
        x = torch.randn(rows, t)
        torch._dynamo.mark_static(x, 0)
        return (x,)

    return make_args


def run_lengths(fn, make_args, lengths=LENGTHS, **tol):
    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    for t in lengths:
        args = make_args(t)
        got, want = compiled(*args), fn(*args)
        torch.testing.assert_close(got, want, **tol)


# ----------------------------------------------------------------------------- index.Tensor


def mask_by_position_lookup(x):
    """transformers' mask functions: position ids read at (batch, query) and (batch, key) aranges."""
    b, t, _ = x.shape
    position_ids = torch.arange(t).expand(b, -1)
    batch_idx = torch.arange(b)[:, None, None]
    q_idx, kv_idx = torch.arange(t)[None, :, None], torch.arange(t)[None, None, :]
    causal = position_ids[batch_idx, kv_idx] <= position_ids[batch_idx, q_idx]
    scores = (x @ x.transpose(1, 2)).masked_fill(~causal, float("-inf"))
    return scores.softmax(-1) @ x


def test_index_with_arange_indices_along_the_padded_dim_is_bucketed():
    run_lengths(mask_by_position_lookup, lambda t: (torch.randn(2, t, 8),), rtol=1e-5, atol=1e-5)
    assert_bucketed()


def test_index_with_data_indices_along_the_padded_dim_keeps_exact_shapes(caplog):
    def gather_rows(x, idx):
        return x[:, idx] * 2  # idx's values are data: nothing proves them inside the real region

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    run_lengths(gather_rows, lambda t: (torch.randn(2, t), torch.randint(0, t, (t,))))
    assert COUNTERS["bucketing_fallbacks"] == 1
    reasons = exact_shape_reasons(caplog)
    assert reasons and "aten.index.Tensor along padded dim 1" in reasons[0], reasons


# ----------------------------------------------------------------------------- sizes that change


def test_topk_and_convolution_give_their_new_sizes_a_fresh_layout():
    # topk's k along an unpadded dim (MoE routers: top-2 of the experts per token), then flattened with
    # the padded token dim; a convolution's output channels over a padded batch. Both took the input's
    # layout for the resized dim: the view was refused, and the convolution's bucketed compile failed.
    conv = torch.nn.Conv1d(3, 8, 3)

    def route(x, y):
        return torch.topk(x, 2, dim=-1).indices.view(-1) * 2, conv(y)

    def make_args(t):
        x, y = torch.randn(t, 4), torch.randn(t, 3, 16)
        for tensor, dim in ((x, 1), (y, 1), (y, 2)):
            torch._dynamo.mark_static(tensor, dim)
        return x, y

    with torch.no_grad():
        run_lengths(route, make_args)
    assert_bucketed()


# ----------------------------------------------------------------------------- index_put


def test_index_put_into_a_padded_dim_wraps_negative_indices_with_the_true_size():
    # a static KV cache's index_copy_ at cache_position during decode: the cache length is padded, the
    # position is data; -1 must name the true last row, not the bucket's
    def write(cache, pos, row):
        return cache.index_put((pos,), row) * 1

    def make_args(t):
        cache, row = torch.randn(t, 4), torch.randn(1, 4)
        torch._dynamo.mark_static(cache, 1)
        torch._dynamo.mark_static(row, 1)
        return cache, torch.tensor([-1 if t % 2 else t // 2]), row

    run_lengths(write, make_args)
    assert_bucketed()


def test_index_backward_accumulates_into_a_padded_dim():
    # x[arange(t)]'s backward is index_put(zeros, [arange], grad, accumulate=True) into the padded dim
    # (falcon's training step): padded index positions add masked zeros
    def pick(table, x):
        return table[torch.arange(x.shape[0])] * x

    compiled = torch.compile(pick, backend="neuron", dynamic=True)
    for t in LENGTHS:
        table, x = torch.randn(t, 8, requires_grad=True), torch.randn(t, 8)
        torch._dynamo.mark_static(table, 1)
        torch._dynamo.mark_static(x, 1)
        twin = table.detach().clone().requires_grad_()
        compiled(table, x).sum().backward()
        pick(twin, x).sum().backward()
        torch.testing.assert_close(table.grad, twin.grad)
    assert_bucketed()


def test_repeat_tiles_a_padded_dim_as_copies_with_their_own_padding():
    # bloom's alibi repeats a per-position tensor over heads; repeating along the padded dim itself
    # gives a layout (copies, length): each copy's prefix is real, reduced over exactly
    def tile(x):
        y = x.repeat(3, 2)  # [3 * b, 2 * t]
        return y.softmax(-1), y.view(3, x.shape[0], 2, x.shape[1]).sum(-1)

    run_lengths(tile, rows_static(4))
    assert_bucketed()


# ----------------------------------------------------------------------------- ways shapes become dynamic


@pytest.mark.parametrize("way", ["mark_dynamic", "automatic", "batch"])
def test_every_way_a_size_becomes_symbolic_buckets(way):
    # torch._dynamo.mark_dynamic, automatic dynamic shapes (no flag: the second distinct length makes
    # the graph symbolic), and a batch dim that changes (an epoch's smaller last batch)
    compiled = torch.compile(mask_by_position_lookup, backend="neuron")
    shapes = [(2, t) for t in LENGTHS] if way != "batch" else [(8, 16), (8, 16), (5, 16), (3, 16)]
    for b, t in shapes:
        x = torch.randn(b, t, 8)
        if way == "mark_dynamic":
            torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(compiled(x), mask_by_position_lookup(x), rtol=1e-5, atol=1e-5)
    assert COUNTERS["bucketing_fallbacks"] == 0
    buckets = {r.signature for r in neuron_compile.compile_reports() if r.signature.startswith("bucket")}
    static = [r for r in neuron_compile.compile_reports() if not r.signature]
    # automatic: the first shape compiles static, the graph recompiled symbolic buckets the rest
    assert len(static) == (0 if way == "mark_dynamic" else 1)
    assert len(buckets) == (1 if way == "batch" else 2), buckets


@pytest.mark.slow
def test_generate_with_a_static_cache_compiles_its_decode_step_once_per_bucket():
    # transformers' generate compiles the forward it decodes with (a static cache sized per prompt):
    # the cache length is symbolic from the second prompt on, and the cache write (index_copy_ at
    # cache_position) into its padded length is exact
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    cfg = transformers.AutoConfig.for_model(
        "llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    compile_config = transformers.CompileConfig(backend="neuron", mode=None)
    compile_config._compile_all_devices = True  # generate compiles on CPU only when told
    for t in [37, 64, 100, 129, 200]:
        ids = torch.randint(3, 128, (1, t))
        kw = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, cache_implementation="static")
        got = model.generate(ids, compile_config=compile_config, **kw)
        torch.testing.assert_close(got, model.generate(ids, disable_compile=True, **kw), rtol=0, atol=0)
    assert COUNTERS["bucketing_fallbacks"] == 0
    reports = neuron_compile.compile_reports()
    # the first prompt's decode step compiles static; the symbolic one once per bucket (128, 256)
    assert sorted(r.signature.split(" ")[0] for r in reports) == ["", "bucket", "bucket"], \
        [(r.graph, r.signature) for r in reports]


@pytest.mark.slow
def test_generate_with_a_compiled_forward_reuses_one_prefill_and_one_decode_per_bucket(fresh_cache):
    # the user compiles the forward (dynamic=True) and generates with a static cache: prompts of
    # 5 lengths over 2 buckets run the prefill (a graph over the prompt) and the decode step (a
    # graph over the cache length) at one executable per bucket each, tokens equal to eager's
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    cfg = transformers.AutoConfig.for_model(
        "llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    eager = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    eager.load_state_dict(model.state_dict())
    model.forward = torch.compile(model.forward, backend="neuron", dynamic=True)
    kw = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, cache_implementation="static", disable_compile=True)
    for t in [37, 64, 100, 129, 200]:
        ids = torch.randint(3, 128, (1, t), generator=torch.Generator().manual_seed(t))
        torch.testing.assert_close(model.generate(ids, **kw), eager.generate(ids, **kw), rtol=0, atol=0)
    assert_bucketed()  # prefill and decode: one executable per bucket (128, 256) each
    assert len({r.graph for r in neuron_compile.compile_reports()}) == 2


def test_index_put_along_an_unpadded_dim_of_a_padded_tensor():
    # out[:, idx] = v: index_put(out, [None, idx], v), the padded dim left whole and written row by row
    def scatter_columns(x, idx, v):
        out = x.clone()
        out[:, idx] = v
        return out.softmax(0)

    def make_args(t):
        x, idx, v = torch.randn(t, 4), torch.tensor([3, 0]), torch.randn(t, 2)
        for tensor, dim in ((x, 1), (idx, 0), (v, 1)):
            torch._dynamo.mark_static(tensor, dim)
        return x, idx, v

    run_lengths(scatter_columns, make_args)
    assert_bucketed()


def test_a_slice_from_a_symbolic_start_reads_at_the_true_start():
    # the last t entries of a static table (mpt's alibi): at the bucket the start would be 512 - 128,
    # not 512 - t (a wrong number once: it compiled bucketed and returned other entries). The
    # bucketed slice now reads from the true start; a select at a size likewise
    table = torch.arange(512.0)
    rows = torch.arange(512.0 * 3).view(512, 3)

    def tail(x):
        return x + table[512 - x.shape[1]:] + rows[x.shape[1] - 1].sum()

    run_lengths(tail, rows_static(2))
    assert_bucketed()


# ----------------------------------------------------------------------------- sort along a padded dim


class GroupedExperts(torch.nn.Module):
    """transformers' grouped experts (integrations/moe.py, every MoE of the zoo), as its graph has it:
    the (batch, token, top-k) pairs sorted by expert id, the tokens gathered as ``tokens[perm // k]``,
    expert offsets from a histogram, each row multiplied by its expert's weights, the rows put back by
    the inverse permutation ``inv[perm] = arange``."""

    def __init__(self, hidden=8, experts=4, top_k=2, rounding="floor"):
        super().__init__()
        self.rounding = rounding  # jetmoe divides the positions by top-k with rounding_mode="trunc"
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.weight = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * 0.3)
        self.experts, self.top_k = experts, top_k

    def forward(self, x):
        b, t, h = x.shape
        tokens = x.reshape(-1, h)
        weights, ids = self.router(tokens).softmax(-1).topk(self.top_k, dim=-1)
        ids_sorted, perm = torch.sort(ids.reshape(-1))
        rows = tokens[perm.div(self.top_k, rounding_mode=self.rounding)]
        counts = torch.histc(ids_sorted.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, 0).to(torch.int64)
        expert = (torch.arange(rows.shape[0])[:, None] >= offsets[None, :]).sum(1).clamp(max=self.experts - 1)
        out = torch.bmm(rows[:, None, :], self.weight[expert])[:, 0] * weights.reshape(-1)[perm][:, None]
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.shape[0])
        return out[inv].view(b * t, self.top_k, h).sum(1).view(b, t, h)


@pytest.mark.parametrize("rounding", ["floor", "trunc"])
def test_moe_sort_of_expert_ids_over_padded_tokens_is_bucketed_in_inference_and_training(rounding, fresh_cache):
    # the batch is static, so a token's position (b, t) is b * S + t at the bucket and b * s + t in
    # eager: the sort's indices are positions in the padded layout, the sort puts the padded pairs
    # last, and the indices the forward saves for the backward cross as eager's positions
    torch.manual_seed(0)
    moe = GroupedExperts(rounding=rounding)
    compiled = torch.compile(moe, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x = torch.randn(2, t, 8)
        torch._dynamo.mark_static(x, 0)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        got = compiled(xc)
        (got * torch.linspace(-1, 1, 8)).sum().backward()
        grads = [xc.grad] + [p.grad.clone() for p in moe.parameters()]
        moe.zero_grad()
        want = moe(xe)
        (want * torch.linspace(-1, 1, 8)).sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(grads, [xe.grad] + [p.grad for p in moe.parameters()]):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        moe.zero_grad()
    assert_bucketed()


def test_sort_along_a_padded_dim_returns_eager_values_and_eager_indices():
    def sort_flat(x):
        values, indices = torch.sort(x.reshape(-1), descending=True)
        return values * 2, indices

    run_lengths(sort_flat, rows_static(2))
    assert_bucketed()


def test_arithmetic_on_a_padded_sorts_indices_keeps_exact_shapes(caplog):
    # the indices are positions in the padded layout: as values (here scaled) they are not eager's
    def scaled_order(x):
        return torch.sort(x.reshape(-1))[1] * 3

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    run_lengths(scaled_order, rows_static(2))
    assert COUNTERS["bucketing_fallbacks"] == 1
    reasons = exact_shape_reasons(caplog)
    assert reasons and "positions in the padded layout" in reasons[0], reasons


# ----------------------------------------------------------------------------- windows, concatenation, norms


def run_training_lengths(fn, make_args, lengths=LENGTHS, rtol=1e-4, atol=1e-5, weights=(), static=(0,)):
    """``fn`` compiled and eager at each length: the result and the gradient of every argument.
    Every argument's dims ``static`` (the batch) are static, the arguments at ``weights`` wholly
    (as parameters)."""
    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    for t in lengths:
        args = make_args(t)
        mine = [a.clone().requires_grad_() for a in args]
        ref = [a.clone().requires_grad_() for a in args]
        for k, a in enumerate(mine):
            for d in ([None] if k in weights else static):
                torch._dynamo.mark_static(a, d)
        got, want = compiled(*mine), fn(*ref)
        weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(t))
        (got * weight).sum().backward()
        (want * weight).sum().backward()
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        for m, r in zip(mine, ref):
            torch.testing.assert_close(m.grad, r.grad, rtol=rtol, atol=atol)


def test_convolution_over_padded_tokens_is_bucketed():
    # a Mamba block's causal depthwise conv (padding k - 1, the first t outputs), trained, and a
    # strided conv (its output length a FloorDiv of t): real outputs read real inputs, or zeros where
    # eager reads its zero padding, once the padded inputs are masked to zeros; the input gradient is
    # a transposed conv and the weight gradient a conv by the padded output gradient, masked alike
    def causal(x, w):
        return torch.nn.functional.conv1d(x.transpose(1, 2), w, padding=3, groups=8)[..., :x.shape[1]]

    def strided(x, w):
        return torch.nn.functional.conv1d(x.transpose(1, 2), w, stride=2, padding=1, groups=8)

    def make_args(t):
        w = torch.randn(8, 1, 4)
        torch._dynamo.mark_static(w)  # a weight: static, as a module's parameters are
        return torch.randn(2, t, 8), w

    # the weight's gradient sums 2 x 250 products: float32 noise is 1e-5
    run_training_lengths(causal, lambda t: (torch.randn(2, t, 8), torch.randn(8, 1, 4)), atol=1e-4, weights=(1,))
    assert_bucketed()
    neuron_compile.reset()
    run_lengths(strided, make_args, rtol=1e-5, atol=1e-5)
    assert_bucketed()


def test_cat_after_a_padded_piece_puts_its_elements_where_eager_does():
    # gpt-oss's attention sinks: a column cat after the padded key dim, softmaxed with it, sliced off;
    # the backward slices the sink's gradient from a symbolic start (the true key length)
    def sink_attention(q, k, sinks):
        scores = q @ k.transpose(1, 2)
        scores = torch.cat([scores, sinks.view(1, 1, 1).expand(q.shape[0], q.shape[1], 1)], -1)
        return scores.softmax(-1)[..., :-1] @ k

    run_training_lengths(sink_attention, lambda t: (torch.randn(2, t, 8), torch.randn(2, t, 8), torch.randn(1)))
    assert_bucketed()


def test_vector_norm_over_a_padded_dim_is_bucketed():
    def normalize(x):
        return x / torch.linalg.vector_norm(x, dim=1, keepdim=True) + torch.linalg.vector_norm(x, ord=float("inf"))

    run_training_lengths(normalize, lambda t: (torch.randn(2, t, 8),))
    assert_bucketed()


def test_a_view_that_strides_at_concrete_sizes_forbid_is_retraced_as_a_reshape():
    # re-tracing a symbolic graph at concrete sizes can give an intermediate other strides than the
    # symbolic trace did (bamba's chunked scan with one chunk: its backward crashed, "Cannot view a
    # tensor with shape [2, 4, 1, 32, 256, 1] and strides ..."): a view the graph holds over a
    # permuted tensor must still trace, and compute the same values
    from neuron_compile.capture.backend import specialize

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.view.default, (graph.call_function(aten.permute.default, (x, [1, 0])),
                                                         [-1])))
    x = torch.randn(3, 4)
    traced = specialize(torch.fx.GraphModule({}, graph), [x])
    torch.testing.assert_close(traced(x), x.t().reshape(-1))


def test_sizes_sympy_cannot_compare_are_checked_at_each_call():
    # mpt's alibi: the last min(512, t) entries of a static table added to t scores (512 - Max(0,
    # 512 - s) against s: equal for every length the model takes, which each call checks); Mamba2's
    # chunked scan pads the tokens to a multiple of the chunk (a symbolic pad whose bucketed length
    # must cover the true one), views them as chunks (whole chunks: the prefix of the chunk count)
    # and reads the last one (a slice from the true end)
    table = torch.arange(512.0)

    def alibi(x):
        return x + table[max(0, 512 - x.shape[1]):]

    def chunk_pad(x):
        # padded to whole chunks of 16, viewed as chunks: a prefix sum within each, the last of them
        t = x.shape[1]
        chunks = torch.nn.functional.pad(x, (0, (16 - t % 16) % 16), value=1.0).view(x.shape[0], -1, 16)
        sums = chunks.cumsum(-1)
        return sums.sum((-1, -2)) + sums[:, -1:, -1:].sum((-1, -2)) + x.cumsum(-1)[:, -1]

    for fn in (alibi, chunk_pad):
        neuron_compile.reset()
        run_lengths(fn, rows_static(2), rtol=1e-4, atol=1e-4)
        assert_bucketed()


def test_a_write_from_padded_positions_leaves_the_rest_of_the_target_as_it_was():
    # a static cache's prefill: the prompt's keys written at cache_position = arange(t) into a cache
    # longer than the prompt. The padded positions would write garbage into the cache's real zeros:
    # they write a scratch row, dropped after
    def prefill(cache, keys):
        return cache.index_copy(1, torch.arange(keys.shape[1]), keys) + 0

    def make_args(t):
        cache, keys = torch.zeros(2, t + 4, 8), torch.randn(2, t, 8)
        for x in (cache, keys):
            torch._dynamo.mark_static(x, 0)
            torch._dynamo.mark_static(x, 2)
        return cache, keys

    run_lengths(prefill, make_args)
    assert_bucketed()


def test_polar_is_pointwise():
    # deepseek-v2's rotary embedding: torch.polar(ones, freqs) per position, then its real part (view_as_real)
    def rotate(x):
        return (torch.polar(torch.ones_like(x), x) * 2).real.softmax(-1)

    run_lengths(rotate, rows_static(2))
    assert_bucketed()


def test_complex_rotary_embedding_trains_bucketed():
    # deepseek-v2's training step: x as complex pairs times polar(1, angle); the backward multiplies
    # by the conjugate (aten._conj, pointwise)
    def rotary(x, angle):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        turned = pairs * torch.polar(torch.ones_like(angle), angle)[None]
        return torch.view_as_real(turned).flatten(-2)

    compiled = torch.compile(rotary, backend="neuron", dynamic=True)
    for t in LENGTHS:
        x, angle = torch.randn(2, t, 8), torch.randn(t, 4)
        mine, ref = [x.clone().requires_grad_(), angle.clone().requires_grad_()], [x.requires_grad_(), angle.requires_grad_()]
        for a, static in zip(mine, ((0, 2), (1,))):
            for d in static:
                torch._dynamo.mark_static(a, d)
        got, want = compiled(*mine), rotary(*ref)
        (got * torch.linspace(-1, 1, 8)).sum().backward()
        (want * torch.linspace(-1, 1, 8)).sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for m, r in zip(mine, ref):
            torch.testing.assert_close(m.grad, r.grad, rtol=1e-5, atol=1e-5)
    assert_bucketed()


def test_a_bucketed_result_is_contiguous_as_eagers_is():
    # sliced from the bucket's buffer, a result kept the bucket's strides: user code viewing it
    # (dbrx's experts, x.view(-1, h) after a graph break) failed where eager's result views fine
    compiled = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    for t in (37, 64):
        x = torch.randn(2, t, 8)
        torch._dynamo.mark_static(x, 0)
        out = compiled(x)
        assert out.is_contiguous()
        torch.testing.assert_close(out.view(-1, 8), (x * 2).view(-1, 8))
    assert_bucketed(n_buckets=1)


# ----------------------------------------------------------------------------- topk, gather and scatter along a padded dim


def sparse_attention(k_top):
    """The sparse-attention indexers (deepseek_v32, glm_moe_dsa, hy_v4, dots3_note, axk2): each query
    keeps the keys of its top ``min(index_topk, T)`` scores, dropped keys masked through a scatter of
    the kept indices."""

    def attend(q, k, v):
        b, t, _ = q.shape
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = (q @ k.transpose(1, 2)).masked_fill(~causal, float("-inf"))
        top = scores.topk(min(k_top, t), dim=-1).indices.to(torch.int32)
        drop = top.new_ones((b, t, t), dtype=torch.bool).scatter(-1, top.long(), False)
        return (q @ k.transpose(1, 2)).masked_fill(drop | ~causal, float("-inf")).softmax(-1) @ v

    return attend


def length_only(n, width=8):
    """``n`` tensors ``[2, t, width]`` of which only the length ``t`` is dynamic."""

    def make_args(t):
        args = [torch.randn(2, t, width) for _ in range(n)]
        for a in args:
            torch._dynamo.mark_static(a, 0)
            torch._dynamo.mark_static(a, 2)
        return args

    return make_args


@pytest.mark.parametrize("k_top", [2048, 100, 16], ids=["whole-dim", "min-of-both", "static"])
def test_topk_along_a_padded_dim_takes_the_real_elements_first(k_top, fresh_cache):
    # topk at the bucket is a sort with the padded elements last, cut at the bucket's k: k the whole
    # dim (index_topk above every length), min(100, t) (the whole dim below 100 tokens, 100 past it),
    # a static 16; the indices, scattered into a mask along the padded key dim, drop no real key.
    # (After the first, Dynamo makes k_top an int input, which is bucketed too: a topk's first k
    # of the bucket's k are eager's; a fresh cache, as two k share the bucket's executable)
    run_lengths(sparse_attention(k_top), length_only(3), rtol=1e-5, atol=1e-5)
    assert_bucketed()


def test_gather_and_topk_along_a_padded_dim_in_training():
    # the top 16 tokens' rows gathered along the padded token dim, scaled by their scores; backward
    # scatters the gradients of both back along it (the topk's indices cross to the backward)
    def top_rows(x, w):
        scores = (x @ w)[..., 0]
        values, index = scores.topk(16, dim=-1)
        rows = x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))
        return rows * values[..., None].sigmoid()

    run_training_lengths(top_rows, lambda t: (torch.randn(2, t, 8), torch.randn(8, 1)), weights=(1,), static=(0, 2))
    assert_bucketed()


def test_scatter_and_gather_along_a_padded_dim_by_data_indices_stay_where_eager_accepts_them():
    # gather and the scatters raise in eager for an index outside [0, size) (no negative wrap as
    # in indexing), so on every call eager accepts, the real indices lie in the true size: the
    # real region of a prefix-padded dim, whatever computed them (here: data)
    def drop_columns(x, idx):
        return x.scatter(1, idx, 0.0) * 2 + x.gather(1, idx).sum(1, keepdim=True)

    run_lengths(drop_columns, lambda t: (torch.randn(2, t), torch.randint(0, t, (2, 4))))
    assert_bucketed()


def test_scatters_from_padded_index_entries_along_the_padded_dim_are_exact():
    # the index's padded entries are garbage that could point at real elements, and repeat; the
    # decompositions turn scatter into sums (scatter_add of counts, padded values masked to 0) and
    # one-hot reductions over the index's dim (padded entries masked to the identity), so eager's
    # values come out, the repeats' last writer included
    def scramble(x):
        idx = (x.abs() * 10).long() % x.shape[1]
        return x.scatter(1, idx, 0.0) * 2, x.scatter(1, idx, x * 3)

    run_lengths(scramble, rows_static(2))
    assert_bucketed()


def test_zeros_take_their_neighbours_layout_in_a_cat_and_a_scatter():
    # inkling's router over the flattened tokens: a gather of the top-2 routed scores, cat with the
    # shared expert's. Its backward builds zeros of the merged token dim for the gather's scatter_add
    # and for the cat's unselected piece; zeros have no padding of their own, so they take the other
    # operands' layout (2, s) where their fresh one would be (2*s,)
    def shared_expert_router(x, w):
        tokens = x.reshape(-1, x.shape[-1])
        logits = tokens @ w
        routed, shared = logits[:, :3], logits[:, 3:]
        weights = torch.cat([routed.gather(-1, routed.topk(2, dim=-1).indices), shared], -1).sigmoid()
        return weights[:, :2].reshape(x.shape[0], -1, 2)

    run_training_lengths(shared_expert_router, lambda t: (torch.randn(2, t, 8), torch.randn(8, 4)), weights=(1,),
                         static=(0, 2))
    assert_bucketed()


def test_an_assert_on_an_exact_scalar_is_bucketed():
    # dbrx's graphs assert on a reduction of the padded tokens: the 0-d operand is exact (its
    # reduction masked) and unpadded, so the assert does not keep the graph at exact shapes
    def checked(x, limit):
        torch._assert_async((x.abs().amax() < limit).to(torch.bool), "activation out of range")
        return x * 2

    run_lengths(checked, lambda t: (torch.randn(2, t), torch.tensor(1e9)))
    assert_bucketed()


# ----------------------------------------------------------------------------- sizes Dynamo made symbolic


def head_after_a_graph_break(x, labels, w):
    hidden = torch.tanh(x @ w)
    torch._dynamo.graph_break()
    logits = hidden @ w.t()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def test_a_batch_made_symbolic_by_a_graph_break_is_specialized(caplog):
    # after a graph break every size of the resumed frame's inputs is symbolic: the hidden states'
    # batch too ([s_b, s_t, 8]), against labels whose static batch the user marked ([2, s_l]). The
    # loss's gather needs the two alike: the batch is specialized at the value Dynamo traced it at
    # and the two lengths assumed equal, both checked at each call (ctrl, dbrx, longcat_flash)
    head = head_after_a_graph_break

    def make_args(t):
        x, labels = torch.randn(2, t, 8), torch.randint(0, 8, (2, t))
        torch._dynamo.mark_static(x, 0)
        torch._dynamo.mark_static(x, 2)
        torch._dynamo.mark_static(labels, 0)
        w = torch.randn(8, 8)  # a parameter's sizes are static
        torch._dynamo.mark_static(w)
        return x, labels, w

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    with torch.no_grad():
        run_lengths(head, make_args)
    assert not exact_shape_reasons(caplog)
    assert_bucketed()
    # another batch breaks the specialization: exact shapes, still eager's numbers
    compiled = torch.compile(head, backend="neuron", dynamic=True)
    x, labels, w = torch.randn(3, 50, 8), torch.randint(0, 8, (3, 50)), torch.randn(8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, labels, w), head(x, labels, w))


def segment_sum(x):
    """transformers' Mamba2 segment sum: ``out[..., i, j] = x[..., j + 1] + ... + x[..., i]`` for
    ``j <= i``, ``-inf`` above the diagonal."""
    c = x.shape[-1]
    x = x[..., None].expand(*x.shape, c).masked_fill(~torch.tril(torch.ones(c, c, dtype=torch.bool), -1), 0)
    return x.cumsum(-2).masked_fill(~torch.tril(torch.ones(c, c, dtype=torch.bool)), -torch.inf)


def chunked_scan(x, a, b, c):
    """transformers' Mamba2 ``torch_forward`` scan (bamba, falcon_h1, ...): the tokens of ``x``
    ``[batch, t, heads, p]``, ``a`` ``[batch, t, heads]``, ``b``, ``c`` ``[batch, t, heads, n]``
    padded to a multiple of the chunk and viewed as chunks, a segment sum within each chunk and
    a recurrence over chunks, as einsums; the first ``t`` tokens of the result."""
    batch, t, heads, p = x.shape
    chunk = 256
    pad = (chunk - t % chunk) % chunk

    def chunks(z):
        z = torch.nn.functional.pad(z, (0, 0) * (z.dim() - 2) + (0, pad))
        return z.reshape(z.shape[0], -1, chunk, *z.shape[2:])

    x, a, b, c = (chunks(z) for z in (x, a, b, c))
    a = a.permute(0, 3, 1, 2)
    a_cum = a.cumsum(-1)
    scores = torch.einsum("bclhn,bcshn->bclsh", c, b) * torch.exp(segment_sum(a)).permute(0, 2, 3, 4, 1)
    y = torch.einsum("bclsh,bcshp->bclhp", scores, x)
    decay = torch.exp(a_cum[:, :, :, -1:] - a_cum).permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", b * decay, x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)
    decay_chunk = torch.exp(segment_sum(torch.nn.functional.pad(a_cum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)[:, :-1]
    y = y + torch.einsum("bclhn,bchpn->bclhp", c, states) * torch.exp(a_cum).permute(0, 2, 3, 1)[..., None]
    return y.reshape(batch, -1, heads, p)[:, :t]


def scan_args(t):
    g = torch.Generator().manual_seed(t)
    return (torch.randn(2, t, 4, 8, generator=g), -0.1 * torch.rand(2, t, 4, generator=g),
            0.3 * torch.randn(2, t, 4, 16, generator=g), 0.3 * torch.randn(2, t, 4, 16, generator=g))


def static_but_tokens(make_args):
    """``make_args`` with every dim of every argument static but the tokens (dim 1)."""

    def make(t):
        args = make_args(t)
        for x in args:
            for d in range(x.dim()):
                if d != 1:
                    torch._dynamo.mark_static(x, d)
        return args

    return make


scan_args_static_but_tokens = static_but_tokens(scan_args)


def test_tokens_padded_to_whole_chunks_the_bucket_shares_are_not_padded():
    # Mamba2's chunked scan: the tokens padded to a multiple of the chunk (256), t + (256 - t % 256)
    # % 256, are as many at the bucket (a multiple of 128) as at the true length, and hold eager's
    # values there (constant_pad_nd writes from the true end): that dim and the chunk count are
    # invariant, not padded, so the chunks' views, segment sums and contractions are exact, forward
    # and backward (each call checks the sizes are the same at its bucket)
    run_lengths(chunked_scan, scan_args_static_but_tokens, rtol=1e-4, atol=1e-4)
    assert_bucketed()
    neuron_compile.reset()
    run_training_lengths(chunked_scan, scan_args, rtol=1e-4, atol=1e-4, static=(0, 2, 3))
    assert_bucketed()


def test_sizes_the_guards_make_constant_are_constants():
    # a Mamba2 block trained: a causal depthwise conv over the tokens, then the chunked scan. At one
    # chunk Dynamo guards the chunk count to 1 and writes sizes through it (the conv's channels as
    # 256 * (P // 256) + c, its weight gradient's length 4 as a FloorDiv of P): under the guards
    # they are constants (or t + k), at every true size and bucket a call has, which it checks
    def mixer(u, w, a):
        h = torch.nn.functional.conv1d(u.transpose(1, 2), w, padding=3, groups=u.shape[2])[..., :u.shape[1]]
        h = torch.nn.functional.silu(h.transpose(1, 2))
        x, b, c = torch.split(h, [32, 64, 64], -1)
        batch, t = u.shape[:2]
        return chunked_scan(x.reshape(batch, t, 4, 8), a, b.reshape(batch, t, 4, 16), c.reshape(batch, t, 4, 16))

    def make_args(t):
        g = torch.Generator().manual_seed(t)
        return (torch.randn(2, t, 160, generator=g), 0.3 * torch.randn(160, 1, 4, generator=g),
                -0.1 * torch.rand(2, t, 4, generator=g))

    run_training_lengths(mixer, make_args, rtol=1e-4, atol=1e-4, weights=(1,), static=(0, 2))
    assert_bucketed()


def test_a_size_taken_for_the_same_at_the_bucket_is_checked_at_each_call():
    # what the two rules above assume is checked per call: the tokens padded to whole chunks of 256
    # are as many at a bucket of 128 as at the true length, not at 384 for 200 (a failing check
    # sends the graph to exact shapes)
    import sympy

    from neuron_compile.bucketing.layouts import NotBucketable
    from neuron_compile.bucketing.padding import check_sizes
    from neuron_compile.bucketing.analysis import SAME_AT_BUCKET

    s = sympy.Symbol("s", integer=True, positive=True)
    padded = s + sympy.Mod(256 - sympy.Mod(s, 256), 256)
    check_sizes([(padded, SAME_AT_BUCKET), (padded, sympy.Integer(256))], {s: 37}, {s: 128})
    with pytest.raises(NotBucketable):
        check_sizes([(padded, SAME_AT_BUCKET)], {s: 200}, {s: 384})
    with pytest.raises(NotBucketable):
        check_sizes([(padded, sympy.Integer(256))], {s: 200}, {s: 384})


def test_chunk_counts_above_one_and_a_recompile_with_a_symbol_per_tensor_are_bucketed():
    # lengths of 2 chunks first: the chunk count is symbolic (the padded tokens invariant); then
    # shorter ones: Dynamo recompiles at 1 chunk and gives each tensor's length its own symbol, the
    # sizes written through several of them (sampled alike, replaced by constants, checked per
    # call); the backward buckets them as the forward did
    lengths = [300, 500, 37, 200]  # buckets 384, 512, then 128, 256: two per graph

    run_lengths(chunked_scan, scan_args_static_but_tokens, lengths=lengths, rtol=1e-4, atol=1e-4)
    assert_bucketed()
    neuron_compile.reset()
    run_training_lengths(chunked_scan, scan_args, lengths=lengths, rtol=1e-4, atol=1e-4, static=(0, 2, 3))
    assert_bucketed()


def test_a_backward_takes_the_sizes_its_forward_specialized(fresh_cache):
    # the training step of the same head: the backward's own analysis would pad the batch the
    # forward specialized (ctrl's backward: a view to [s_b * s_t, vocab] of a [2, s_t, vocab] layout)
    compiled = torch.compile(head_after_a_graph_break, backend="neuron", dynamic=True)
    w0 = torch.randn(8, 8)
    for t in LENGTHS:
        x, labels = torch.randn(2, t, 8), torch.randint(0, 8, (2, t))
        grads = []
        for fn in (compiled, head_after_a_graph_break):
            xa, w = x.clone().requires_grad_(), w0.clone().requires_grad_()
            for a, dims in ((xa, (0, 2)), (labels, (0,)), (w, (0, 1))):
                for d in dims:
                    torch._dynamo.mark_static(a, d)
            loss = fn(xa, labels, w)
            loss.backward()
            grads.append((loss.detach(), xa.grad, w.grad))
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_bucketed()


def test_random_draws_shaped_as_a_padded_tensor_are_bucketed():
    # phimoe's sparsemixer in training: Gumbel noise drawn shaped as the padded scores, the argmax
    # over the experts. Eager and compiled draw from different generators, so only shapes, the
    # range of the picks and the executables are compared
    def gumbel_pick(scores):
        return (scores - torch.empty_like(scores).exponential_().log()).max(-1)[1]

    compiled = torch.compile(gumbel_pick, backend="neuron", dynamic=True)
    for t in LENGTHS:
        scores = torch.randn(2, t, 4)
        torch._dynamo.mark_static(scores, 0)
        torch._dynamo.mark_static(scores, 2)
        picks = compiled(scores)
        assert picks.shape == (2, t) and 0 <= int(picks.min()) and int(picks.max()) < 4
    assert_bucketed()


def gated_delta_rule(q, k, v, g, beta):
    """transformers' ``torch_chunk_gated_delta_rule`` (qwen3_5, qwen3_next, olmo_hybrid, lara_mini):
    ``[batch, t, heads, d]`` tokens padded to chunks of 64, a triangular solve within each chunk
    and a Python loop over the chunks, which Dynamo unrolls and guards (one graph per count)."""
    chunk, t = 64, q.shape[1]
    q, k, v, beta, g = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta, g))
    pad = (chunk - t % chunk) % chunk
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (torch.nn.functional.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(x.shape[0], x.shape[1], -1, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(g.shape[0], g.shape[1], -1, chunk).cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay
    attn = (q @ k.transpose(-1, -2)) * decay
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_decay = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = torch.zeros_like(values)
    q, k = q * g.exp()[..., None], k * (g[..., -1:] - g).exp()[..., None]
    for i in range((t + pad) // chunk):
        v_new = values[:, :, i] - k_decay[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + attn[:, :, i] @ v_new
        state = state * g[:, :, i, -1, None, None].exp() + k[:, :, i].transpose(-1, -2) @ v_new
    return out.reshape(out.shape[0], out.shape[1], -1, out.shape[-1])[:, :, :t].transpose(1, 2)


def test_a_loop_over_chunks_smaller_than_the_bucket_pads_to_the_graphs_last_length(caplog):
    # chunks of 64 under buckets of 128: Dynamo unrolls the loop over chunks and guards its count,
    # so a graph admits only the lengths (64 (n - 1), 64 n]; padded to 128 its tokens would be two
    # chunks where it traced one. The bucket is capped at the last length the graph's guards admit
    # (64 n), where the tokens padded to whole chunks are as many as at the true length (invariant):
    # one executable per graph, every length of a chunk count reusing it (t = 64, no padding, is a
    # graph of its own: Dynamo's guards on the padding)
    def make_args(t):
        gen = torch.Generator().manual_seed(t)
        q, k = (torch.nn.functional.normalize(torch.randn(2, t, 2, 16, generator=gen), dim=-1) for _ in range(2))
        return (q, k, torch.randn(2, t, 2, 16, generator=gen), -torch.rand(2, t, 2, generator=gen),
                torch.rand(2, t, 2, generator=gen))

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    lengths = [37, 50, 64, 100, 129, 180, 200, 250]  # chunk counts 1, 1, 1, 2, 3, 3, 4, 4
    run_lengths(gated_delta_rule, static_but_tokens(make_args), lengths=lengths, rtol=1e-4, atol=1e-4)
    assert not exact_shape_reasons(caplog)
    per_graph = {}
    for r in neuron_compile.compile_reports():
        per_graph.setdefault(r.graph, []).append(r.signature)
    assert COUNTERS["xla_compiles"] == len(per_graph) == 5, per_graph  # counts 1 (and t = 64 alone), 2, 3, 4
    assert sorted(len(s) for s in per_graph.values()) == [1] * 5
    # each graph at its last admitted length: 63 (37, 50: a padding of 64 - t % 64 > 0), 64, 128, 192, 256
    sizes = sorted({int(b.split("->")[1]) for v in per_graph.values() for b in v[0].removeprefix("bucket ").split(", ")})
    assert sizes == [63, 64, 128, 192, 256], per_graph
    neuron_compile.reset()
    run_training_lengths(gated_delta_rule, make_args, lengths=[37, 50, 129, 180], rtol=1e-4, atol=1e-4,
                         static=(0, 2, 3))
    assert not exact_shape_reasons(caplog)
    assert COUNTERS["xla_compiles"] == 4  # forward and backward of counts 1 and 3


def test_a_cat_of_pieces_padded_alike_is_laid_out_as_blocks():
    # musicgen's per-codebook heads, torch.stack (a cat along the padded tokens and a view), and
    # prophetnet's n-gram streams, a cat along the tokens chunked back: pieces padded alike sit at
    # [i S, i S + S) at the bucket, the layout (n, s) of the cat's dim, which the view, the chunks
    # (a split into the n blocks) and the cat's backward (slices of whole blocks) read as eager does
    def heads(x, w):
        return torch.stack([x @ w[i] for i in range(4)], dim=1).softmax(-1)

    def ngram(x):
        a, b, c = torch.cat([x, x * 2, x.sin()], 1).softmax(1).chunk(3, dim=1)
        return a + b * c

    def make_args(t):
        g = torch.Generator().manual_seed(t)
        return torch.randn(2, t, 8, generator=g), torch.randn(4, 8, 16, generator=g)

    run_lengths(heads, make_args, rtol=1e-5, atol=1e-5)
    run_lengths(ngram, lambda t: make_args(t)[:1], rtol=1e-5, atol=1e-5)
    assert_bucketed()
    neuron_compile.reset()
    run_training_lengths(heads, make_args, weights=(1,))
    run_training_lengths(ngram, lambda t: make_args(t)[:1])
    assert_bucketed()


def test_inputs_of_merged_sizes_take_the_layout_their_graph_computes_in():
    # a true-size input is exact in any layout, so a merged size (2 t) at a graph boundary takes
    # the one its graph needs: a tangent its forward output's (blocks (2, t), not a prefix of
    # 2 t), a resumed frame's flattened tokens the blocks a view of [2, t] gives
    def flat_head(x, w):
        return (x.softmax(1).reshape(-1, 8) @ w).sin()  # [2 t, 8]: its tangent is a merged size

    run_training_lengths(flat_head, lambda t: (torch.randn(2, t, 8), torch.randn(8, 8)), weights=(1,))
    assert_bucketed()
    neuron_compile.reset()

    def resumed(x):
        y = x.sin().reshape(-1, 8)  # [2 t, 8]
        torch._dynamo.graph_break()  # the resumed frame takes x and y
        return (x.softmax(1).reshape(-1, 8) + y.cos()).sum(0)

    run_lengths(resumed, rows_static_3d, rtol=1e-5, atol=1e-5)
    assert_bucketed()


def rows_static_3d(t):
    x = torch.randn(2, t, 8)
    torch._dynamo.mark_static(x, 0)
    return (x,)


def test_a_size_a_static_multiple_of_another_is_bucketed_at_that_multiple():
    # y's length, 2 t, a symbol of its own: alone it would round up to 128 for t = 37 and to 256
    # for t = 100 (both in t's bucket 128), four executables over two buckets; at twice t's bucket
    # it is one per bucket
    def two(x, y):
        return x.softmax(1) * 2, y.softmax(0)

    def make_args(t):
        x, y = torch.randn(2, t, 8), torch.randn(2 * t, 8)
        torch._dynamo.mark_static(x, 0)
        return x, y

    run_lengths(two, make_args, rtol=1e-5, atol=1e-5)
    assert_bucketed()


def test_a_graph_whose_only_symbolic_size_is_an_int_input_is_bucketed(fresh_cache, caplog):
    # after a graph break the resumed frame takes the length as an int and builds from it (an
    # arange of positions, a causal mask): no input tensor has a symbolic size, yet its tensors
    # do; the int is bucketed (shapes at the bucket, values at the true length: pos * 2)
    def masks(x):
        t, y = x.shape[1], x.sin()
        torch._dynamo.graph_break()
        pos = torch.arange(t)
        return (pos[:, None] >= pos[None, :]).float().cumsum(-1), pos * 2 + t, y

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    run_lengths(masks, rows_static_3d)
    assert not exact_shape_reasons(caplog)
    assert_bucketed()


def test_random_draws_over_flattened_tokens_take_the_layout_they_meet():
    # phimoe's Gumbel sampling in training: -log of an exponential_ of an empty_like of the
    # flattened router scores [2 t, E]; AOT makes the empty of a fresh layout (a prefix of 2 t),
    # the scores are blocks (2, t). Unspecified values and i.i.d. draws have no layout of their
    # own (never eager's values), so they take the scores' (the chosen experts stay random; the
    # probabilities, gated by a test every choice passes, are eager's)
    def router(x, w):
        gates = (x @ w).reshape(-1, 4)
        noise = torch.empty_like(gates, memory_format=torch.legacy_contiguous_format).exponential_().log()
        chosen = (gates.detach() - noise).max(dim=-1)[1]
        return gates.softmax(-1) * (chosen >= 0).unsqueeze(-1)

    run_training_lengths(router, lambda t: (torch.randn(2, t, 8), torch.randn(8, 4)), weights=(1,))
    assert_bucketed()


def test_a_prefix_of_a_merged_size_is_not_viewed_as_rows_of_a_padded_size(caplog):
    # a dim laid out as a prefix of a t (a resumed frame's flattened input, an arange of a * t) is
    # not t-long rows at the bucket: viewed as [a, t] it would read row i at i * T, eager at i * t.
    # The chunk rule (a multiple of c viewed as chunks of c) holds only for a c with no padding;
    # here the view keeps exact shapes, and every result is eager's (before: two thirds wrong)
    def resumed(x):
        y = x.flatten() * 2
        torch._dynamo.graph_break()
        return y.view(x.shape[0], x.shape[1]).softmax(-1)

    def positions(x):
        return torch.arange(x.shape[0] * x.shape[1]).view(x.shape[0], x.shape[1]) * x

    caplog.set_level(logging.DEBUG, logger="neuron_compile")
    for fn in (resumed, positions):
        compiled = torch.compile(fn, backend="neuron", dynamic=True)
        for a, t in [(3, 37), (3, 64), (5, 100), (3, 129)]:
            x = torch.randn(a, t)
            torch.testing.assert_close(compiled(x), fn(x))
    assert any("splits a padded size" in r for r in exact_shape_reasons(caplog))


def test_flattened_tokens_viewed_back_after_a_graph_break_are_blocks_of_the_sizes_the_guards_give():
    # longcat_flash's MoE: the experts take the tokens flattened, [b t, h], and their output is
    # viewed back to the shape taken before (b, t, h), past a graph break. The resumed frame has a
    # symbol of its own for b t, and the view guards it as b rows of t (b t % b == 0, b t // b ==
    # t), Dynamo checking both at each call: the flattened input is laid out as blocks (b, t)
    def experts(x):
        shape = x.shape
        y = x.reshape(-1, shape[-1]).sin()
        torch._dynamo.graph_break()
        return y.view(*shape).softmax(1)

    run_lengths(experts, rows_static_3d, rtol=1e-5, atol=1e-5)
    assert_bucketed()


def windows_of_four(x, w):
    # deepseek_v4's compressor: the tokens cut to whole windows of 4 and viewed as [b, n, 4, d], a
    # window's half moved one window on, a softmax within windows
    kv = x @ w
    n = kv.shape[1] // 4
    chunk = kv[:, : n * 4].view(2, n, 4, -1)
    new = chunk.new_zeros(2, n, 8, 16)
    new[:, :, 4:] = chunk[..., 16:]
    new[:, 1:, :4] = chunk[:, :-1, :, :16]
    return new.softmax(2).sum(2)


def test_tokens_cut_to_whole_windows_are_viewed_as_windows_followed_by_their_own_dims():
    # the chunk of 4 * (t // 4) viewed as [t // 4, 4, 32] is the 4 after the count, not 4 * 32 (the
    # 32 is an atom of its own); where the guards make t a multiple of 4 (Dynamo's second graph)
    # the atom is t itself and 4 * (t // 4) is t in the form the guards give it
    run_lengths(windows_of_four, lambda t: (rows_static_3d(t)[0].repeat(1, 1, 4), torch.randn(32, 32)),
                rtol=1e-5, atol=1e-5)
    assert_bucketed()  # two graphs (t % 4 == 0 and not), each one executable per bucket
    neuron_compile.reset()
    run_training_lengths(windows_of_four, lambda t: (torch.randn(2, t, 32), torch.randn(32, 32)), weights=(1,))
    # training guards t % 4 too (a graph per remainder: 37 and 129, 250, the multiples of 4), each
    # graph one executable per bucket it meets
    assert COUNTERS["bucketing_fallbacks"] == 0
    per_graph = {}
    for graph, signature in bucket_signatures():
        per_graph.setdefault(graph, set()).add(signature)
    assert len(per_graph) >= 4 and all(len(s) <= 2 for s in per_graph.values()), per_graph
    assert COUNTERS["xla_compiles"] == len(bucket_signatures())


def test_a_graph_dynamo_specialized_every_size_of_runs_at_one_size():
    # kimi_linear at 64 tokens: its chunk padding of 0 guards t % 64 == 0 and its single chunk
    # t <= 64, so Dynamo's graph for 64 has no size symbol left (a Sym(64) input). That is a graph
    # for one size, as Dynamo compiles one per size it is called at, not a graph the padding
    # analysis refused (no fallback counted, explain does not blame an op)
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.bucketing.analysis import analyze

    gm = make_fx(lambda x: x.softmax(-1))(torch.randn(2, 64))
    result = analyze(gm, buckets=128)
    assert not result.ok and result.one_size, result.reason


def sparse_block_bias(x, c):
    # deepseek_v4's indexer: the top-k compressed entries per query, those past the causal
    # threshold marked -1, a -inf bias with 0 at the picks and a sentinel column for the marked
    b, t, n = x.shape[0], x.shape[1], c.shape[1]
    pos = torch.arange(t).unsqueeze(0).expand(b, -1)
    thr = (pos + 1) // 4
    scores = (x @ c.transpose(1, 2)).masked_fill(torch.arange(n).view(1, 1, -1) >= thr.unsqueeze(-1), float("-inf"))
    top = scores.topk(min(4, n), dim=-1).indices
    top = torch.where(top >= thr.unsqueeze(-1), torch.full_like(top, -1), top)
    safe = torch.where(top >= 0, top, torch.full_like(top, n))
    bias = x.new_full((b, 1, t, n + 1), float("-inf"))
    bias.scatter_(-1, safe.unsqueeze(1), 0.0)
    return bias[..., :n]


def test_a_scatter_by_picks_or_a_sentinel_at_the_true_size_stays_in_the_real_region():
    # the scatter's index along the padded n + 1 is where(i >= 0, i, full_like(i, n)) of
    # i = where(.., full_like(-1), topk indices): the picks lie in [0, n - 1] once i >= 0, the
    # sentinel is n read at its true value, so every real index is within [0, n]
    def make_args(t):
        x, c = torch.randn(2, t, 8), torch.randn(2, t // 4, 8)
        torch._dynamo.mark_static(x, 0)
        torch._dynamo.mark_static(c, 0)
        return x, c

    run_lengths(sparse_block_bias, make_args)
    assert_bucketed()


def test_a_masked_selection_reshaped_past_its_graph_break_is_blocks_of_the_reshape():
    # blt's patch starts: a boolean-mask selection (data-dependent, so Dynamo breaks the graph
    # there) of exactly t entries per row, reshaped to [b, t] in the resumed frame; the reshape
    # guards the selection's own symbol as b * t, laid out as blocks in the reshape's order
    def patch_starts(entropies):
        b, t = entropies.shape
        mask = entropies > 0
        idx = torch.arange(t).unsqueeze(0).expand(b, -1)
        starts = torch.cat([idx, torch.full_like(idx, t)], dim=1)[torch.cat([mask, ~mask], dim=1)].reshape(b, t)
        return starts * 2, mask.sum(1).max()

    run_lengths(patch_starts, rows_static(2))
    assert_bucketed()


# ----------------------------------------------------------------------------- prefix scans


@pytest.mark.parametrize("scan", ["cumsum", "cumprod"])
def test_a_prefix_scan_over_padded_blocks_sees_its_identity_in_their_tails(scan):
    """cumsum over ``[2, t]`` flattened: the second row's sums start after the first row's padded
    tail, which must add 0 (multiply by 1) as eager has no tail; this was a wrong number."""

    def scan_blocks(x):
        y = x.exp() if scan == "cumsum" else 1 + x / 64
        return getattr(torch, scan)(y.reshape(-1), 0).reshape(x.shape)

    run_lengths(scan_blocks, rows_static(2), rtol=1e-4, atol=1e-4)
    if scan == "cumsum":
        assert_bucketed()  # cumprod reaches the analysis decomposed (exact shapes, also eager's values)
