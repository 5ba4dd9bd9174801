"""A zoo of Hugging Face architectures through the ``neuron`` backend, against eager.

Every architecture the installed transformers maps to a causal-LM class
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, 196 in 5.24; bert runs as a masked LM), plus t5, is
built from a tiny config with random weights (no download; the config comes from
``zoo_configs.tiny_config``, which shrinks the architecture's own default) and run

    inference   logits of ``torch.compile(model, backend="neuron")`` vs eager
    training    one step, loss + logits + every parameter's gradient vs eager
                (dropout probabilities set to 0, model in train mode)

with fallback off (``fallback="error"``, the default) and, for every
architecture where that fails, with ``fallback="eager"``. ``--jobs`` worker
processes run architecture after architecture (imports paid once per worker);
a segfault is a ``crash`` and a hang a ``timeout``, not the end of the run, and
the worker is replaced. Every result other than a pass is checked again in a
fresh process, so an architecture before it in the same worker never decides
it. A model that fails eagerly is ``does-not-build``, with the reason, and is
not compiled.
Results: ``benchmarks/results/hf_zoo.{md,json}``.

``--device neuron``: the same architectures on the ``neuron`` device instead (``device_worker``):
saved with ``save_pretrained``, loaded on CPU and with ``from_pretrained(path, device_map="neuron")``,
then logits, greedy ``generate`` with a static cache (compiled by transformers itself) and one eager
training step, each against the CPU copy. Same workers, crash/timeout handling and ``--resume``;
no fallback-on rerun. Results: ``benchmarks/results/hf_zoo_device.{md,json}``.

    nice -n 10 python benchmarks/hf_zoo.py                 # every architecture
    python benchmarks/hf_zoo.py --quick                    # the 44 most used
    python benchmarks/hf_zoo.py --arch llama,gpt2 --out /tmp/zoo
    nice -n 5 python benchmarks/hf_zoo.py --device neuron --quick --jobs 1 --timeout 600
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import zoo_configs  # noqa: E402  (benchmarks/ is on sys.path when this runs as a script)
from zoo_configs import BATCH, HEADS, HIDDEN, KV_HEADS, LAYERS, SEQ, VOCAB  # noqa: E402

# The quick subset (`--quick`): the most used text-generation architectures on the Hub, then bert
# (masked LM) and t5 (seq2seq).
CAUSAL = ["gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3",
          "gemma", "gemma2", "gemma3_text", "falcon", "gpt_neox", "opt", "bloom", "starcoder2", "olmo", "olmo2",
          "granite", "granitemoe", "cohere", "cohere2", "stablelm", "gptj", "gpt_bigcode", "codegen", "gpt_neo",
          "mpt", "persimmon", "glm", "glm4", "deepseek_v3", "helium", "smollm3", "exaone4", "nemotron", "olmoe",
          "gpt_oss", "ministral", "xglm"]
OTHER = {"bert": "masked-lm", "t5": "seq2seq"}
QUICK = CAUSAL + list(OTHER)


def all_archs() -> list[str]:
    """Every name the installed transformers maps to a causal-LM class, then t5 (bert is one of
    them, and runs as the quick subset's masked LM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) + [a for a in OTHER if a not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]


def _reinit_zero_weights(model) -> list[str]:
    """Give every all-zero weight matrix random values; returns their names.

    Some models zero-initialize their MoE router (afmoe's ``gate``): every token then
    scores every expert the same, and which experts ``topk`` picks among equal scores
    is an implementation detail (CPU eager picks from the end, XLA from the start).
    Trained checkpoints never have such ties; the zoo compares routing, not tie order.
    """
    import torch

    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and p.is_floating_point() and p.numel() > 1 and not p.any():
                torch.nn.init.normal_(p, std=0.02)
                names.append(name)
    return names


def _config_for_class(cfg):
    """The config the causal-LM class takes: musicgen maps to MusicgenForCausalLM, which takes
    the composite config's decoder part."""
    from transformers import AutoModelForCausalLM

    want = getattr(AutoModelForCausalLM._model_mapping[type(cfg)], "config_class", type(cfg))
    if isinstance(cfg, want):
        return cfg
    for value in vars(cfg).values():
        if isinstance(value, want):
            return value
    return cfg


def build(arch: str, positions: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    cfg = zoo_configs.tiny_config(arch, positions)
    kind = OTHER.get(arch, "causal-lm")
    cls = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM,
           "seq2seq": AutoModelForSeq2SeqLM}[kind]
    part = _config_for_class(cfg) if kind == "causal-lm" else cfg
    if part is cfg:
        model = cls.from_config(cfg).float()
    else:  # the class, given the part of the config it takes
        model = AutoModelForCausalLM._model_mapping[type(cfg)]._from_config(part).float()
    model.reinitialized = _reinit_zero_weights(model)
    if hasattr(model, "set_default_language"):  # xmod: adapters per language
        model.set_default_language(next(iter(cfg.languages)))
    gen = torch.Generator().manual_seed(1)
    rows = BATCH * getattr(part, "num_codebooks", 1)  # musicgen: a row of tokens per codebook
    ids = torch.randint(3, VOCAB, (rows, SEQ), generator=gen)
    kwargs = {"input_ids": ids, "labels": ids.clone()}
    if rows > BATCH:  # labels: batch x sequence x codebook
        kwargs["labels"] = ids.view(BATCH, -1, SEQ).permute(0, 2, 1).clone()
    if kind == "seq2seq":
        kwargs["decoder_input_ids"] = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    return model, kwargs


def _classify(exc: BaseException) -> tuple[str, str]:
    from neuron_compile.lowering import LoweringError, exception_chain, innermost_exception
    from neuron_compile.runtime.executor import XlaCompileError

    for e in exception_chain(exc):
        if isinstance(e, LoweringError):
            return "does-not-lower", f"{e.op or '?'} at {e.source or '?'}"
        if isinstance(e, XlaCompileError):
            return "xla-rejects", str(e).strip().splitlines()[0][:200]
    inner = innermost_exception(exc)
    lines = [ln for ln in str(inner).strip().splitlines() if ln.strip()]
    return "crash", f"{type(inner).__name__}: {(lines[0] if lines else '')[:200]}"


def _eager_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' '.join(lines[:2])[:240]}"  # a validation error's cause is its second line


