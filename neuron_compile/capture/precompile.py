"""Precompile (``NEURON_COMPILE_PRECOMPILE=1``): what makes Dynamo's package safe to save and to load.

PyTorch's caching precompile saves Dynamo's package (guards and bytecode) and
AOTAutograd's graphs, so a new process skips both traces; ``backend`` turns it
on and bundles our ``NeuronOutputCode`` into it. This module holds what the
backend decides around that, each rule named after the PyTorch 2.13 behaviour
it works around:

* the tag (``_precompile_tag``: version, source fingerprint, the options that
  change what is compiled) under which AOTAutogradCache keys our graphs and
  which a load checks again; ``_user_options``, the options a load takes as
  saved; ``_save_precompiled``, the write after a new graph's first call;
* the functions our pre-autograd rewrites put in Dynamo's graph, vouched for
  to AOTAutogradCache (``_cacheable_rewrites``), and why it refused a graph
  (``_bypass_reason``);
* frames kept out of the package because the next process would crash
  loading them or never match them (``_refused_unloadable_package``:
  ``_misplaced_frame``, ``_unloadable_guard``), and frames run eagerly because
  PyTorch cannot save them at all (``_skip_unsaveable_frame``:
  ``_unsaveable_guard``), both read from the traced frame's guards
  (``_dropped_when_saved``: the guards PyTorch drops before saving);
* one warning, then a count, for the identity guards precompile drops
  (``_DroppedGuardsFilter``).

Nothing here imports the backend: ``backend`` imports this.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import torch
import torch.fx

from .._version import __version__
from ..report import COUNTERS
from ..options import Options

log = logging.getLogger("neuron_compile")


def _user_options(options: Options) -> dict:
    """The options that differ from the environment's now: those the user passed in code. A load
    takes these as saved and everything else from its own environment (a backend's options dict is
    not visible when a package loads: Dynamo never calls the backend)."""
    env = Options.resolve(None)
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(Options)
            if getattr(options, f.name) != getattr(env, f.name) and f.name not in _ENV_ONLY}


_ENV_ONLY = ("cache_dir", "cache_max_bytes", "dump_dir")  # where things go, not what is compiled


def _precompile_tag(options: Options) -> str:
    """What AOTAutograd's output depends on besides Dynamo's graph: our decomposition table and
    partitioner (our sources) and the options that change what is compiled. Part of
    AOTAutogradCache's key (``cache_key_tag``) and checked again when a package is loaded."""
    from ..graph_keys import source_fingerprint

    what = {f.name: getattr(options, f.name) for f in dataclasses.fields(Options) if f.name not in _ENV_ONLY}
    return f"neuron_compile {__version__} {source_fingerprint()[:16]} {what}"


def precompile_enabled() -> bool:
    return bool(torch._dynamo.config.caching_precompile)


_save_lock = threading.Lock()


def _save_precompiled() -> None:
    """Write Dynamo's packages (guards, bytecode, our bundled graphs) after a new graph first ran."""
    from torch._dynamo.precompile_context import PrecompileContext

    with _save_lock:
        try:
            PrecompileContext.save_to_dynamo_cache()
            COUNTERS["precompile_saves"] += 1
        except Exception as exc:  # a package that can't be written costs the next process a trace, no more
            log.warning("neuron_compile: could not save the precompiled package (%s: %s); the next process "
                        "traces again", type(exc).__name__, exc)


def _cacheable_rewrites() -> tuple:
    """Functions our pre-autograd rewrites put into Dynamo's graph: pure functions of their inputs."""
    from ..decompositions.pre_autograd import _embedding_bag_math, _sdpa_math

    return (_sdpa_math, _embedding_bag_math)


# Guard kinds caching precompile drops before it saves the rest (torch._dynamo.guards, 2.13).
_DROPPED_KINDS = {"ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION"}


