"""The device's persistent op index: from an eager op's signature to its executable, across processes.

The artifact cache is keyed by FX graph, so finding an op's executable in a
new process would mean tracing the op first (``make_fx`` under
functionalization: 20-100 ms per op, most of a warm start). The index maps
the signature itself (op, argument parts, our sources' fingerprint, the
toolchain) to what tracing would have told: the FX key, the plan, the input
signature, and how buffers and results map onto the op's arguments. A hit
goes straight to ``compiler.cached_executable``; if its artifact was evicted,
the op is traced and compiled again there, so a stale or missing entry costs
time and never a wrong result. Entries are pickles written to a temporary
file and renamed; an unreadable entry is a miss with a warning.

Folder: ``<cache_dir>/device-ops/``; ``NEURON_COMPILE_CACHE=0`` turns it off
with the rest of the cache.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
import warnings

log = logging.getLogger("neuron_compile")

FORMAT = 1


@functools.lru_cache(maxsize=1)
def _salt() -> str:
    from neuron_compile.runtime.cache_key import toolchain_parts

    from ..graph_keys import source_fingerprint
    from ..options import Options

    # the lowering option picks another executable for the same signature (its FX key says so)
    return repr((FORMAT, source_fingerprint(), sorted(toolchain_parts().items()), Options.resolve().lowering))


def _folder(options) -> str | None:
    if not options.cache:
        return None
    return os.path.join(options.cache_dir, "device-ops")


def entry_name(op, parts, floats=None) -> str:
    text = repr((str(op), parts, floats, _salt()))
    return hashlib.sha256(text.encode()).hexdigest()


def load(options, name: str):
    folder = _folder(options)
    if folder is None:
        return None
    path = os.path.join(folder, name[:2], name)
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a torn or foreign file: a miss, and say so
        warnings.warn(f"neuron: the device op index entry {path} is unreadable ({exc}); compiling the op again")
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    return entry


def store(options, name: str, entry: dict) -> None:
    folder = _folder(options)
    if folder is None:
        return
    directory = os.path.join(folder, name[:2])
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            pickle.dump({"format": FORMAT, **entry}, f)
        os.replace(tmp, os.path.join(directory, name))
    except OSError as exc:
        log.debug("device op index: could not store %s: %s", name, exc)