def _float64_verdict(result: dict, mode: str, got: dict, eager: dict, ref64: dict) -> None:
    """A mismatch against eager float32 is float noise when every compiled tensor is as close to
    the float64 run as eager's own float32 result is (within 4x, plus 1e-6 and 1e-5 of the tensor's
    largest magnitude, about 100 float32 ulps: XLA sums and fuses in another order, and a scalar
    loss where eager's order happened to land close, cpmant's 2e-5 on a loss of 4.9 against eager's
    3e-6, is no bug; a bug is orders of magnitude off, as afmoe's tie was): then it passes, and
    the table says so. Otherwise it stays a mismatch, with the worst tensor named."""
    worst = None
    for name, r in ref64.items():
        if name not in got or name not in eager:
            continue
        e_comp = (got[name].double() - r).abs().max().item()
        e_eager = (eager[name].double() - r).abs().max().item()
        if e_comp > 4 * e_eager + 1e-6 + 1e-5 * r.abs().max().item() and (worst is None or e_comp / (e_eager + 1e-12) > worst[1]):
            worst = (name, e_comp / (e_eager + 1e-12), e_comp, e_eager)
    if worst is None:
        result[mode] = "pass"
        result[f"{mode}_float64"] = ("float noise: against float64, compiled is within 4x of eager float32 on "
                                     f"every tensor ({len(ref64)} checked)")
    else:
        result[f"{mode}_float64"] = (f"{worst[0]}: {worst[2]:.2e} from float64, eager float32 {worst[3]:.2e}")


def _to(kwargs: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in kwargs.items()}


def _load(model, path, device=None):
    """``from_pretrained`` of the saved tiny model (its own class: musicgen's decoder, bert's masked LM)."""
    import torch

    extra = {"device_map": device} if device else {}
    loaded = type(model).from_pretrained(path, dtype=torch.float32, **extra)
    if hasattr(loaded, "set_default_language"):  # xmod
        loaded.set_default_language(next(iter(loaded.config.languages)))
    return loaded


GENERATE = dict(max_new_tokens=4, do_sample=False, use_cache=True, return_dict_in_generate=True, output_logits=True)


