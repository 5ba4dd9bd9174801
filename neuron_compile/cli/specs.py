"""Model specs: how the CLI names a model.

A spec is one of

* ``path/to/file.py:factory``  a Python file and a function in it;
* ``package.module:factory``   an importable module and a function in it;
* a built-in name (``demo``, ``mlp``, ``cnn``, ``gpt<N>``): no file needed.

``factory()`` returns ``(model, example_inputs)``, where ``example_inputs`` is
a tuple (or list) of tensors, or a dict of keyword tensors (a lone tensor is
taken as a 1-tuple). ``load_spec`` checks all of that and turns every way it
can go wrong (no such file, an import that fails, a factory that raises or
returns the wrong thing) into a ``SpecError`` whose message says which and
how to fix it; the CLI prints it as one paragraph and exits 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch


class SpecError(ValueError):
    """A model spec that cannot be loaded; the message is for the user."""


@dataclass
class LoadedSpec:
    name: str
    model: Callable
    args: tuple
    kwargs: dict

    def call(self, model=None):
        return (self.model if model is None else model)(*self.args, **self.kwargs)

    def describe_inputs(self) -> str:
        parts = [f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}" for a in self.args]
        parts += [f"{k}={tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.kwargs.items()]
        return ", ".join(parts)


# ---- built-in specs: small, seeded, plain torch ---------------------------------------------

def demo(n_layer: int = 2, batch: int = 2, seq: int = 32):
    """The GPT-2-style demo transformer with token ids and labels (forward returns the causal-LM loss)."""
    from .models import GPTConfig, TinyGPT

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=n_layer)
    model = TinyGPT(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, {"input_ids": ids, "labels": ids.clone()}


def mlp():
    """A two-layer MLP, batch 8 x 32 features."""
    from .models import MLP

    torch.manual_seed(0)
    return MLP(), (torch.randn(8, 32),)


def cnn():
    """conv2d + BatchNorm + ReLU + max-pool + linear on 4 x 3 x 16 x 16 images (eval mode)."""
    from .models import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN().eval()
    return model, (torch.randn(4, 3, 16, 16),)


BUILTINS: dict[str, Callable] = {"demo": demo, "mlp": mlp, "cnn": cnn}
_GPT_DEPTH = re.compile(r"gpt(\d+)$")


def builtin_help() -> str:
    lines = [f"  {name:6} {fn.__doc__.splitlines()[0]}" for name, fn in BUILTINS.items()]
    lines.append("  gpt<N> the demo transformer with N layers (gpt2, gpt8, gpt32...)")
    return "\n".join(lines)


# ---- loading ----------------------------------------------------------------------------------

def _last_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno})"


def _import_file(path: Path):
    name = "neuron_compile_spec_" + re.sub(r"\W", "_", str(path.resolve()))
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SpecError(f"cannot import {path} as a Python file (is it a .py file?).")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _resolve_factory(spec: str) -> Callable:
    if spec in BUILTINS:
        return BUILTINS[spec]
    match = _GPT_DEPTH.match(spec)
    if match:
        depth = int(match.group(1))
        if not 1 <= depth <= 256:
            raise SpecError(f"model spec {spec!r}: the depth must be between 1 and 256 layers.")
        return lambda: demo(n_layer=depth)
    location, sep, attr = spec.rpartition(":")
    if not sep or not location or not attr:
        raise SpecError(
            f"model spec {spec!r} is neither a built-in name nor of the form path/to/file.py:factory or "
            f"package.module:factory. Built-in names: {', '.join(BUILTINS)}, gpt<N>."
        )
    looks_like_file = location.endswith(".py") or "/" in location or "\\" in location
    try:
        if looks_like_file:
            path = Path(location)
            if not path.is_file():
                raise SpecError(f"model spec {spec!r}: there is no file {location} (looked from {Path.cwd()}).")
            module = _import_file(path)
        else:
            module = importlib.import_module(location)
    except SpecError:
        raise
    except ModuleNotFoundError as exc:
        raise SpecError(f"model spec {spec!r}: cannot import {location}: {exc}.") from None
    except BaseException as exc:  # the user's module failed while importing
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise SpecError(
            f"model spec {spec!r}: importing {location} failed with {type(exc).__name__}: {exc}{_last_frame(exc)}."
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:12]
        raise SpecError(
            f"model spec {spec!r}: {location} has no attribute {attr!r}; its functions are: {', '.join(public) or 'none'}."
        )
    if not callable(factory):
        raise SpecError(f"model spec {spec!r}: {attr} is a {type(factory).__name__}, not a function.")
    return factory


def load_spec(spec: str) -> LoadedSpec:
    """Resolve a spec, call its factory, and check what it returned."""
    factory = _resolve_factory(spec)
    try:
        result = factory()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise SpecError(
            f"model spec {spec!r}: the factory raised {type(exc).__name__}: {exc}{_last_frame(exc)}. "
            "Fix the factory, then run the command again."
        ) from None
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a tuple of {len(result)} items" if isinstance(result, tuple) else f"an object of type {type(result).__name__}"
        raise SpecError(f"model spec {spec!r}: the factory must return (model, example_inputs), but it returned {got}.")
    model, inputs = result
    if not callable(model):
        raise SpecError(f"model spec {spec!r}: the model the factory returned is a {type(model).__name__}, not callable.")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, dict):
        bad = [k for k, v in inputs.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise SpecError(f"model spec {spec!r}: example_inputs is a dict, but {bad} are not str -> tensor entries.")
        return LoadedSpec(spec, model, (), dict(inputs))
    if isinstance(inputs, (tuple, list)):
        bad = [i for i, v in enumerate(inputs) if not isinstance(v, torch.Tensor)]
        if bad:
            raise SpecError(
                f"model spec {spec!r}: example_inputs must be a tuple of tensors or a dict of keyword tensors, "
                f"but items {bad} are not tensors ({', '.join(type(inputs[i]).__name__ for i in bad)})."
            )
        return LoadedSpec(spec, model, tuple(inputs), {})
    raise SpecError(
        f"model spec {spec!r}: example_inputs must be a tuple of tensors or a dict of keyword tensors, "
        f"not a {type(inputs).__name__}."
    )


def resize(spec: LoadedSpec, dim: int, size: int) -> LoadedSpec:
    """The same spec with dimension ``dim`` of every input that has it set to ``size``.

    Shrinking slices; growing tiles the existing values (token ids stay in range).
    """
    def one(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= dim:
            return t
        have = t.shape[dim]
        if size <= have:
            return t.narrow(dim, 0, size).contiguous()
        reps = [1] * t.dim()
        reps[dim] = -(-size // have)
        return t.repeat(*reps).narrow(dim, 0, size).contiguous()

    return LoadedSpec(spec.name, spec.model, tuple(one(a) for a in spec.args),
                      {k: one(v) for k, v in spec.kwargs.items()})
