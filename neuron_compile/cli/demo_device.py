"""``neuron-compile demo --device neuron``: the built-in transformer on the ``neuron`` device.

The same GPT-2-style model as ``demo``, moved with ``model.to("neuron")``, run
three ways and each checked against the same steps on CPU eager:

* eager on the device: every ATen op compiled per signature and cached;
* compiled on the device: ``torch.compile(model)`` with no backend named (a
  graph on neuron tensors goes to the neuron backend), forward, backward and
  AdamW steps on device buffers, with the host copies counted;
* greedy generation: token by token through the compiled model over a fixed
  window (one executable), on the device.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

from .common import PROG, _fail_paragraph, emit_json


def cmd_demo_device(args) -> int:
    import torch

    import neuron_compile
    from neuron_compile.device import ops as device_ops

    from .models import GPTConfig, TinyGPT

    neuron_compile.reset()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(n_layer=args.layers)
    reference = TinyGPT(cfg)
    batch, seq = 4, 32
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    if not args.json:
        print(f"{PROG} demo --device neuron: GPT-2-style transformer, {cfg.n_layer} layers, {cfg.n_embd} wide, "
              f"batch {batch} x {seq} tokens, on {torch.neuron.get_device_name()} against CPU eager")

    rows = []
    with torch.no_grad():
        want = reference(ids)
    for mode in ("eager", "compiled"):
        model = copy.deepcopy(reference).to("neuron")
        run = torch.compile(model) if mode == "compiled" else model
        device_ids = ids.to("neuron")
        with torch.no_grad():
            start = time.perf_counter()
            got = run(device_ids)
            first = time.perf_counter() - start
        diff = (got.cpu() - want).abs().max().item()
        cpu_losses, losses, times, copies = _train(reference, model, run, ids, device_ids, args)
        loss_diff = max(abs(a - b) for a, b in zip(cpu_losses, losses))
        steady = statistics.median(times[1:]) * 1e3 if len(times) > 1 else None
        rows.append({"mode": mode, "logits_max_abs_diff": diff, "loss_max_abs_diff": loss_diff,
                     "first_call_s": first, "steady_step_ms": steady,
                     "host_copies_per_step": copies, "losses": losses, "cpu_losses": cpu_losses})

    prompt = ids[:1, :8]
    want_tokens = _greedy(reference, prompt, args.new_tokens)
    model = copy.deepcopy(reference).to("neuron")
    start = time.perf_counter()
    got_tokens = _greedy(torch.compile(model), prompt.to("neuron"), args.new_tokens).cpu()
    generate_s = time.perf_counter() - start
    tokens_equal = got_tokens.tolist() == want_tokens.tolist()

    worst = max(max(r["logits_max_abs_diff"], r["loss_max_abs_diff"]) for r in rows)
    ok = worst <= args.tol and tokens_equal
    summary = {"device": "neuron", "modes": rows, "generate": {"new_tokens": args.new_tokens, "tokens_equal_cpu":
               tokens_equal, "tokens": got_tokens.tolist(), "seconds": generate_s},
               "max_abs_diff": worst, "tolerance": args.tol, "ok": ok,
               "op_compiles": device_ops.COUNTS["op_compiles"]}
    if args.json:
        emit_json(args, summary)
    else:
        from tabulate import tabulate

        table = [(r["mode"], f"{r['logits_max_abs_diff']:.2e}", f"{r['loss_max_abs_diff']:.2e}",
                  f"{r['first_call_s']:.1f}", f"{r['steady_step_ms']:.1f}" if r["steady_step_ms"] else "-",
                  r["host_copies_per_step"]) for r in rows]
        print()
        print(tabulate(table, headers=["on neuron", "max |logits - cpu|", "max |loss - cpu|", "first call s",
                                       "steady AdamW step ms", "host copies / step (before loss.item())"]))
        print(f"\ngreedy generation, {args.new_tokens} tokens through the compiled model: "
              f"{'same tokens as CPU' if tokens_equal else 'TOKENS DIFFER from CPU'} ({generate_s:.1f} s)")
        print(f"\n{'OK' if ok else 'MISMATCH'}: max |neuron - cpu| = {worst:.2e} (tolerance {args.tol:g})")
    if not ok:
        print(_fail_paragraph(f"the neuron device disagrees with CPU eager: max abs difference {worst:.2e} "
                              f"(tolerance {args.tol:g}), tokens equal: {tokens_equal}."), file=sys.stderr)
        return 1
    return 0


def _train(reference, model, run, ids, device_ids, args):
    """AdamW steps on a CPU copy and on the device copy, and the host copies of the device's last step
    before its ``loss.item()`` (the step itself stays on device buffers)."""
    import torch

    from neuron_compile.device import ops as device_ops

    cpu_model = copy.deepcopy(reference)
    opt_cpu = torch.optim.AdamW(cpu_model.parameters(), lr=args.lr)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    cpu_losses, losses, times, copies = [], [], [], 0
    for _ in range(args.steps):
        loss = cpu_model(ids, labels=ids)
        loss.backward()
        opt_cpu.step()
        opt_cpu.zero_grad(set_to_none=True)
        cpu_losses.append(loss.item())
        before = device_ops.COUNTS["host_copies"]
        start = time.perf_counter()
        loss = run(device_ids, labels=device_ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        copies = device_ops.COUNTS["host_copies"] - before
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return cpu_losses, losses, times, copies


def _greedy(model, prompt, new_tokens: int):
    """Greedy decoding over a fixed window (prompt, then zeros), as a static cache does: the model is
    causal, so the zeros after position i do not change its logits, and every step has one shape (one
    executable, not one per length)."""
    import torch

    start = prompt.shape[1]
    ids = torch.cat([prompt, torch.zeros_like(prompt[:, :1]).expand(-1, new_tokens)], dim=1)
    with torch.no_grad():
        for i in range(start, start + new_tokens):
            ids[:, i] = model(ids)[:, i - 1].argmax(-1)
    return ids
