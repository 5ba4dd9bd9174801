"""A zoo of Hugging Face architectures through the ``neuron`` backend, against eager.

Each architecture is built from a tiny config with random weights (no download:
``AutoConfig.for_model(name, **tiny)`` + ``AutoModelFor*.from_config``) and run

    inference   logits of ``torch.compile(model, backend="neuron")`` vs eager
    training    one step, loss + logits + every parameter's gradient vs eager
                (dropout probabilities set to 0, model in train mode)

with fallback off (``fallback="error"``, the default) and, for every
architecture where that fails, with ``fallback="eager"``. Each (architecture,
fallback) runs in its own process (a segfault is a ``crash``, not the end of
the run). Results: ``benchmarks/results/hf_zoo.{md,json}``.

    nice -n 10 python benchmarks/hf_zoo.py                 # the whole zoo
    python benchmarks/hf_zoo.py --arch llama,gpt2 --out /tmp/zoo
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The most used text-generation architectures on the Hub, then bert (masked LM) and t5 (seq2seq).
CAUSAL = ["gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3",
          "gemma", "gemma2", "gemma3_text", "falcon", "gpt_neox", "opt", "bloom", "starcoder2", "olmo", "olmo2",
          "granite", "granitemoe", "cohere", "cohere2", "stablelm", "gptj", "gpt_bigcode", "codegen", "gpt_neo",
          "mpt", "persimmon", "glm", "glm4", "deepseek_v3", "helium", "smollm3", "exaone4", "nemotron", "olmoe",
          "gpt_oss", "ministral", "xglm"]
OTHER = {"bert": "masked-lm", "t5": "seq2seq"}
ARCHS = CAUSAL + list(OTHER)

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, SEQ, BATCH = 128, 64, 2, 4, 2, 128, 16, 2
TINY = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=64, head_dim=HIDDEN // HEADS,
            tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Names some configs use instead of (or beside) the common ones above.
OVERRIDES = {
    "gpt2": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64, n_inner=FFN),
    "gpt_bigcode": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64, n_inner=FFN),
    "gptj": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64, n_inner=FFN, rotary_dim=8),
    "codegen": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64, n_ctx=64, n_inner=FFN, rotary_dim=8),
    "bloom": dict(n_embed=HIDDEN, n_layer=LAYERS, n_head=HEADS),
    "opt": dict(ffn_dim=FFN, word_embed_proj_dim=HIDDEN),
    "mpt": dict(d_model=HIDDEN, n_layers=LAYERS, n_heads=HEADS, max_seq_len=64, expansion_ratio=2),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], num_layers=LAYERS, window_size=8),
    "xglm": dict(d_model=HIDDEN, ffn_dim=FFN, num_layers=LAYERS, attention_heads=HEADS),
    "falcon": dict(head_dim=None, num_kv_heads=KV_HEADS, new_decoder_architecture=True, ffn_hidden_size=FFN),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "deepseek_v3": dict(head_dim=None, num_key_value_heads=HEADS, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=16, n_shared_experts=1),
    "gemma2": dict(sliding_window=8),
    "gemma3_text": dict(sliding_window=8),
    "cohere2": dict(sliding_window=8),
    "persimmon": dict(partial_rotary_factor=0.5),
    "phi": dict(partial_rotary_factor=0.5),
    "stablelm": dict(partial_rotary_factor=0.25),
    "nemotron": dict(partial_rotary_factor=0.5),
    "glm": dict(partial_rotary_factor=0.5),
    "glm4": dict(partial_rotary_factor=0.5),
    "t5": dict(d_model=HIDDEN, d_kv=16, d_ff=FFN, num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS,
               decoder_start_token_id=0),
    "bert": dict(type_vocab_size=2),
}


def tiny_config(arch: str):
    from transformers import AutoConfig

    kwargs = {k: v for k, v in dict(TINY, **OVERRIDES.get(arch, {})).items() if v is not None}  # None: not set
    cfg = AutoConfig.for_model(arch, **kwargs)
    for name in list(vars(cfg)):
        value = getattr(cfg, name)
        if ("dropout" in name or "pdrop" in name) and isinstance(value, float):
            setattr(cfg, name, 0.0)
    cfg.use_cache = False
    return cfg


def build(arch: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    cfg = tiny_config(arch)
    kind = OTHER.get(arch, "causal-lm")
    cls = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM,
           "seq2seq": AutoModelForSeq2SeqLM}[kind]
    model = cls.from_config(cfg).float()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    kwargs = {"input_ids": ids, "labels": ids.clone()}
    if kind == "seq2seq":
        kwargs["decoder_input_ids"] = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    return model, kwargs


def _classify(exc: BaseException) -> tuple[str, str]:
    from neuron_compile.lowering import LoweringError, exception_chain, innermost_exception
    from runtime.executor import XlaCompileError

    for e in exception_chain(exc):
        if isinstance(e, LoweringError):
            return "does-not-lower", f"{e.op or '?'} at {e.source or '?'}"
        if isinstance(e, XlaCompileError):
            return "xla-rejects", str(e).strip().splitlines()[0][:200]
    inner = innermost_exception(exc)
    lines = [ln for ln in str(inner).strip().splitlines() if ln.strip()]
    return "crash", f"{type(inner).__name__}: {(lines[0] if lines else '')[:200]}"


def worker(arch: str, fallback: str) -> dict:
    import torch
    import torch._dynamo

    import neuron_compile

    torch._dynamo.config.recompile_limit = 64
    options = {"fallback": fallback}
    result = {"arch": arch, "fallback": fallback}
    try:
        model, kwargs = build(arch)
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        result.update(inference="build-error", training="build-error", error=f"{type(exc).__name__}: {exc}"[:300])
        return result
    result["params"] = sum(p.numel() for p in model.parameters())

    # inference: logits
    model.eval()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            ref = model(**kwargs).logits
            torch._dynamo.reset()
            got = torch.compile(model, backend="neuron", options=options)(**kwargs).logits
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        result["inference"] = "pass"
    except AssertionError as exc:
        result["inference"], result["inference_error"] = "mismatch", " ".join(str(exc).split())[:300]
    except Exception as exc:  # noqa: BLE001
        result["inference"], result["inference_error"] = _classify(exc)
    result["inference_seconds"] = round(time.perf_counter() - start, 1)

    # training: one step's loss, logits and gradients
    model.train()
    start = time.perf_counter()
    try:
        model.zero_grad(set_to_none=True)
        out = model(**kwargs)
        out.loss.backward()
        ref_loss, ref_logits = out.loss.detach(), out.logits.detach()
        ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        out = torch.compile(model, backend="neuron", options=options)(**kwargs)
        out.loss.backward()
        torch.testing.assert_close(out.loss.detach(), ref_loss, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.logits.detach(), ref_logits, rtol=1e-4, atol=1e-4)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == ref_grads.keys(), f"gradients for {sorted(set(ref_grads) ^ set(grads))[:5]} differ"
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
        result["training"] = "pass"
    except AssertionError as exc:
        result["training"], result["training_error"] = "mismatch", " ".join(str(exc).split())[:300]
    except Exception as exc:  # noqa: BLE001
        result["training"], result["training_error"] = _classify(exc)
    result["training_seconds"] = round(time.perf_counter() - start, 1)
    reports = neuron_compile.compile_reports()
    result["graphs"] = len(reports)
    fell = {}
    for r in reports:
        for op, n in r.fallback.items():
            fell[op] = fell.get(op, 0) + n
    result["fallback_ops"] = fell
    return result


def run_one(arch: str, fallback: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("NEURON_COMPILE_CACHE", "0")
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--worker", arch, "--fallback", fallback]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(HERE.parent))
    except subprocess.TimeoutExpired:
        return {"arch": arch, "fallback": fallback, "inference": "crash", "training": "crash",
                "error": f"timeout after {timeout:.0f}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            result["seconds"] = round(time.perf_counter() - start, 1)
            return result
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    return {"arch": arch, "fallback": fallback, "inference": "crash", "training": "crash",
            "error": f"worker exit {proc.returncode}: {tail[:200]}"}


def write_table(results: dict, out: Path, note: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_zoo.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    n = len(results)

    def count(fallback, key):
        return sum(1 for a in results if (results[a].get(fallback) or results[a]["error"])[key] == "pass")

    lines = ["# Hugging Face architecture zoo through the `neuron` backend", "",
             f"Generated by `benchmarks/hf_zoo.py`. Tiny configs with random weights ({LAYERS} layers, hidden "
             f"{HIDDEN}, {HEADS} heads, {KV_HEADS} KV heads, vocab {VOCAB}), batch {BATCH}x{SEQ}. Inference: logits "
             "against eager (rtol=atol=1e-4). Training: one step's loss, logits and every gradient against eager "
             "(gradients rtol=1e-3, atol=1e-4). `fallback=eager` is run where fallback off fails; where "
             "fallback off passes, fallback on is the same run (nothing fails to lower, so nothing is "
             "partitioned): `(same)`." + (f" {note}" if note else ""), "",
             f"**Fallback off:** inference {count('error', 'inference')}/{n}, training {count('error', 'training')}/{n}. "
             f"**Fallback on:** inference {count('eager', 'inference')}/{n}, training {count('eager', 'training')}/{n}.",
             "", "| architecture | inference | training | fallback on: inference | training | ops run eagerly | "
             "seconds | first error (fallback off) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arch, r in results.items():
        e = r["error"]
        f = r.get("eager") or {}
        same = not f
        err = e.get("error") or e.get("inference_error") or e.get("training_error") or ""
        ops = ", ".join(f"{k} x{v}" for k, v in (f.get("fallback_ops") or {}).items())
        lines.append(f"| {arch} | {e['inference']} | {e['training']} | "
                     f"{'(same)' if same else f['inference']} | {'(same)' if same else f['training']} | {ops} | "
                     f"{e.get('seconds', '')} | {err[:160].replace('|', '/')} |")
    (out / "hf_zoo.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="", help="comma-separated architectures (default: the whole zoo)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in OUT/hf_zoo.json (with --arch: rerun just those)")
    p.add_argument("--note", default="", help="a sentence for the table's header (how the run was made)")
    p.add_argument("--table", action="store_true", help="only rebuild OUT/hf_zoo.md from OUT/hf_zoo.json")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--fallback", default="error", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        import warnings

        warnings.filterwarnings("ignore")
        print(json.dumps(worker(args.worker, args.fallback)), flush=True)
        return 0
    out = Path(args.out)
    if args.table:
        results = json.loads((out / "hf_zoo.json").read_text())
        write_table({a: results[a] for a in ARCHS if a in results} | results, out, args.note)
        return 0
    results = {}
    if args.resume and (out / "hf_zoo.json").exists():
        results = json.loads((out / "hf_zoo.json").read_text())
    archs = args.arch.split(",") if args.arch else ARCHS
    started = time.time()
    for arch in archs:
        if arch in results and args.resume and not args.arch:
            continue
        entry = {"error": run_one(arch, "error", args.timeout)}
        if entry["error"]["inference"] != "pass" or entry["error"]["training"] != "pass":
            entry["eager"] = run_one(arch, "eager", args.timeout)
        results[arch] = entry
        e, f = entry["error"], entry.get("eager") or {}
        print(f"[{time.time() - started:.0f}s] {arch}: inference {e['inference']}, training {e['training']}"
              + (f"; fallback on: {f['inference']}, {f['training']}" if f else "")
              + "".join(f"\n    {k}: {e[k]}" for k in ("error", "inference_error", "training_error") if e.get(k)),
              flush=True)
        write_table({a: results[a] for a in ARCHS if a in results} | results, out, args.note)
    print(f"zoo: {len(archs)} architectures in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
