"""Where TorchTitan's compiled blocks part from CPU (issue 54, item 3): one training step, measured.

TorchTitan's llama3 debug model (its own ``Transformer``, its selective activation checkpointing
``apply_ac`` and per-block ``torch.compile`` as ``parallelize_llama`` applies them in one process, its
``cross_entropy_loss``) takes one forward and backward on one batch, in several ways; each way's loss
and gradients are compared with the same step in float64 on CPU (the exact answer, to float32's
eyes) and with CPU's float32 eager step. Rounding, whatever its source, shows as a distance to
float64 of the same size as CPU eager's own; a wrong lowering shows as more.

    python benchmarks/torchtitan_drift.py [--seq 256 --batch 4] [--ways cpu_threads2,neuron_compiled,...]

Prints one JSON line per way: loss, relative loss error against float64 and against CPU float32, and
the largest gradient error over parameters (max |g - g_ref| / max |g_ref|, per parameter).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

WAYS = {
    # name: (device, compile backend or None, activation checkpointing, options)
    "cpu_eager_threads2": ("cpu", None, True, None),
    "cpu_inductor": ("cpu", "inductor", True, None),
    "neuron_eager": ("neuron", None, True, None),
    "neuron_compiled": ("neuron", "neuron", True, None),
    "neuron_compiled_no_ac": ("neuron", "neuron", False, None),
    "neuron_compiled_passes_none": ("neuron", "neuron", True, {"passes": "none"}),
}


def build_model(seq: int, seed: int):
    from torchtitan.models.llama3 import Transformer, llama3_args

    args = copy.deepcopy(llama3_args["debugmodel"])
    args.max_seq_len = seq
    torch.manual_seed(seed)
    with torch.device("cpu"), torch.no_grad():
        model = Transformer(args)
        model.init_weights()
    return model


def prepare(model, device: str, backend: str | None, ac: bool, options: dict | None):
    """What ``parallelize_llama`` does in one process: AC per block, then compile per block."""
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac

    model = copy.deepcopy(model).to(device)
    if ac:
        apply_ac(model, ActivationCheckpoint(mode="selective", selective_ac_option="2"),
                 model_compile_enabled=backend is not None)
    loss_fn = cross_entropy_loss
    if backend is not None:
        for layer_id, block in model.layers.named_children():
            model.layers.register_module(
                layer_id, torch.compile(block, backend=backend, fullgraph=True, options=options))
        loss_fn = torch.compile(cross_entropy_loss, backend=backend, options=options)
    return model, loss_fn


def step(model, loss_fn, tokens: torch.Tensor, device: str):
    inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    loss = loss_fn(model(inputs), labels) / labels.numel()
    loss.backward()
    grads = {_plain(n): p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters()}
    return loss.detach().to("cpu", torch.float64).item(), grads


def _plain(name: str) -> str:
    """A parameter's name without the wrappers' parts (compile's, activation checkpointing's)."""
    return name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")


def grad_error(grads, ref) -> tuple[float, str]:
    worst, where = 0.0, ""
    for name, g in grads.items():
        r = ref[name]
        err = ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        if err > worst:
            worst, where = err, name
    return worst, where


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ways", default=",".join(WAYS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model(args.seq, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, 2000, (args.batch, args.seq + 1), generator=g)

    m64, lf64 = prepare(model.double(), "cpu", None, True, None)
    loss64, grads64 = step(m64, lf64, tokens, "cpu")
    m32, lf32 = prepare(model.float(), "cpu", None, True, None)
    loss32, grads32 = step(m32, lf32, tokens, "cpu")
    report("cpu_eager_fp32", loss32, grads32, loss64, grads64, loss32, grads32, 0.0)
    for name in args.ways.split(","):
        device, backend, ac, options = WAYS[name]
        torch.set_num_threads(2 if name == "cpu_eager_threads2" else 1)
        start = time.perf_counter()
        m, lf = prepare(model, device, backend, ac, options)
        loss, grads = step(m, lf, tokens, device)
        report(name, loss, grads, loss64, grads64, loss32, grads32, time.perf_counter() - start)
        torch._dynamo.reset()


def report(name, loss, grads, loss64, grads64, loss32, grads32, seconds) -> None:
    g64, where64 = grad_error(grads, grads64)
    g32, where32 = grad_error(grads, grads32)
    print(json.dumps({
        "way": name, "loss": loss,
        "loss_rel_vs_fp64": abs(loss - loss64) / abs(loss64),
        "loss_rel_vs_cpu_fp32": abs(loss - loss32) / abs(loss32),
        "grad_err_vs_fp64": g64, "worst_vs_fp64": where64,
        "grad_err_vs_cpu_fp32": g32, "worst_vs_cpu_fp32": where32,
        "seconds": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