def _unloadable_guard(output) -> str | None:
    """The first guard of Dynamo's frame ``output`` that PyTorch 2.13 would save but cannot load.

    Dynamo's guard pickler saves the objects guards start from by value, and a plain function
    among them by module and qualified name. A ``functools.wraps`` wrapper inside a decorator
    chain (every Hugging Face ``forward``) carries the qualified name of the function it wraps,
    which names another object, so the pickler saves a placeholder in its place. A guard that
    reaches through it (``L['func'].__closure__[3].cell_contents`` when the compiled frame is
    the outer wrapper) then raises ``AttributeError`` while the next process loads the package,
    inside its ``torch.compile``. Objects reached through a class or a named function are
    looked up afresh by the loading process and are fine. Returns that guard, described, or None.
    """
    import builtins
    import inspect
    import sys

    from torch._dynamo.guards import _get_closure_vars
    from torch._dynamo.source import AttrSource, ClosureSource

    def unnamable(value) -> bool:  # the pickler's "fqn mismatch"
        if not inspect.isfunction(value) or "<locals>" in value.__qualname__:
            return False
        found = sys.modules.get(value.__module__)
        if found is None:
            return False
        for part in value.__qualname__.split("."):
            found = getattr(found, part, None)
        return found is not value

    scope = {"L": output.local_scope, "G": output.global_scope, "__builtins__": builtins.__dict__}
    closure_vars = dict(_get_closure_vars())
    cache: dict = {}
    for guard in output.guards:
        if _dropped_when_saved(guard):
            continue
        chain = []
        source = guard.originating_source
        while source is not None:
            chain.append(source)
            source = getattr(source, "base", None)
        chain.reverse()  # from the local or global the guard starts at
        parent, by_value = None, True
        for depth, source in enumerate(chain):
            try:
                value = source.get_value(scope, closure_vars, cache)
            except Exception:  # a source only Dynamo's own code evaluates: stop following it
                break
            if depth:
                if isinstance(source, ClosureSource):  # a closure is saved only with a nested function
                    by_value = by_value and "<locals>" in getattr(parent, "__qualname__", "<locals>")
                elif isinstance(source, AttrSource) and value is not parent:  # instance attributes only
                    by_value = by_value and source.member in getattr(parent, "__dict__", {})
            if by_value and unnamable(value) and depth + 1 < len(chain):
                return (f"PyTorch 2.13 would save a guard it cannot load and crash that process: "
                        f"{guard.create_fn_name()} guard on {guard.name} reaches through "
                        f"{value.__module__}.{value.__qualname__}, a wrapper whose name belongs to another object")
            if not by_value:
                break
            parent = value
    return None


def _dropped_when_saved(guard) -> bool:
    """Whether caching precompile drops ``guard`` before saving the frame (PyTorch 2.13).

    It drops the kinds in ``_DROPPED_KINDS`` and every guard whose builder records a derived
    ``ID_MATCH``: the class, module, function and nn.Module checks
    (``CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES``) all build through
    ``id_match_unchecked``, except on ``type(x)``, where it checks ``TYPE_MATCH`` on ``x`` and
    records nothing. Guard types are derived only when guards are built, after the backend, so
    the rule is decided from the guard's kind and source.
    """
    from torch._dynamo.guards import CheckFunctionManager
    from torch._dynamo.source import TypeSource

    kind = guard.create_fn_name()
    if kind in _DROPPED_KINDS:
        return True
    return (kind in CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
            and not isinstance(guard.originating_source, TypeSource))


def _unsaveable_guard(output):
    """The first guard of Dynamo's frame ``output`` that PyTorch 2.13 would neither drop nor save, or None.

    An identity check on ``type(x)`` is not dropped (``_dropped_when_saved``) and cannot be saved
    (a compiled optimizer step: ``CLASS_MATCH`` on ``type(param)``). The serializer then bypasses
    the package and leaves no guard state, and Dynamo stops on ``AssertionError:
    check_fn.guards_state must not be None``, whatever the backend.
    """
    from torch._dynamo.guards import CheckFunctionManager

    for guard in output.guards:
        if guard.create_fn_name() in CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES \
                and not _dropped_when_saved(guard):
            return guard
    return None


