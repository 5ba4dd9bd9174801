"""What both lowerings share: the MLIR context and pass runner, and what a failure tells the user.

Torch-MLIR's stages (``fx_to_stablehlo``) and the splice of JAX-lowered parts
(``splice``) parse and run pipelines in a torch-mlir context made by
``new_context`` (torch dialect and StableHLO passes registered; ``shared_context``
reuses one per thread);
``run_pipeline`` collects the diagnostics MLIR emits and raises
``_PipelineFailed`` with them.

A lowering that fails raises ``LoweringError``: the ATen op (``_matches``
finds its FX nodes), the user's source line (``user_source_line``, from the
node's stack trace), the stage, and the reproducer folder. ``repro`` re-runs
the saved pipeline on a reproducer folder (``neuron-compile repro DIR``).
``exception_chain`` and ``innermost_exception`` walk what Dynamo and Python
wrap around it. Nothing here imports the lowerings, so both can import it.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import torch

# what Dynamo traces in PyTorch's place
_OURS_TRACED = (str(Path(__file__).resolve().parent.parent / "capture") + os.sep,
                str(Path(__file__).resolve().parent.parent / "traced.py"))


class LoweringError(RuntimeError):
    """An FX graph could not be lowered to StableHLO.

    Attributes: ``op`` (ATen op name or None), ``source`` (user code line or
    None), ``repro_dir`` (folder holding graph.py and the failing .mlir).
    """

    def __init__(self, message: str, *, op: str | None, source: str | None, repro_dir: str | None, stage: str):
        super().__init__(message)
        self.op = op
        self.source = source
        self.repro_dir = repro_dir
        self.stage = stage


def exception_chain(exc: BaseException):
    """Every exception in ``exc``'s chain, depth first: Dynamo wraps backend errors
    (``inner_exception``), and Python chains them (``__cause__``, ``__context__``)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [getattr(e, "inner_exception", None), e.__cause__, e.__context__]


def innermost_exception(exc: BaseException) -> BaseException:
    """The end of ``exc``'s wrapped/caused chain: what actually went wrong."""
    while getattr(exc, "inner_exception", None) is not None or exc.__cause__ is not None:
        exc = getattr(exc, "inner_exception", None) or exc.__cause__
    return exc


def new_context():
    """A torch-mlir MLIR context with the torch dialect and StableHLO passes registered."""
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _stablehlo
    from torch_mlir.dialects import torch as torch_d

    _register_stablehlo_passes()
    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    _stablehlo.register_dialect(ctx)
    return ctx


_SHARED = threading.local()
_SHARED_USES = 64


def shared_context():
    """``new_context``'s context, reused by this thread for up to 64 lowerings: making one (the dialects
    registered) takes about 5 ms, a fifth of an eager op's lowering. A context keeps every type and
    attribute it uniqued (constants too) while it lives, hence the bound. One context per thread: a
    pipeline's diagnostic handler is attached to the context while it runs, and a pipeline given up on
    (``run_pipeline``'s timeout) leaves its handler attached for good, so it retires its thread's context."""
    entry = getattr(_SHARED, "entry", None)
    if entry is None or entry[1] >= _SHARED_USES:
        entry = _SHARED.entry = [new_context(), 0]
    entry[1] += 1
    return entry[0]


_PASSES_REGISTERED = False


def _register_stablehlo_passes():
    global _PASSES_REGISTERED
    if not _PASSES_REGISTERED:
        from torch_mlir._mlir_libs import _stablehlo

        _stablehlo.register_stablehlo_passes()
        _PASSES_REGISTERED = True


PIPELINE_TIMEOUT_S = 300.0
# the pipelines given up on: their threads still run (MLIR cannot stop a pass), so their context,
# module and pass manager must outlive them
_ABANDONED: list = []
_MAX_DIAGNOSTICS = 200
_NEVER = threading.Event()


