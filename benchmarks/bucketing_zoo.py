"""Shape bucketing over the Hugging Face zoo: one executable per bucket, every result equal to eager.

Each architecture (hf_zoo's tiny configs, positions raised to 512) is compiled
with ``torch.compile(model, backend="neuron", dynamic=True)`` and called at
sequence lengths 37, 64, 100, 129, 200, 250 (buckets 128 and 256), batch 2
held static (``mark_static``: the length is what changes; a symbolic batch of 2
would pad to 128 rows):

    inference   logits at every length against eager
    training    loss, logits and every gradient at every length against eager

and the executables each graph compiled are counted. Bucketed: no graph fell
back to exact shapes and no graph has more executables than buckets touched.
Where not bucketed, the reason is the analysis' (what ``neuron-compile explain``
prints). A mismatch is a wrong number and is counted separately; float noise is
told apart as in hf_zoo (compiled within 4x of eager float32's own distance
from float64). A training forward that samples (two eager runs with other seeds
differ: phimoe's sparsemixer) is ``random``: its results are checked for shape
and finiteness only, and it counts as bucketed by its executables.

Worker processes are hf_zoo's (``WorkerProcess``), serving this file.
Results: ``benchmarks/results/bucketing_zoo.{md,json}``.

    nice -n 10 python benchmarks/bucketing_zoo.py --jobs 1          # hf_zoo's quick subset, the issue's 8 first
    python benchmarks/bucketing_zoo.py --arch gpt2,llama --out /tmp/bz
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import hf_zoo  # noqa: E402  (benchmarks/ is on sys.path when this runs as a script)

LENGTHS = [37, 64, 100, 129, 200, 250]
BUCKETS = 2  # of 128 that LENGTHS touch
POSITIONS = 512
FIRST = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"]  # issue 21's
ORDER = FIRST + [a for a in hf_zoo.CAUSAL if a not in FIRST]
RESULT = hf_zoo.RESULT


class _Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []
        self.one_size = set()  # graphs Dynamo traced for one size (its guards admit no other)

    def emit(self, record):
        message = record.getMessage()
        if "compiles per exact shape" in message and message not in self.messages:
            self.messages.append(message.removeprefix("neuron_compile: "))
        if "runs at one size" in message:
            self.one_size.add(message.removeprefix("neuron_compile: ").split()[0])


def _executables() -> dict:
    """graph -> [executables, of them a bucket's, symbolic (any executable for a signature), compile seconds]."""
    import neuron_compile

    out = {}
    for r in neuron_compile.compile_reports():
        entry = out.setdefault(r.graph, [0, 0, False, 0.0])
        entry[0] += 1
        entry[1] += r.signature.startswith("bucket")
        entry[2] |= bool(r.signature)
        entry[3] += r.total_seconds
    return out


def _mode(model, kwargs_at, mode: str, result: dict) -> None:
    """One mode at every length: compiled against eager; executables counted; the verdict in ``result``."""
    import copy

    import torch
    import torch._dynamo

    import neuron_compile

    torch._dynamo.reset()
    neuron_compile.reset()
    reasons = _Reasons()
    logger = logging.getLogger("neuron_compile")
    logger.addHandler(reasons)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    training = mode == "training"
    model.train(training)
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    start = time.perf_counter()
    status, detail = "pass", ""
    try:
        random_draws = training and _draws_random(model, kwargs_at(LENGTHS[0]))
        for t in LENGTHS:
            kwargs = kwargs_at(t)
            for v in kwargs.values():
                torch._dynamo.mark_static(v, 0)
            got, want = _step(compiled, model, kwargs, training)
            if random_draws:
                # the training forward samples (phimoe's sparsemixer): compiled draws come from XLA's
                # generator, eager's from torch's; no value compares, every result must be finite and shaped
                status, detail = "random", "the training forward draws random numbers: values not comparable"
                for name, w in want.items():
                    assert got[name].shape == w.shape and torch.isfinite(got[name]).all(), f"{name} at length {t}"
                continue
            try:
                for name, w in want.items():
                    tol = (1e-3, 1e-4) if name not in ("loss", "logits") else (1e-4, 1e-4)
                    torch.testing.assert_close(got[name], w, rtol=tol[0], atol=tol[1], msg=lambda m, n=name: f"{n}: {m}")
            except AssertionError as exc:
                verdict = {}
                try:
                    m64 = copy.deepcopy(model).double()
                    _, ref64 = _step(m64, m64, kwargs, training)
                    hf_zoo._float64_verdict(verdict, mode, got, want, ref64)
                except Exception as e:  # noqa: BLE001 - no float64 run: stays a mismatch
                    verdict[f"{mode}_float64"] = f"no float64 run: {type(e).__name__}"
                if verdict.get(mode) != "pass":
                    status, detail = "mismatch", f"length {t}: " + " ".join(str(exc).split())[:240]
                    break
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        status, detail = hf_zoo._classify(exc)
    finally:
        logger.removeHandler(reasons)
        logger.setLevel(level)
    graphs = _executables()
    # a graph for one size (a Python loop's count guarded: Dynamo compiles a graph per count) has one
    symbolic = [v for g, v in graphs.items() if v[2] and g not in reasons.one_size]
    bucketed = status in ("pass", "random") and not reasons.messages and bool(symbolic) and all(
        n <= BUCKETS and b == n for n, b, _, _ in symbolic) and all(graphs[g][0] == 1 for g in reasons.one_size
                                                                     if g in graphs)
    result[mode] = status
    if detail:
        result[f"{mode}_error"] = detail
    result[f"{mode}_bucketed"] = bucketed
    result[f"{mode}_executables"] = {g: v[0] for g, v in graphs.items()}
    result[f"{mode}_compile_seconds"] = round(sum(v[3] for v in graphs.values()), 1)
    result[f"{mode}_seconds"] = round(time.perf_counter() - start, 1)
    if reasons.messages:
        result[f"{mode}_reasons"] = reasons.messages
    elif status in ("pass", "random") and not bucketed:
        result[f"{mode}_reasons"] = [f"executables per graph {result[f'{mode}_executables']}" if symbolic
                                     else "no graph with a symbolic length"]


def _draws_random(model, kwargs) -> bool:
    """Two eager forwards with other seeds differ: the model samples (as hf_zoo tells it)."""
    import torch

    with torch.no_grad():
        torch.manual_seed(0)
        first = model(**kwargs).logits
        torch.manual_seed(12345)
        return not torch.equal(model(**kwargs).logits, first)


def _step(compiled, model, kwargs, training):
    """(compiled tensors, eager tensors) by name: logits; in training also loss and every gradient."""
    import torch

    if not training:
        with torch.no_grad():
            return {"logits": compiled(**kwargs).logits}, {"logits": model(**kwargs).logits}
    out = []
    for fn in (compiled, model):
        model.zero_grad(set_to_none=True)
        o = fn(**kwargs)
        o.loss.backward()
        tensors = {"loss": o.loss.detach(), "logits": o.logits.detach()}
        tensors.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        out.append(tensors)
    return out[0], out[1]


def worker(arch: str) -> dict:
    import torch
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64
    result = {"arch": arch}
    try:
        model, kwargs = hf_zoo.build(arch, positions=POSITIONS)
        if not set(kwargs) <= {"input_ids", "labels", "decoder_input_ids"}:
            raise ValueError(f"takes {sorted(kwargs)}: only token ids and labels are varied here")
        gen = torch.Generator().manual_seed(1)
        rows = kwargs["input_ids"].shape[0]

        def kwargs_at(t):
            # as hf_zoo.build makes them, at length t: a seq2seq model's decoder ids too, a codebook
            # model's labels as batch x length x codebook
            ids = torch.randint(3, hf_zoo.VOCAB, (rows, t), generator=gen)
            out = {"input_ids": ids, "labels": ids.clone()}
            if rows > hf_zoo.BATCH:
                out["labels"] = ids.view(hf_zoo.BATCH, -1, t).permute(0, 2, 1).clone()
            if "decoder_input_ids" in kwargs:
                out["decoder_input_ids"] = torch.randint(3, hf_zoo.VOCAB, (hf_zoo.BATCH, t), generator=gen)
            return out

        model.eval()
        with torch.no_grad():
            model(**kwargs_at(LENGTHS[-1]))
    except Exception as exc:  # noqa: BLE001
        result.update(inference="does-not-build", training="does-not-build", error=hf_zoo._eager_error(exc))
        return result
    for mode in ("inference", "training"):
        _mode(model, kwargs_at, mode, result)
    return result


def serve() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    for line in sys.stdin:
        print(RESULT + json.dumps(worker(line.strip())), flush=True)


def summary(results: dict) -> dict:
    out = {}
    for mode in ("inference", "training"):
        built = [r for r in results.values() if r[mode] != "does-not-build"]
        bucketed = [r for r in built if r.get(f"{mode}_bucketed")]
        out[mode] = {"built": len(built), "bucketed": len(bucketed),
                     "rate": round(100 * len(bucketed) / max(len(built), 1), 1),
                     "mismatches": sum(r[mode] == "mismatch" for r in built),
                     "statuses": {s: sum(r[mode] == s for r in built) for s in sorted({r[mode] for r in built})}}
    return out


def write_table(results: dict, out: Path, note: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bucketing_zoo.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    sums = summary(results)

    def line(mode):
        s = sums[mode]
        return (f"{mode}: **{s['bucketed']}/{s['built']} = {s['rate']}% bucketed**, {s['mismatches']} mismatches "
                f"against eager ({', '.join(f'{k} {v}' for k, v in s['statuses'].items())})")

    def cell(r, mode):
        ex = r.get(f"{mode}_executables") or {}
        return (f"{'yes' if r.get(f'{mode}_bucketed') else 'no'} | {r[mode]} | "
                f"{', '.join(f'{g.split(chr(46))[-1]} {n}' for g, n in ex.items())} | {r.get(f'{mode}_compile_seconds', '')}")

    lines = ["# Shape bucketing over the Hugging Face zoo", "",
             f"Generated by `benchmarks/bucketing_zoo.py`. `torch.compile(model, backend=\"neuron\", dynamic=True)` "
             f"on hf_zoo's tiny configs (positions {POSITIONS}), batch 2 static, sequence lengths "
             f"{', '.join(map(str, LENGTHS))} ({BUCKETS} buckets of 128). Inference: logits at every length against "
             "eager (rtol=atol=1e-4); training: loss, logits and every gradient at every length (gradients rtol=1e-3, "
             "atol=1e-4), float noise told apart by a float64 run as in hf_zoo. Bucketed: no graph compiled per "
             f"exact shape and every graph compiled at most one executable per bucket ({BUCKETS}); per exact shape "
             f"it would be one per length ({len(LENGTHS)}). A graph Dynamo traced for one size (its guards admit no "
             "other: the gated delta rule's Python loop over chunks of 64 makes a graph per chunk count, whose "
             "bucket is capped at the count's last length) has one executable. Executables per graph (inference; "
             "forward, backward), "
             "and the seconds they took to compile, summed." + (f" {note}" if note else ""), "",
             f"{line('inference')}; {line('training')}.", "",
             "| architecture | inference bucketed | result | executables | compile s | training bucketed | result | "
             "executables | compile s | why not bucketed, or the error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arch, r in results.items():
        why = r.get("error") or "; ".join(
            f"{m}: " + "; ".join(r.get(f"{m}_reasons", []) + ([r[f"{m}_error"]] if r.get(f"{m}_error") else []))
            for m in ("inference", "training") if r.get(f"{m}_reasons") or r.get(f"{m}_error"))
        if r["inference"] == "does-not-build":
            lines.append(f"| {arch} | - | does-not-build | | | - | does-not-build | | | {why[:200]} |")
            continue
        lines.append(f"| {arch} | {cell(r, 'inference')} | {cell(r, 'training')} | {why[:300].replace('|', '/')} |")
    (out / "bucketing_zoo.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="", help="comma-separated architectures (default: hf_zoo's quick causal LMs)")
    p.add_argument("--all", action="store_true", help="every causal LM of the installed transformers")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per architecture")
    p.add_argument("--resume", action="store_true", help="keep the results already in OUT/bucketing_zoo.json")
    p.add_argument("--note", default="")
    p.add_argument("--table", action="store_true", help="only rebuild the table from OUT/bucketing_zoo.json")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(RESULT + json.dumps(worker(args.worker)), flush=True)
        return 0
    if args.serve:
        serve()
        return 0
    out = Path(args.out)
    results = {}
    if (args.resume or args.table) and (out / "bucketing_zoo.json").exists():
        results = json.loads((out / "bucketing_zoo.json").read_text())
    if args.table:
        rank = {a: i for i, a in enumerate(ORDER)}
        write_table(dict(sorted(results.items(), key=lambda kv: rank.get(kv[0], len(rank)))), out, args.note)
        return 0
    archs = args.arch.split(",") if args.arch else hf_zoo.all_archs() if args.all else ORDER
    todo = [a for a in archs if args.arch or a not in results]
    started = time.time()
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import threading

    local, processes = threading.local(), []

    def run(arch):
        if not hasattr(local, "process"):
            local.process = hf_zoo.WorkerProcess(script=__file__)
            processes.append(local.process)
        return local.process.run(arch, args.timeout)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run, arch): arch for arch in todo}
        for fut in as_completed(futures):
            arch = futures[fut]
            r = results[arch] = fut.result()
            print(f"[{time.time() - started:.0f}s] {arch}: inference {r['inference']} bucketed "
                  f"{r.get('inference_bucketed')} {r.get('inference_executables', '')}, training {r['training']} "
                  f"bucketed {r.get('training_bucketed')} {r.get('training_executables', '')}"
                  + "".join(f"\n    {k}: {r[k]}" for k in ("error", "inference_error", "training_error",
                                                             "inference_reasons", "training_reasons") if r.get(k)),
                  flush=True)
            order = {a: i for i, a in enumerate(archs)}
            write_table(dict(sorted(results.items(), key=lambda kv: order.get(kv[0], len(order)))), out, args.note)
    for process in processes:
        process.close()
    print(f"bucketing zoo: {len(todo)} architectures in {time.time() - started:.0f}s; {json.dumps(summary(results))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