def _generate_verdict(got, want) -> tuple[str, str]:
    """Greedy tokens against CPU's. Where they part, CPU's own logits at that step decide: if the
    device's token scores within 1e-4 of CPU's pick on CPU (a near-tie among random weights), float
    noise chose it and the rest of the sequence cannot be compared; otherwise it is a mismatch."""
    import torch

    a, b = got.sequences.cpu(), want.sequences
    if a.shape == b.shape and torch.equal(a, b):
        return "pass", ""
    start = b.shape[1] - len(want.logits)  # the prompt
    for step in range(min(a.shape[1], b.shape[1]) - start):
        rows = (a[:, start + step] != b[:, start + step]).nonzero().flatten().tolist()
        if rows:
            r = rows[0]
            logits = want.logits[step][r].float()
            gap = (logits[b[r, start + step]] - logits[a[r, start + step]]).abs().item()
            if gap <= 1e-4 * max(1.0, logits.abs().max().item()):
                return "pass", (f"tie: token {step} of row {r} differs where CPU's two candidates score "
                                f"{gap:.1e} apart (earlier tokens equal)")
            return "mismatch", (f"token {step} of row {r}: device {a[r, start + step].item()}, CPU "
                                f"{b[r, start + step].item()} (CPU logits {gap:.2e} apart)")
    return "mismatch", f"lengths differ: device {tuple(a.shape)}, CPU {tuple(b.shape)}"


