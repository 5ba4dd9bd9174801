"""``neuron-compile``: the offline command line for the neuron backend.

Every command is a small function ``cmd_<name>(args) -> exit code`` over the
same path the backend takes (``torch.compile(..., backend="neuron")``), so what
the CLI shows is what a user's run does. Conventions, shared by all commands:

* exit 0 on success, 1 when a compile fails (or numbers disagree), 2 on bad
  usage (bad flags, a spec that cannot be loaded, an unknown pass name);
* errors go to stderr as one readable paragraph, never a traceback
  (``NEURON_COMPILE_TRACEBACK=1`` shows one for debugging the CLI itself);
* ``--json`` prints what a machine reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import textwrap
import time

PROG = "neuron-compile"


class UsageError(Exception):
    """Bad usage: exit 2."""


class CompileFailure(Exception):
    """A compile failed or the numbers disagree: exit 1."""


def _fail_paragraph(message: str, limit: int = 1200) -> str:
    """One paragraph: a traceback-like message keeps its last line; long ones are cut."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = [lines[0].split("Traceback")[0].strip(), lines[-1]]
    text = " ".join(line for line in lines if line)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{PROG}: error: {text}"


def _print_err(message: str) -> None:
    print(_fail_paragraph(message), file=sys.stderr)


def _unwrap(exc: BaseException) -> BaseException:
    """Dynamo wraps backend errors in BackendCompilerFailed; the cause is what the user needs."""
    seen = 0
    while seen < 5:
        inner = getattr(exc, "inner_exception", None)
        if inner is None:
            break
        exc, seen = inner, seen + 1
    return exc


# ---- shared helpers ----------------------------------------------------------------------------

def _load(spec: str):
    from .specs import load_spec

    return load_spec(spec)


def _backend_options(args) -> dict:
    """Options for torch.compile(..., backend="neuron"), after checking the pass pipeline."""
    options = {}
    passes = getattr(args, "passes", None)
    if passes is not None:
        _check_pipeline(passes)
        options["passes"] = passes
    return options


def _check_pipeline(spec: str) -> None:
    from .compiler import resolve_pipeline
    from .options import Options

    try:
        resolve_pipeline(Options.resolve({"passes": spec}))
    except Exception as exc:  # passes.PipelineError (a ValueError) or anything the parser raises
        raise UsageError(f"the pass pipeline {spec!r} is not valid: {exc}") from None


def _train_step(model, loaded):
    """One forward + backward; a non-scalar output is summed into a loss."""
    out = loaded.call(model)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "loss") and out.loss is not None:
        out = out.loss
    loss = out if out.dim() == 0 else out.float().sum()
    loss.backward()
    return loss.detach()