def _traced_output():
    """The OutputGraph of the frame Dynamo is tracing, or None outside a trace (a test calling the
    backend directly)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    try:
        return InstructionTranslator.current_tx().output
    except Exception:
        return None


def _skip_unsaveable_frame(graph_id: int) -> None:
    """Raise Dynamo's SkipFrame, so the frame runs eagerly, when PyTorch 2.13 would stop the
    process saving it (``_unsaveable_guard``); the frame cannot be compiled without saving."""
    from torch._dynamo.exc import SkipFrame

    output = _traced_output()
    try:
        guard = _unsaveable_guard(output) if output is not None else None
    except Exception:  # Dynamo internals it reads moved: PyTorch decides, as before
        return
    if guard is None:
        return
    COUNTERS["precompile_skipped_frames"] += 1
    frame = guard.user_stack[-1] if guard.user_stack else None
    where = f" ({frame.filename}:{frame.lineno})" if frame else ""
    message = (f"neuron_compile: graph g{graph_id} runs eagerly: with precompile on, PyTorch 2.13 cannot save its "
               f"{guard.create_fn_name()} guard on {guard.name}{where} and stops with 'check_fn.guards_state must "
               f"not be None' (any backend). Set NEURON_COMPILE_PRECOMPILE=0 to compile it.")
    # A skipped frame's callees are traced next and often carry the same guard (an optimizer's
    # step, its functional form, its per-tensor loop): one warning per place in the source
    where = where or guard.name
    (log.debug if where in _SKIPPED_AT else log.warning)(message)
    _SKIPPED_AT.add(where)
    raise SkipFrame(message)


_SKIPPED_AT: set[str] = set()


def _misplaced_frame(output) -> str | None:
    """Why PyTorch 2.13 would install the frame being compiled in the wrong module, or None.

    A saved frame is installed, and its global guards checked, in the module its package entry
    names: for the compiled function itself, its ``__module__``. ``functools.wraps`` copies
    ``__module__`` from the function it wraps, so a wrapper made by a decorator from another
    module names the caller's module while its code reads the decorator's globals. The next
    process then either never matches the saved frame (a global guard raises KeyError: it traces
    again and saves one more entry, every time) or matches it and raises NameError on the
    ``__compiled_fn_...`` PyTorch installed in the wrong module.
    """
    import sys

    package = output.package
    if package is None:
        return None
    named = package._current_entry.python_module
    f_globals = output.root_tx.f_globals
    module = sys.modules.get(named)
    if module is not None and vars(module) is f_globals:
        return None
    code = output.root_tx.f_code
    return (f"PyTorch 2.13 would install the saved frame {code.co_name} ({code.co_filename}:{code.co_firstlineno}) "
            f"in module {named!r} while its code runs in {f_globals.get('__name__')!r} (functools.wraps copies "
            f"__module__ from the function it wraps), and the next process would crash with NameError or never "
            f"match it")


def _refused_unloadable_package(graph_id: int) -> bool:
    """Keep the frame being compiled out of precompile's package when the next process would crash
    loading it or never match it; True when it was kept out. Guards come from tracing, so they
    are known here."""
    output = _traced_output()
    if output is None:
        return False
    try:
        reason = _misplaced_frame(output) or _unloadable_guard(output)
    except Exception as exc:  # Dynamo internals it reads moved: saving unchecked could crash the next process
        reason = (f"its guards could not be checked ({type(exc).__name__}: {exc}), and a package that "
                  f"PyTorch 2.13 cannot load would crash that process")
    if reason is None:
        return False
    COUNTERS["precompile_bypasses"] += 1
    log.warning("neuron_compile: precompile will not save graph g%d, so a new process will trace it again: "
                "%s", graph_id, reason)
    output.bypass_package(f"neuron_compile: {reason}")
    return True


class _DroppedGuardsFilter(logging.Filter):
    """Caching precompile warns once per identity guard it drops: about 120 lines for a 4-layer GPT-2.
    Let the first through with what it means for the user, and count the rest
    (``precompile_dropped_guards`` in ``cache_stats()``)."""

    MESSAGE = "%s guard on %s is dropped with caching_precompile=True."

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        COUNTERS["precompile_dropped_guards"] += 1
        if COUNTERS["precompile_dropped_guards"] > 1:
            return False
        record.msg = (self.MESSAGE + " neuron_compile shows only this first one: caching precompile drops every "
                      "ID_MATCH, CLOSURE_MATCH, WEAKREF_ALIVE and DICT_VERSION guard, so a process that loads the "
                      "package does not check that submodules, closures and dicts are the same objects. Swapping "
                      "one after compiling needs precompile off. cache_stats() counts the dropped guards "
                      "(precompile_dropped_guards); TORCH_LOGS=guards lists them.")
        return True


_DROPPED_GUARDS_FILTER = _DroppedGuardsFilter()


def _summarize_dropped_guards() -> None:
    guards_log = logging.getLogger("torch._dynamo.guards")
    if _DROPPED_GUARDS_FILTER not in guards_log.filters:
        guards_log.addFilter(_DROPPED_GUARDS_FILTER)


def _bypass_reason(gm: torch.fx.GraphModule) -> str:
    """Why AOTAutogradCache refuses ``gm`` (its own check, asked again), in one line."""
    from torch._functorch._aot_autograd.autograd_cache import check_cacheable

    try:
        check_cacheable(gm)
    except Exception as exc:  # BypassAOTAutogradCache, or whatever else its check raised
        return " ".join(str(exc).split())
    return "TORCH_LOGS=+torch._functorch._aot_autograd.autograd_cache says why"