def pipeline_timeout() -> float:
    """Seconds a pass pipeline may run (``NEURON_COMPILE_PIPELINE_TIMEOUT``; 0: no bound)."""
    text = os.environ.get("NEURON_COMPILE_PIPELINE_TIMEOUT", "").strip()
    if not text:
        return PIPELINE_TIMEOUT_S
    try:
        return max(0.0, float(text))
    except ValueError:
        raise ValueError(f"NEURON_COMPILE_PIPELINE_TIMEOUT={text!r}: give seconds (0: no bound)") from None


def run_pipeline(module, pipeline: str, *, timeout: float | None = None) -> list[str]:
    """Run an MLIR pass pipeline in place; returns the diagnostics, raises ``_PipelineFailed`` on
    failure, and when it has not finished after ``timeout`` seconds (default ``pipeline_timeout()``).

    The pipeline runs on a thread through the C API (``_mlir_capi``), the GIL released, so the
    caller can stop waiting. A pass that never finishes cannot be stopped: its thread stays until
    the process exits (parked at its next diagnostic, or busy on one core if it reports none), and
    the module is never touched again.
    """
    from torch_mlir.passmanager import PassManager

    from ._mlir_capi import run_pass_manager

    timeout = pipeline_timeout() if timeout is None else timeout
    diagnostics: list[str] = []
    abandoned = threading.Event()

    def collect(lines):
        if abandoned.is_set():
            # a looping pass that reports as it loops parks here for good, the GIL released: it
            # burns no core and takes no GIL from the process
            _NEVER.wait()
        if len(diagnostics) < _MAX_DIAGNOSTICS:
            diagnostics.extend(lines)

    with module.context:
        pm = PassManager.parse(pipeline)
    if not timeout:
        ok = run_pass_manager(pm, module.operation, collect)
    else:
        result = {}

        def work():
            result["ok"] = run_pass_manager(pm, module.operation, collect)

        thread = threading.Thread(target=work, name="neuron_compile-pass-pipeline", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            abandoned.set()
            _ABANDONED.append((module, pm, thread))
            _SHARED.entry = None  # its handler stays attached to the context: no later lowering uses it
            raise _PipelineFailed(
                f"the pass pipeline did not finish in {timeout:g} s (NEURON_COMPILE_PIPELINE_TIMEOUT): a pass "
                "loops", list(diagnostics), timed_out=True)
        ok = result.get("ok", False)
    if not ok:
        raise _PipelineFailed("Failure while executing pass pipeline", diagnostics)
    return diagnostics


class _PipelineFailed(Exception):
    def __init__(self, message, diagnostics, *, timed_out=False):
        super().__init__(message)
        self.diagnostics = diagnostics
        self.timed_out = timed_out


def _matches(node: torch.fx.Node, op: str) -> bool:
    name = getattr(node.target, "name", None)
    if not callable(name):
        return False
    full = name().replace("::", ".")  # e.g. "aten.squeeze.dims"
    base, want = full.split(".")[1], op.split(".")[1]
    return full == op or base == want or base.lstrip("_") == want.lstrip("_")


def user_source_line(node: torch.fx.Node) -> str | None:
    """The innermost 'File ..., line N' frame of a node's stack trace, with its code line (our own
    frames skipped: what Dynamo traced in place of a PyTorch function is not the user's line)."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    frames = [f for f in frames if not f[0].startswith(_OURS_TRACED)] or frames
    if not frames:
        return None
    path, line, func, code = frames[-1]
    return f'{path}:{line} in {func}: {code.strip()}'


def repro(directory: str | os.PathLike) -> str:
    """Re-run the failing pipeline on a saved reproducer folder; returns the diagnostics."""
    from torch_mlir import ir

    directory = Path(directory)
    pipeline = (directory / "pipeline.txt").read_text().strip()
    ctx = new_context()
    module = ir.Module.parse((directory / "input.mlir").read_text(), ctx)
    try:
        run_pipeline(module, pipeline)
    except _PipelineFailed as failed:
        return "\n".join(failed.diagnostics + [str(failed)])
    return "pipeline succeeded: the failure did not reproduce"
