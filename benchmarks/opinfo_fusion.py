"""OpInfo through the device's fused runs: each op's first float32 sample inside a run of eager ops, fused
against the same run op by op (issue 53's "the device's OpInfo sweep, fusion on vs off").

A sample alone is a one-op run, which nothing fuses; so each sample runs as a chain the way a model's ops
meet: ``input * 1.5`` (a producer XLA can fuse into the op), the op, then ``out * 0.5 + 0.25`` on each
floating result (consumers it can fuse after it). The chain runs op by op
(``NEURON_COMPILE_EAGER_FUSION=0``), then three times queued (sighted twice, built in the background,
waited for, then fused), and the two are compared:

    bitwise     the fused results equal op by op's bit for bit
    close       they differ, within op by op's own distance to CPU eager (the issue's tolerance: twice
                the largest difference op by op shows against CPU, or float32's 1e-6 relative where op by
                op is exact)
    differs     beyond that (a bug, or XLA's fusion changing a result more than rounding)
    not-fused   the run did not become one executable (it holds an op that cannot be queued)
    error       the chain failed on the device, fused or not (the device sweep's business)
    skipped     the op's sample needs what the chain cannot give (no float tensor input, a random op)

    python benchmarks/opinfo_fusion.py                 # every op; table in results/opinfo_fusion.md
    python benchmarks/opinfo_fusion.py --ops add,softmax,nn.functional.layer_norm

``tests/test_device_op_queue.py`` runs a fixed subset of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _chain(op, sample):
    """The sample as a run of eager ops on neuron, and the same on CPU: ``fn(device)`` -> outputs."""
    import torch
    from torch.utils._pytree import tree_map

    from opinfo_device import _to_device

    def fn(device: str):
        inp, args, kwargs = sample.input, sample.args, sample.kwargs
        if device == "neuron":
            inp, args, kwargs = _to_device((inp, args, kwargs))
        inp = inp * 1.5
        out = op.op(inp, *args, **kwargs)
        return tree_map(lambda t: t * 0.5 + 0.25 if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                        out)

    return fn


def _host(out):
    import torch
    from torch.utils._pytree import tree_leaves

    return [t.cpu() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def compare(op, sample) -> dict:
    """One op's chain fused against op by op (and op by op against CPU): a status and the differences."""
    import torch

    from neuron_compile.device import op_queue

    fn = _chain(op, sample)
    try:
        cpu = _host(fn("cpu"))
    except Exception as exc:  # noqa: BLE001 - the chain does not fit this op on CPU already
        return {"status": "skipped", "error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}
    try:
        op_queue.set_enabled(False)
        alone = _host(fn("neuron"))
        op_queue.set_enabled(True)
        before = op_queue.COUNTS["fused_runs"]
        for _ in range(3):
            fused = _host(fn("neuron"))
            op_queue.wait_for_builds()
        fused = _host(fn("neuron"))
        ran_fused = op_queue.COUNTS["fused_runs"] > before
    except Exception as exc:  # noqa: BLE001 - the device sweep reports these
        op_queue.set_enabled(True)
        return {"status": "error", "error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}
    if not ran_fused:
        return {"status": "not-fused"}
    def same(a, b):  # bit for bit, NaN where NaN (its payload aside)
        if not a.is_floating_point():
            return torch.equal(a, b)
        nan = a.isnan()
        return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])

    if len(fused) == len(alone) and all(same(a, b) for a, b in zip(fused, alone)):
        return {"status": "bitwise"}
    worst, allowed = 0.0, 0.0
    for a, b, c in zip(fused, alone, cpu):
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return {"status": "differs", "error": "an integer result differs"}
            continue
        finite = torch.isfinite(b) & torch.isfinite(a)
        nan = a.isnan()
        if (not torch.equal(torch.isfinite(a), torch.isfinite(b)) or not torch.equal(nan, b.isnan())
                or not torch.equal(a[~finite & ~nan], b[~finite & ~nan])):  # the same NaNs, the same infinities
            return {"status": "differs", "error": "non-finite values differ"}
        diff = (a - b).abs()[finite].max().item() if finite.any() else 0.0
        own = (b.double() - c.double()).abs()[finite].max().item() if finite.any() and b.shape == c.shape else 0.0
        scale = b.abs()[finite].max().item() if finite.any() else 0.0
        worst = max(worst, diff)
        allowed = max(allowed, 2 * own, 1e-6 * scale)
    status = "close" if worst <= allowed else "differs"
    return {"status": status, "max_diff": worst, "allowed": allowed}


def sweep(names=None) -> dict:
    from opinfo_coverage import first_samples, is_shape_only, ops_by_name

    ops = ops_by_name()
    results = {}
    for name in names or sorted(ops):
        op = ops.get(name)
        if op is None:
            results[name] = {"status": "skipped", "error": "no such OpInfo"}
            continue
        try:
            samples = first_samples(op, "float32", "forward", 1)
        except Exception as exc:  # noqa: BLE001 - OpInfo without float32 samples
            results[name] = {"status": "skipped", "error": str(exc).splitlines()[0][:200]}
            continue
        import torch

        if not samples or not isinstance(samples[0].input, torch.Tensor) or not samples[0].input.is_floating_point() \
                or is_shape_only(op, samples[0]):
            results[name] = {"status": "skipped", "error": "no float tensor input, or values undefined (random)"}
            continue
        results[name] = compare(op, samples[0])
        print(json.dumps({name: results[name]}), flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--out", default=str(HERE / "results" / "opinfo_fusion"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = sweep([n for n in args.ops.split(",") if n] or None)
    counts = Counter(r["status"] for r in results.values())
    differs = {n: r for n, r in results.items() if r["status"] in ("differs", "error", "not-fused")}
    lines = ["# OpInfo through fused runs: fused against op by op", "",
             f"`python benchmarks/opinfo_fusion.py`: {len(results)} ops, {time.perf_counter() - start:.0f} s.", "",
             "| status | ops |", "| --- | --- |", *[f"| {s} | {n} |" for s, n in counts.most_common()], "",
             "| op | status | detail |", "| --- | --- | --- |",
             *[f"| {n} | {r['status']} | {r.get('error', r.get('max_diff', ''))} |" for n, r in sorted(differs.items())], ""]
    Path(args.out + ".md").write_text("\n".join(lines))
    Path(args.out + ".json").write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines[:8 + len(counts)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
