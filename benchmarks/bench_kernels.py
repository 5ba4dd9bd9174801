"""Benchmark of the shipped kernel, ``neuron::attention``, against the default lowering (issue 23).

Region: the attention of the built-in GPT-2-style model (``neuron_compile.cli.models.TinyGPT``,
``CausalSelfAttention`` between its two projections, the region our fuse pass outlines as
``neuron.attention``: the packed q/k/v split into heads, scores ``q @ k^T / sqrt(d)``,
``masked_fill`` with the causal mask buffer, softmax, ``@ v``, heads merged), 4 heads of 64, at 128
and 512 tokens, compiled by the neuron backend as the model writes it (Torch-MLIR's lowering) and
with the core one call of ``torch.ops.neuron.attention`` (the JAX kernel), given the mask buffer or
``is_causal=True`` (what the buffer is). Another row lowers ``F.scaled_dot_product_attention(
is_causal=True)``, which transformers models call, by the default path (our SDPA math rewrite).
"core" rows time the same on contiguous q, k, v. Whole model: ``TinyGPT`` (4 layers, 256 wide,
vocab 256), inference and a training step (forward + backward), its attention as written and with
the core the kernel call (``is_causal=True``), at 4x128 tokens (inference and training) and 1x512
(inference).

Every variant is compiled first, then timed round-robin (each round: every variant back to back,
best of ``--calls``), so the shared machine's noise hits all alike; the ratio is the median of the
per-round paired ratios. Results are checked against eager with ``torch.testing.assert_close``.

    python benchmarks/bench_kernels.py [--rounds 15] [--calls 5] [--out benchmarks/results/kernels]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_compile.cli.bench import machine_line  # noqa: E402
from neuron_compile.cli.models import CausalSelfAttention, GPTConfig, TinyGPT  # noqa: E402
from neuron_compile.kernels.attention import attention  # noqa: E402

H, D = 4, 64
LENGTHS = ((4, 128), (4, 512))  # (batch, tokens) of the region and core rows
WHOLE = ((4, 128, True), (1, 512, False))  # (batch, tokens, with a training step) of the whole model


def heads(qkv):
    b, t, c3 = qkv.shape
    return (z.view(b, t, H, D).transpose(1, 2) for z in qkv.split(c3 // 3, dim=2))


def merge(y):
    b, _, t, _ = y.shape
    return y.transpose(1, 2).reshape(b, t, H * D)


def model_core(q, k, v, mask):
    """TinyGPT's attention core, as the model writes it."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def kernel_core(q, k, v, mask):
    return attention(q, k, v, mask, None, False)


def causal_kernel_core(q, k, v, mask):  # the mask buffer is causal by construction: say so instead
    return attention(q, k, v, None, None, True)


