"""The kernel registry: which hand-written lowering serves which name.

A ``Kernel`` is a function written in JAX (or a StableHLO module's text)
registered for a name:

* a composite kind made by our ``fuse`` pass, ``"neuron.<kind>"``
  (``neuron.rms_norm``, ``neuron.attention``...): the kernel replaces the
  composite's decomposition. It gets the composite's operands (JAX arrays, in
  the composite's order) and returns its results; ``match(site)`` may decline
  a composite it does not serve (``site`` carries the operand and result
  types and the default decomposition's text);
* a ``torch.library`` custom op, ``"ns::name"`` (or the op object): the kernel
  replaces the op's lowering. It gets the op's arguments in schema order
  (JAX arrays for tensors, Python values for the rest) and returns its
  results. ``backward(grad, *args)`` returns one gradient per tensor argument
  and makes the op trainable (``autograd``).

Kernels come from three places: ``register_kernel`` in code (a decorator), an
installed package's entry point in the ``neuron_compile.kernels`` group
(loaded lazily, at the first compile: its object is imported, and called if
it is a function, so a ``pip install`` is enough), and Hugging Face layers
whose forward calls a registered custom op (``hf``). Nothing here imports
JAX: registering costs a dict entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("neuron_compile")

ENTRY_POINT_GROUP = "neuron_compile.kernels"
COMPOSITE_PREFIX = "neuron."


class KernelError(RuntimeError):
    """A registered kernel could not serve its op or composite: the message names the kernel."""


@dataclass(frozen=True)
class Kernel:
    name: str  # "neuron.<kind>" or "ns::op"
    fn: Callable | None = None  # JAX function
    stablehlo: str | None = None  # composites: or a module's text whose @main takes the operands
    version: str = "1"
    backward: Callable | None = None  # custom ops: (grad, *args) -> one gradient per tensor argument
    match: Callable | None = None  # composites: site -> bool (False: the default lowering stays)
    origin: str = "code"  # where it came from: code, an entry point, a Hugging Face kernel repository
    digest: str = field(default="", compare=False)

    @property
    def is_composite(self) -> bool:
        return "::" not in self.name

    def fingerprint(self) -> str:
        """What goes into cache keys: the name, the version and the source of every function."""
        return f"{self.name}@{self.version}#{self.digest[:16]}"


def _source(obj) -> str:
    if obj is None:
        return ""
    if isinstance(obj, str):
        return obj
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):  # defined in a REPL or built at run time: its code object instead
        code = getattr(obj, "__code__", None)
        return repr((getattr(obj, "__qualname__", repr(obj)), code.co_code, code.co_consts)) if code else repr(obj)


def op_name(target) -> str:
    """``"ns::name"`` of a custom op given by name, ``CustomOpDef``, ``OpOverload`` or packet."""
    if isinstance(target, str):
        return target
    name = getattr(target, "_qualname", None)  # torch.library.custom_op's CustomOpDef
    if name:
        return name
    schema = getattr(target, "_schema", None)  # OpOverload
    if schema is not None:
        return schema.name
    qualified = getattr(target, "_qualified_op_name", None)  # OpOverloadPacket
    if qualified:
        return qualified
    raise TypeError(f"register_kernel: {target!r} is neither a composite name, an op name 'ns::op' nor a custom op")


_KERNELS: dict[str, Kernel] = {}
_LOCK = threading.Lock()
_DISCOVERED = False


def make_kernel(target, fn: Callable | None = None, *, version: str = "1", backward: Callable | None = None,
                match: Callable | None = None, stablehlo: str | None = None, origin: str = "code") -> Kernel:
    """A checked ``Kernel`` (``register_kernel`` in the package adds it and its op's autograd)."""
    name = op_name(target)
    if not name.startswith(COMPOSITE_PREFIX) and "::" not in name:
        raise KernelError(f"register_kernel({name!r}): a kernel serves a composite 'neuron.<kind>' "
                          "or a custom op 'namespace::name'")
    if (fn is None) == (stablehlo is None):
        raise KernelError(f"kernel {name!r}: give a JAX function or StableHLO text, exactly one")
    if stablehlo is not None and "::" in name:
        raise KernelError(f"kernel {name!r}: a custom op's kernel is a JAX function (StableHLO text serves composites)")
    if backward is not None and "::" not in name:
        raise KernelError(f"kernel {name!r}: a backward is for custom ops; a composite's gradient is "
                          "computed before the composite is formed")
    digest = hashlib.sha256("\0".join([_source(fn), _source(stablehlo), _source(backward),
                                       _source(match)]).encode()).hexdigest()
    return Kernel(name, fn, stablehlo, str(version), backward, match, origin, digest)


def add(kernel: Kernel) -> None:
    with _LOCK:
        _KERNELS[kernel.name] = kernel


def unregister_kernel(target) -> None:
    """Forget a kernel (tests; a custom op's autograd registration stays)."""
    with _LOCK:
        _KERNELS.pop(op_name(target), None)


def discover() -> None:
    """Load the installed packages' kernels (entry-point group ``neuron_compile.kernels``), once."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(point.dist, "name", "?") if getattr(point, "dist", None) else "?"
        with _LOCK:
            before = dict(_KERNELS)
        try:
            loaded = point.load()
            if callable(loaded) and not inspect.ismodule(loaded):
                loaded()
        except Exception as exc:  # noqa: BLE001 - one broken package must not stop every compile
            log.warning("neuron_compile: the kernel package %s (entry point %r = %r in group %s) failed to load "
                        "and is skipped: %s: %s. Reinstall or uninstall it.", dist, point.name, point.value,
                        ENTRY_POINT_GROUP, type(exc).__name__, exc)
            continue
        with _LOCK:  # what it registered says where it came from (explain shows it)
            for name, kernel in _KERNELS.items():
                if before.get(name) is not kernel:
                    _KERNELS[name] = dataclasses.replace(kernel, origin=f"entry point {point.name} of {dist}")


def rediscover() -> None:
    """Read the entry points again (after installing a kernel package in this process)."""
    global _DISCOVERED
    _DISCOVERED = False
    discover()


def kernels() -> dict[str, Kernel]:
    """Every registered kernel by name, entry points loaded."""
    discover()
    with _LOCK:
        return dict(_KERNELS)


def lookup(name: str) -> Kernel | None:
    with _LOCK:
        return _KERNELS.get(name)


def composite_kernels() -> list[Kernel]:
    discover()
    with _LOCK:
        return [k for k in _KERNELS.values() if k.is_composite]