# ---- demo ----------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    """GPT-2-style transformer: inference and AdamW steps, neuron beside eager."""
    import torch

    import neuron_compile

    from .models import GPTConfig, TinyGPT

    neuron_compile.reset()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(n_layer=args.layers)
    eager = TinyGPT(cfg)
    mine = copy.deepcopy(eager)
    compiled = torch.compile(mine, backend="neuron")
    batch, seq = 4, 32
    if not args.json:
        params = sum(p.numel() for p in eager.parameters())
        print(f"{PROG} demo: GPT-2-style transformer, {cfg.n_layer} layers, {cfg.n_embd} wide, {cfg.n_head} heads, "
              f"vocab {cfg.vocab_size}, {params / 1e3:.0f}k parameters (random weights), batch {batch} x {seq} tokens")

    # inference: logits, neuron beside eager
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    with torch.no_grad():
        want = eager(ids)
        start = time.perf_counter()
        got = compiled(ids)
        infer_first = time.perf_counter() - start
    logits_diff = (got - want).abs().max().item()

    # training: forward + backward compiled, AdamW steps eager on both copies
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=args.lr)
    opt_mine = torch.optim.AdamW(mine.parameters(), lr=args.lr)
    rows, times_eager, times_mine = [], [], []
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))  # one batch, so the loss visibly falls
    for step in range(args.steps):
        losses = []
        for model, opt, times in ((eager, opt_eager, times_eager), (compiled, opt_mine, times_mine)):
            start = time.perf_counter()
            loss = model(ids, labels=ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        rows.append((step, losses[0], losses[1], abs(losses[0] - losses[1])))

    worst = max([logits_diff] + [r[3] for r in rows])
    ok = worst <= args.tol
    reports = neuron_compile.compile_reports()
    summary = {
        "model": {"layers": cfg.n_layer, "width": cfg.n_embd, "heads": cfg.n_head, "vocab": cfg.vocab_size,
                  "batch": batch, "seq": seq},
        "inference_logits_max_abs_diff": logits_diff,
        "inference_first_call_s": infer_first,
        "steps": [{"step": s, "eager_loss": e, "neuron_loss": n, "abs_diff": d} for s, e, n, d in rows],
        "max_abs_diff": worst,
        "tolerance": args.tol,
        "ok": ok,
        "first_train_step_s": times_mine[0] if times_mine else None,
        "steady_train_step_ms": {"neuron": _median(times_mine[1:]) * 1e3 if len(times_mine) > 1 else None,
                                 "eager": _median(times_eager[1:]) * 1e3 if len(times_eager) > 1 else None},
        "compile_reports": [r.as_dict() for r in reports],
    }
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        from tabulate import tabulate

        print(f"\ninference: max |logits neuron - eager| = {logits_diff:.2e}  (first call, compile included: "
              f"{infer_first:.1f} s)")
        print(f"\ntraining: {args.steps} AdamW steps (lr {args.lr}), forward + backward through the neuron backend\n")
        print(tabulate(rows, headers=["step", "eager loss", "neuron loss", "|diff|"], floatfmt=("d", ".6f", ".6f", ".2e")))
        if len(times_mine) > 1:
            print(f"\nfirst neuron step {times_mine[0]:.1f} s (compiles forward and backward); steady step "
                  f"{summary['steady_train_step_ms']['neuron']:.1f} ms neuron vs "
                  f"{summary['steady_train_step_ms']['eager']:.1f} ms eager")
        print("\ncompile report (per graph and stage):\n")
        print(neuron_compile.format_table(reports))
        verdict = "OK" if ok else "MISMATCH"
        print(f"\n{verdict}: max |neuron - eager| = {worst:.2e} (tolerance {args.tol:g})")
    if not ok:
        print(_fail_paragraph(f"the neuron backend disagrees with eager: max abs difference {worst:.2e} is above "
                              f"the tolerance {args.tol:g}."), file=sys.stderr)
        return 1
    return 0


def _median(values):
    values = sorted(values)
    if not values:
        return float("nan")
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# ---- argument parsing --------------------------------------------------------------------------

def _command(sub, name: str, help: str, example: str, description: str | None = None):
    parser = sub.add_parser(
        name, help=help,
        description=textwrap.dedent(description or help),
        epilog="example:\n  " + example.strip().replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Offline tools for the neuron torch.compile backend: stage dumps, ahead-of-time compiles, "
                    "cache care, compile-time benchmarks.",
        epilog="example:\n  neuron-compile demo\n  neuron-compile dump mlp --out /tmp/dump\n\n"
               "exit codes: 0 success, 1 compile failure, 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(sub, "demo", "train a small GPT-2-style transformer through the neuron backend beside eager",
                 "neuron-compile demo --steps 5",
                 """\
                 Build a small GPT-2-style transformer (random weights, no download), run
                 inference and a few AdamW training steps through torch.compile(backend="neuron")
                 beside eager, print the losses side by side and the per-stage compile report.
                 Exits 1 when neuron and eager disagree beyond --tol.""")
    p.add_argument("--steps", type=int, default=5, help="AdamW steps (default 5)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--tol", type=float, default=1e-3, help="largest allowed |neuron - eager| (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=cmd_demo)

    return parser


def _version() -> str:
    try:
        from . import __version__

        return __version__
    except Exception:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code or 0)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    return run(args)


def run(args) -> int:
    from .specs import SpecError

    try:
        return args.run(args)
    except (UsageError, SpecError) as exc:
        _print_err(str(exc))
        return 2
    except CompileFailure as exc:
        _print_err(str(exc))
        return 1
    except KeyboardInterrupt:
        _print_err("interrupted.")
        return 130
    except Exception as exc:  # a compile failure somewhere in torch.compile
        if os.environ.get("NEURON_COMPILE_TRACEBACK"):
            raise
        inner = _unwrap(exc)
        from .lowering import LoweringError

        if isinstance(inner, LoweringError):
            _print_err(str(inner))
        else:
            _print_err(f"compile failed with {type(inner).__name__}: {inner}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