def sdpa_core(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def region(core):
    """TinyGPT's attention between its two projections (the fuse pass's neuron.attention region): the
    packed q/k/v projection split into heads, the core, the heads merged."""
    def fn(qkv, mask):
        return merge(core(*heads(qkv), mask))

    return fn


class KernelSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with its core (scores, causal mask, softmax, @ v) one call of the kernel."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = attention(q, k, v, None, None, True)  # the model's mask buffer is the causal mask
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def models(tokens: int):
    cfg = GPTConfig(vocab_size=256, n_positions=tokens, n_embd=H * D, n_head=H, n_layer=4)
    torch.manual_seed(0)
    default = TinyGPT(cfg)
    kernel = TinyGPT(cfg)
    kernel.load_state_dict(default.state_dict())
    for block in kernel.blocks:
        block.attn.__class__ = KernelSelfAttention
    return default, kernel


def timed(fn, calls: int) -> float:
    best = math.inf
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(args) -> dict:
    torch.manual_seed(0)
    cases = {}  # name -> (group, callable)
    baseline = {}  # group -> its default variant
    cores = (("as the model writes it, default lowering", model_core),
             ("neuron::attention kernel, the mask", kernel_core),
             ("neuron::attention kernel, is_causal=True", causal_kernel_core),
             ("F.scaled_dot_product_attention(is_causal=True), default lowering", sdpa_core))
    with torch.no_grad():
        for b, t in LENGTHS:
            qkv = torch.randn(b, t, 3 * H * D)
            q, k, v = (torch.randn(b, H, t, D) for _ in range(3))
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t)
            for what, inputs, wrap in (("region", (qkv, mask), region), ("core", (q, k, v, mask), lambda f: f)):
                group = f"{what} {b}x{t}"
                expected = wrap(model_core)(*inputs)
                for name, core in cores:
                    compiled = torch.compile(wrap(core), backend="neuron")
                    torch.testing.assert_close(compiled(*inputs), expected)
                    cases[f"{group}: {name}"] = (group, lambda c=compiled, a=inputs: c(*a))
                baseline[group] = f"{group}: {cores[0][0]}"
    for b, t, train in WHOLE:
        # static graphs per size (dynamic=False): TinyGPT instances of two sizes share forward's code
        # object, and Dynamo's automatic dynamic shapes would make the second size's graph symbolic, its
        # batch of 4 then padded to a bucket of 128 (a 32x larger executable: the earlier run's 2.7 s calls)
        ids = torch.randint(0, 256, (b, t))
        default, kernel = models(t)
        for what in ("inference", "training step")[:2 if train else 1]:
            group = f"TinyGPT {what} {b}x{t}"
            baseline[group] = f"{group}: default"
            if what == "inference":
                with torch.no_grad():
                    expected = default(ids)
                    for name, model in (("default", default), ("kernel", kernel)):
                        compiled = torch.compile(model, backend="neuron", dynamic=False)
                        torch.testing.assert_close(compiled(ids), expected, rtol=1e-4, atol=1e-4)
                        cases[f"{group}: {name}"] = (group, lambda c=compiled, i=ids: c(i))
                continue
            default.zero_grad()
            eager_loss = default(ids, labels=ids)
            eager_loss.backward()
            eager_grad = default.blocks[0].attn.qkv.weight.grad.clone()
            for name, model in (("default", default), ("kernel", kernel)):
                compiled = torch.compile(model, backend="neuron", dynamic=False)
                model.zero_grad()
                loss = compiled(ids, labels=ids)
                loss.backward()
                torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(model.blocks[0].attn.qkv.weight.grad, eager_grad, rtol=1e-4, atol=1e-5)

                def step(c=compiled, m=model, i=ids):
                    m.zero_grad(set_to_none=True)
                    c(i, labels=i).backward()

                cases[f"{group}: {name}"] = (group, step)

    for _, fn in cases.values():  # warm
        timed(fn, 2)
    times = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (_, fn) in cases.items():
            times[name].append(timed(fn, args.calls))

    rows = []
    for name, (group, _) in cases.items():
        base = times[baseline[group]]
        rows.append({"group": group, "variant": name.split(": ", 1)[1], "ms_median": statistics.median(times[name]) * 1e3,
                     "ms_min": min(times[name]) * 1e3,
                     "speedup_vs_default": statistics.median(b / t for b, t in zip(base, times[name]))})
    return {"machine": machine_line(), "rounds": args.rounds, "calls": args.calls,
            "shapes": (f"region: the packed q/k/v projection [batch, tokens, {3 * H * D}] and the causal mask "
                       f"buffer [1, 1, tokens, tokens] to the merged heads [batch, tokens, {H * D}]; core: q, k, v "
                       f"[batch, {H}, tokens, {D}] float32; whole model: TinyGPT 4 layers, {H * D} wide, vocab 256"),
            "rows": rows, "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(result: dict) -> str:
    lines = ["# neuron::attention against the default lowering (issue 23)", "",
             f"Machine: {result['machine']}.", "",
             f"Shapes: {result['shapes']}. {result['rounds']} rounds, each variant best of {result['calls']} calls "
             "per round, round-robin; speedup = median of the per-round paired ratios (default time / variant "
             f"time). Run of {result['created']}; every variant checked against eager (`assert_close`).", "",
             "| measured on (batch x tokens) | variant | ms (median of rounds) | ms (min) | speedup vs default |",
             "| --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['group']} | {r['variant']} | {r['ms_median']:.2f} | {r['ms_min']:.2f} | "
                     f"{r['speedup_vs_default']:.2f}x |")
    lines += ["", "Rerun: `python benchmarks/bench_kernels.py --rounds 15 --calls 5`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args()
    result = run(args)
    text = markdown(result)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