def _train_step(model, kwargs, seed: int | None = 0, forward=None):
    """One training step's (loss, logits, {name: grad}), detached; ``forward`` calls the model (a compiled
    one), ``seed`` seeds the step's random draws (None: not reseeded)."""
    import torch

    model.zero_grad(set_to_none=True)
    if seed is not None:
        torch.manual_seed(seed)
    out = (model if forward is None else forward)(**kwargs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.logits.detach(), grads


def _assert_step_matches(loss, logits, grads, ref_loss, ref_logits, ref_grads) -> None:
    import torch

    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert grads.keys() == ref_grads.keys(), f"gradients for {sorted(set(ref_grads) ^ set(grads))[:5]} differ"
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def device_worker(arch: str) -> dict:
    """One architecture on the ``neuron`` device: the tiny model saved, then loaded twice with
    ``from_pretrained`` (on CPU, and with ``device_map="neuron"``); logits, greedy ``generate`` with a
    static cache (transformers compiles the forward by itself on neuron) and one eager training step,
    each against the CPU copy. A model that fails on CPU is ``does-not-build`` (with why)."""
    import copy
    import tempfile

    import torch
    import torch._dynamo

    import neuron_compile

    torch._dynamo.config.recompile_limit = 64
    result = {"arch": arch, "device": "neuron"}
    modes = ("inference", "generate", "training")

    def unbuilt(modes_left, why):
        result.update({m: "does-not-build" for m in modes_left}, error=why)
        return result

    try:
        model, kwargs = build(arch)
        with tempfile.TemporaryDirectory() as path:
            model.save_pretrained(path)
            cpu = _load(model, path)
            cpu.eval()
            with torch.no_grad():
                ref = cpu(**kwargs).logits
            try:
                dev = _load(model, path, "neuron")
            except Exception as exc:  # noqa: BLE001 - loads on CPU, not on neuron
                result.update({m: "crash" for m in modes})
                result["error"] = "from_pretrained(device_map='neuron'): " + _classify(exc)[1]
                return result
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        return unbuilt(modes, _eager_error(exc))
    result["params"] = sum(p.numel() for p in cpu.parameters())
    if model.reinitialized:
        result["reinitialized"] = model.reinitialized
    del model
    assert next(dev.parameters()).device.type == "neuron"
    on_dev = _to(kwargs, "neuron")

    # inference: logits
    dev.eval()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            got = dev(**on_dev).logits.cpu()
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        result["inference"] = "pass"
    except AssertionError as exc:
        result["inference"], result["inference_error"] = "mismatch", " ".join(str(exc).split())[:300]
        try:
            with torch.no_grad():
                ref64 = {"logits": copy.deepcopy(cpu).double()(**kwargs).logits}
            _float64_verdict(result, "inference", {"logits": got}, {"logits": ref}, ref64)
        except Exception as e:  # noqa: BLE001
            result["inference_float64"] = f"no float64 run: {type(e).__name__}"
    except Exception as exc:  # noqa: BLE001
        result["inference"], result["inference_error"] = _classify(exc)
    result["inference_seconds"] = round(time.perf_counter() - start, 1)

    # generate: greedy, a static cache (compiled by transformers itself on neuron), against CPU's tokens
    start = time.perf_counter()
    if OTHER.get(arch) == "masked-lm":
        result["generate"], result["generate_error"] = "n/a", "a masked LM does not generate"
    else:
        ids = kwargs["input_ids"]
        gen = dict(GENERATE, cache_implementation="static")
        try:
            torch.manual_seed(0)
            want = cpu.generate(ids, **gen)
        except Exception as exc:  # noqa: BLE001 - no static cache for this model on CPU: the default cache
            result["generate_static"] = "CPU refuses a static cache: " + _eager_error(exc)
            gen = dict(GENERATE)
            try:
                torch.manual_seed(0)
                want = cpu.generate(ids, **gen)
            except Exception as exc2:  # noqa: BLE001
                result["generate"], result["generate_error"] = "does-not-build", _eager_error(exc2)
                want = None
        if want is not None:
            reports = len(neuron_compile.compile_reports())
            try:
                torch._dynamo.reset()
                torch.manual_seed(0)
                got_gen = dev.generate(ids.to("neuron"), **gen)
                result["generate"], why = _generate_verdict(got_gen, want)
                if why:
                    result["generate_error" if result["generate"] != "pass" else "generate_note"] = why
            except Exception as exc:  # noqa: BLE001
                result["generate"], result["generate_error"] = _classify(exc)
            result["generate_compiled"] = sum(r.kind == "inference" for r in neuron_compile.compile_reports()[reports:])
    result["generate_seconds"] = round(time.perf_counter() - start, 1)

    # training: one eager step on the device, loss + logits + every gradient against CPU's
    cpu.train()
    dev.train()
    start = time.perf_counter()
    try:
        ref_loss, ref_logits, ref_grads = _train_step(cpu, kwargs)
    except Exception as exc:  # noqa: BLE001
        result["training"], result["training_error"] = "does-not-build", _eager_error(exc)
        return result
    try:
        loss, logits, grads = _train_step(dev, on_dev)  # seeded: random ops on neuron draw CPU's numbers
        loss, logits, grads = loss.cpu(), logits.cpu(), {n: g.cpu() for n, g in grads.items()}
        _assert_step_matches(loss, logits, grads, ref_loss, ref_logits, ref_grads)
        result["training"] = "pass"
    except AssertionError as exc:
        result["training"], result["training_error"] = "mismatch", " ".join(str(exc).split())[:300]
        try:
            loss64, logits64, ref64 = _train_step(copy.deepcopy(cpu).double(), kwargs)
            ref64.update(loss=loss64, logits=logits64)
            got_all = dict(grads, loss=loss, logits=logits)
            _float64_verdict(result, "training", got_all, dict(ref_grads, loss=ref_loss, logits=ref_logits), ref64)
        except Exception as e:  # noqa: BLE001
            result["training_float64"] = f"no float64 run: {type(e).__name__}"
    except Exception as exc:  # noqa: BLE001
        result["training"], result["training_error"] = _classify(exc)
    result["training_seconds"] = round(time.perf_counter() - start, 1)
    return result


def worker(arch: str, fallback: str) -> dict:
    """One architecture: eager reference first (a failure there is ``does-not-build``), then compiled."""
    import copy

    import torch
    import torch._dynamo

    import neuron_compile

    torch._dynamo.config.recompile_limit = 64
    options = {"fallback": fallback}
    result = {"arch": arch, "fallback": fallback}
    try:
        model, kwargs = build(arch)
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        result.update(inference="does-not-build", training="does-not-build", error=_eager_error(exc))
        return result
    result["params"] = sum(p.numel() for p in model.parameters())
    if model.reinitialized:
        result["reinitialized"] = model.reinitialized

    # inference: logits
    model.eval()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            ref = model(**kwargs).logits
    except Exception as exc:  # noqa: BLE001
        result.update(inference="does-not-build", training="does-not-build", error=_eager_error(exc))
        return result
    try:
        with torch.no_grad():
            torch._dynamo.reset()
            got = torch.compile(model, backend="neuron", options=options)(**kwargs).logits
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        result["inference"] = "pass"
    except AssertionError as exc:
        result["inference"], result["inference_error"] = "mismatch", " ".join(str(exc).split())[:300]
        try:
            with torch.no_grad():
                ref64 = {"logits": copy.deepcopy(model).double()(**kwargs).logits}
            _float64_verdict(result, "inference", {"logits": got}, {"logits": ref}, ref64)
        except Exception as e:  # noqa: BLE001 - the model does not run in float64: stays a mismatch
            result["inference_float64"] = f"no float64 run: {type(e).__name__}"
    except Exception as exc:  # noqa: BLE001
        result["inference"], result["inference_error"] = _classify(exc)
    result["inference_seconds"] = round(time.perf_counter() - start, 1)

    # training: one step's loss, logits and gradients
    model.train()
    start = time.perf_counter()
    try:
        ref_loss, ref_logits, ref_grads = _train_step(model, kwargs)
        torch.manual_seed(12345)
        with torch.no_grad():
            random_draws = not torch.equal(model(**kwargs).logits, ref_logits)
    except Exception as exc:  # noqa: BLE001
        result["training"], result["training_error"] = "does-not-build", _eager_error(exc)
        return result
    if random_draws:
        # the training forward samples (phimoe's sparsemixer): compiled draws come from XLA's generator,
        # eager's from torch's, so no value can be compared; the compiled step must run, finite, shaped as eager's
        try:
            model.zero_grad(set_to_none=True)
            torch._dynamo.reset()
            out = torch.compile(model, backend="neuron", options=options)(**kwargs)
            out.loss.backward()
            assert out.logits.shape == ref_logits.shape and torch.isfinite(out.loss), "not finite"
            result["training"] = "random"
            result["training_error"] = ("the training forward draws random numbers (two eager runs with other "
                                        "seeds differ): compiled ran, values not comparable")
        except Exception as exc:  # noqa: BLE001
            result["training"], result["training_error"] = _classify(exc)
        result["training_seconds"] = round(time.perf_counter() - start, 1)
        return result
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="neuron", options=options)
        loss, logits, grads = _train_step(model, kwargs, seed=None, forward=compiled)
        _assert_step_matches(loss, logits, grads, ref_loss, ref_logits, ref_grads)
        result["training"] = "pass"
    except AssertionError as exc:
        result["training"], result["training_error"] = "mismatch", " ".join(str(exc).split())[:300]
        try:
            loss64, logits64, ref64 = _train_step(copy.deepcopy(model).double(), kwargs, seed=None)
            ref64.update(loss=loss64, logits=logits64)
            got_all = dict(grads, loss=loss, logits=logits)
            _float64_verdict(result, "training", got_all, dict(ref_grads, loss=ref_loss, logits=ref_logits), ref64)
        except Exception as e:  # noqa: BLE001
            result["training_float64"] = f"no float64 run: {type(e).__name__}"
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


