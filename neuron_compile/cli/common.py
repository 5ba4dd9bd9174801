"""What every command shares: exit codes as exceptions, one-paragraph errors, JSON, loading and running a spec.

``UsageError`` exits 2 and ``CompileFailure`` 1 (``entry.run`` maps them);
``_fail_paragraph`` turns any message into the one paragraph a command prints
instead of a traceback; ``emit_json`` writes to the real stdout while
``--json`` sends everything else to stderr. ``_load`` reads a model spec
(``specs``), ``_backend_options`` checks ``--passes`` before anything
compiles (``_check_pipeline``), and ``_run_spec`` runs a compiled model on a
spec's inputs, inference or one training step. ``bench`` and the commands
import this module; it imports neither.
"""

from __future__ import annotations

import json
import os
import sys

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


def emit_json(args, value) -> None:
    """JSON goes to the real stdout; with --json, everything else a model prints goes to stderr."""
    print(json.dumps(value, indent=2, default=str), file=getattr(args, "stdout", None) or sys.stdout)


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
    elif os.environ.get("NEURON_COMPILE_PASSES"):
        _check_pipeline(os.environ["NEURON_COMPILE_PASSES"])
    return options


def _check_pipeline(spec: str) -> None:
    from ..compiler import resolve_pipeline
    from ..options import Options

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


def _run_spec(compiled, loaded, train: bool):
    import torch

    if train:
        return _train_step(compiled, loaded)
    with torch.no_grad():
        return loaded.call(compiled)