RESULT = "@@zoo-result "  # prefixes a worker's JSON result line on its stdout


def _worker_env(device: str = "") -> dict:
    env = dict(os.environ)
    if not device:  # the device's eager ops share the artifact cache across architectures (same shapes)
        env.setdefault("NEURON_COMPILE_CACHE", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])
    return env


def _failed(arch: str, fallback: str, status: str, why: str) -> dict:
    return {"arch": arch, "fallback": fallback, "inference": status, "generate": status, "training": status,
            "error": why}


def run_one(arch: str, fallback: str, timeout: float, device: str = "") -> dict:
    """One architecture in a fresh process."""
    cmd = [sys.executable, __file__, "--worker", arch, "--fallback", fallback] + (["--device", device] if device else [])
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_worker_env(device),
                              cwd=str(HERE.parent))
    except subprocess.TimeoutExpired:
        return _failed(arch, fallback, "timeout", f"timeout after {timeout:.0f}s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
            result["seconds"] = round(time.perf_counter() - start, 1)
            return result
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    return _failed(arch, fallback, "crash", f"worker exit {proc.returncode}: {tail[:200]}")


class WorkerProcess:
    """A worker process that runs architecture after architecture (``--serve``), so that
    importing torch, transformers, jax and torch-mlir is paid once per worker, not per
    architecture. One that crashes or runs past the timeout is replaced. ``script``: the file whose
    ``--serve`` answers (another benchmark that reuses this machinery)."""

    def __init__(self, script: str = __file__, device: str = ""):
        self.proc = None
        self.script = script
        self.device = device

    def _start(self):
        import queue
        import threading

        extra = ["--device", self.device] if self.device else []
        self.proc = subprocess.Popen([sys.executable, self.script, "--serve"] + extra, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                     env=_worker_env(self.device), cwd=str(HERE.parent))
        self.lines, self.errors = queue.Queue(), collections.deque(maxlen=20)  # the last stderr lines
        threading.Thread(target=lambda p=self.proc, q=self.lines: [q.put(ln) for ln in p.stdout] + [q.put(None)],
                         daemon=True).start()
        threading.Thread(target=lambda p=self.proc, e=self.errors: [e.append(ln) for ln in p.stderr],
                         daemon=True).start()

    def run(self, arch: str, timeout: float) -> dict:
        import queue

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        start = time.perf_counter()
        self.proc.stdin.write(arch + "\n")
        self.proc.stdin.flush()
        while True:
            left = timeout - (time.perf_counter() - start)
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.close()
                return _failed(arch, "error", "timeout", f"timeout after {timeout:.0f}s")
            if line is None:  # the process died
                tail = (self.errors[-1].strip() if self.errors else "")[:200]
                code = self.proc.wait()
                self.proc = None
                return _failed(arch, "error", "crash", f"worker exit {code}: {tail}")
            if line.startswith(RESULT):
                result = json.loads(line[len(RESULT):])
                result["seconds"] = round(time.perf_counter() - start, 1)
                return result

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def serve(device: str = "") -> None:
    """--serve: read architecture names from stdin, one per line; print a result line for each."""
    import warnings

    import torch._dynamo

    import neuron_compile

    warnings.filterwarnings("ignore")
    for line in sys.stdin:
        arch = line.strip()
        torch._dynamo.reset()
        neuron_compile.reset()
        print(RESULT + json.dumps(device_worker(arch) if device else worker(arch, "error")), flush=True)


def run_arch(arch: str, timeout: float, process: WorkerProcess | None = None, device: str = "") -> dict:
    """Fallback off (in ``process`` when given); a result other than a pass is checked again in a
    fresh process (an architecture before it in the same process must not decide it), and where
    it fails to compile, fallback on is run as well (not on the device: there fallback is the
    device's own ``NEURON_COMPILE_FALLBACK``, off)."""
    if device:
        first = process.run(arch, timeout) if process is not None else run_one(arch, "error", timeout, device)
        ok = ("pass", "does-not-build", "n/a")
        if process is not None and any(first.get(k, "pass") not in ok for k in DEVICE_MODES):
            first = run_one(arch, "error", timeout, device)
        return {"device": first}
    first = process.run(arch, timeout) if process is not None else run_one(arch, "error", timeout)
    ok = ("pass", "does-not-build", "random")
    if process is not None and any(first[k] not in ok for k in ("inference", "training")):
        first = run_one(arch, "error", timeout)
    entry = {"error": first}
    if any(first[k] not in ok + ("timeout",) for k in ("inference", "training")):
        entry["eager"] = run_one(arch, "eager", timeout)
    return entry


DEVICE_MODES = ("inference", "generate", "training")


def summary(results: dict, device: str = "") -> dict:
    """Per mode: how many build and run eagerly, how many of those pass, and the rest by status."""
    out = {}
    for mode in DEVICE_MODES if device else ("inference", "training"):
        statuses = [r["device" if device else "error"].get(mode, "n/a") for r in results.values()]
        statuses = [s for s in statuses if s != "n/a"]
        built = [s for s in statuses if s != "does-not-build"]
        counts = {s: statuses.count(s) for s in sorted(set(statuses))}
        out[mode] = {"built": len(built), "pass": built.count("pass"),
                     "rate": round(100 * built.count("pass") / max(len(built), 1), 1), "statuses": counts}
    return out


def write_table(results: dict, out: Path, note: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_zoo.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    n = len(results)
    sums = summary(results)

    def count(fallback, key):
        return sum(1 for a in results if (results[a].get(fallback) or results[a]["error"])[key] == "pass")

    def line(mode):
        s = sums[mode]
        rest = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if k != "pass")
        return f"{mode} **{s['pass']}/{s['built']} = {s['rate']}%** of those that build and run eagerly ({rest})"

    lines = ["# Hugging Face architecture zoo through the `neuron` backend", "",
             f"Generated by `benchmarks/hf_zoo.py`. {n} architectures: every name transformers' "
             "`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` holds (the full run; bert runs as a masked LM), plus t5 (seq2seq). "
             f"Tiny configs with random weights made by `benchmarks/zoo_configs.py` ({LAYERS} layers, hidden "
             f"{HIDDEN}, {HEADS} heads, {KV_HEADS} KV heads, vocab {VOCAB}), batch {BATCH}x{SEQ}. Inference: logits "
             "against eager (rtol=atol=1e-4). Training: one step's loss, logits and every gradient against eager "
             "(gradients rtol=1e-3, atol=1e-4). Where that fails, the same step runs in float64: if every compiled "
             "tensor is within 4x of eager float32's own distance from float64, it is float noise and passes "
             "(the last column says so). `does-not-build`: the model fails eagerly (the reason is given), "
             "so nothing is compiled. `random`: the training forward itself draws random numbers (two eager runs "
             "differ), so compiled and eager values cannot be compared; the compiled step ran. All-zero weight matrices (afmoe's router) get random values first: "
             "with them every routing score ties. `fallback=eager` is run where fallback off fails to compile; "
             "elsewhere it is the same run: `(same)`." + (f" {note}" if note else ""), "",
             f"**Fallback off:** {line('inference')}; {line('training')}.", "",
             f"**Fallback on:** inference {count('eager', 'inference')}/{n}, "
             f"training {count('eager', 'training')}/{n} pass.", "",
             "| architecture | inference | training | fallback on: inference | training | ops run eagerly | "
             "seconds | first error, or the float64 check (fallback off) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arch, r in results.items():
        e = r["error"]
        f = r.get("eager") or {}
        same = not f
        err = e.get("error") or "; ".join(
            (f"{m}: {e[f'{m}_float64']}" if e[m] == "pass" else e.get(f"{m}_error", "") + (
                f" [float64: {e[f'{m}_float64']}]" if e.get(f"{m}_float64") else ""))
            for m in ("inference", "training") if e.get(f"{m}_error") or e.get(f"{m}_float64"))
        ops = ", ".join(f"{k} x{v}" for k, v in (f.get("fallback_ops") or {}).items())
        lines.append(f"| {arch} | {e['inference']} | {e['training']} | "
                     f"{'(same)' if same else f['inference']} | {'(same)' if same else f['training']} | {ops} | "
                     f"{e.get('seconds', '')} | {err[:160].replace('|', '/')} |")
    (out / "hf_zoo.md").write_text("\n".join(lines) + "\n")


def write_device_table(results: dict, out: Path, note: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_zoo_device.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    sums = summary(results, "neuron")

    def line(mode):
        s = sums[mode]
        rest = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if k != "pass")
        return f"{mode} **{s['pass']}/{s['built']} = {s['rate']}%**" + (f" ({rest})" if rest else "")

    lines = ["# Hugging Face architecture zoo on the `neuron` device", "",
             f"Generated by `benchmarks/hf_zoo.py --device neuron`. {len(results)} architectures, the tiny configs "
             f"of `benchmarks/zoo_configs.py` ({LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, {KV_HEADS} KV heads, "
             f"vocab {VOCAB}), random weights, batch {BATCH}x{SEQ}. Each model is saved with `save_pretrained` and "
             "loaded twice, on CPU and with `from_pretrained(path, device_map=\"neuron\")`; the device copy runs "
             "against the CPU copy. Inference: eager logits (rtol=atol=1e-4). Generate: greedy, "
             f"{GENERATE['max_new_tokens']} new tokens, `cache_implementation=\"static\"` (transformers compiles "
             "the forward by itself on neuron; the column `graphs` counts the graphs our backend compiled), "
             "tokens equal to CPU's; where they part, CPU's own logits at that step must show a near-tie "
             "(within 1e-4) for a pass (noted). A model whose CPU generate refuses a static cache generates with "
             "its default cache (noted). Training: one eager step, loss, logits and every gradient against CPU "
             "(gradients rtol=1e-3, atol=1e-4), random ops seeded alike (the device draws CPU's numbers); "
             "a mismatch is rerun in float64 and passes as float noise when the device is within 4x of CPU "
             "float32's own distance. `does-not-build`: fails on CPU (why given), nothing run on the device; "
             "`n/a`: a masked LM does not generate." + (f" {note}" if note else ""), "",
             f"**On the device:** {line('inference')}; {line('generate')}; {line('training')} "
             "of those that build and run on CPU.", "",
             "| architecture | inference | generate | graphs | training | seconds | error or note |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arch, r in results.items():
        e = r["device"]
        notes = [e["error"]] if e.get("error") else []
        for m in DEVICE_MODES:
            for key in (f"{m}_error", f"{m}_float64", f"{m}_note", f"{m}_static"):
                if e.get(key) and not (m == "generate" and e.get(m) == "n/a"):
                    notes.append(f"{m}: {e[key]}")
        lines.append(f"| {arch} | {e.get('inference')} | {e.get('generate', 'n/a')} | {e.get('generate_compiled', '')} | "
                     f"{e.get('training')} | {e.get('seconds', '')} | {'; '.join(notes)[:400].replace('|', '/')} |")
    (out / "hf_zoo_device.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="", help="comma-separated architectures (default: every causal LM)")
    p.add_argument("--quick", action="store_true", help=f"the quick subset ({len(QUICK)} architectures)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)),
                   help="workers at once (default: one per core)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--timeout", type=float, default=300, help="seconds per architecture and fallback mode")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in OUT/hf_zoo.json (with --arch: rerun just those)")
    p.add_argument("--note", default="", help="a sentence for the table's header (how the run was made)")
    p.add_argument("--table", action="store_true", help="only rebuild OUT/hf_zoo.md from OUT/hf_zoo.json")
    p.add_argument("--device", default="", choices=["", "neuron"],
                   help="run on the neuron device: from_pretrained(device_map=...), logits, static-cache generate "
                        "and an eager training step against CPU (OUT/hf_zoo_device.{md,json})")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--fallback", default="error", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        import warnings

        warnings.filterwarnings("ignore")
        fn = device_worker(args.worker) if args.device else worker(args.worker, args.fallback)
        print(RESULT + json.dumps(fn), flush=True)
        return 0
    if args.serve:
        serve(args.device)
        return 0
    out = Path(args.out)
    order = all_archs()
    name = "hf_zoo_device.json" if args.device else "hf_zoo.json"
    write = write_device_table if args.device else write_table
    if args.table:
        results = json.loads((out / name).read_text())
        write({a: results[a] for a in order if a in results} | results, out, args.note)
        return 0
    results = {}
    if args.resume and (out / name).exists():
        results = json.loads((out / name).read_text())
    archs = args.arch.split(",") if args.arch else QUICK if args.quick else order
    todo = [a for a in archs if args.arch or not args.resume or a not in results]
    started = time.time()
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import threading

    local = threading.local()
    processes = []

    def run(arch):
        if not hasattr(local, "process"):
            local.process = WorkerProcess(device=args.device)
            processes.append(local.process)
        return run_arch(arch, args.timeout, local.process, args.device)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run, arch): arch for arch in todo}
        for fut in as_completed(futures):
            arch = futures[fut]
            entry = results[arch] = fut.result()
            e, f = entry.get("error") or entry["device"], entry.get("eager") or {}
            print(f"[{time.time() - started:.0f}s] {arch}: inference {e['inference']}, "
                  + (f"generate {e.get('generate')}, " if args.device else "") + f"training {e['training']}"
                  + (f"; fallback on: {f['inference']}, {f['training']}" if f else "")
                  + "".join(f"\n    {k}: {e[k]}" for k in ("error", "inference_error", "generate_error",
                                                            "training_error") if e.get(k)),
                  flush=True)
            write({a: results[a] for a in order if a in results} | results, out, args.note)
    for process in processes:
        process.close()
    print(f"zoo: {len(todo)} architectures in {time.time() - started:.0f}s, {args.jobs} workers; "
          f"{json.dumps(summary(results, args.device))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
