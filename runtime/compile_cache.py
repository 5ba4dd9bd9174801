"""The compile cache's top level: in memory (single flight per key), then the disk (``runtime.cache``).

``CompileCache.get(front, lower)`` is the whole protocol::

    memory[front]                          -> "memory" (threads wait for an in-flight compile)
    disk index[front] -> artifact          -> "disk"
    lock(front); look again                -> "disk"
    pending = lower(); memory[content]     -> "memory"
    lock(content); disk artifact[content]  -> "disk"
    pending.compile(); store; index        -> "miss"

The caller supplies two keys: a *front* key, cheap to compute before any lowering, and the
*content* key its ``Pending`` knows after lowering (see ``runtime.cache``'s docstring).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from .artifact import Artifact, stablehlo_text
from .cache import ArtifactCache, log
from .cache_key import CacheKey
from .executor import XlaExecutable

__all__ = ["CacheResult", "CompileCache", "Loaded", "MemoryCache"]


class MemoryCache:
    """Loaded executables by digest; concurrent asks for a key being built wait for that one build.

    At most ``limit`` are kept: past it the older half is let go (an executable still in use stays alive
    where it is used; one asked for again is loaded from the disk level). Each XLA CPU executable holds
    3 to 10 memory mappings of its own, and a process may not hold more than vm.max_map_count of them
    (65,530 by default): a process that kept every executable it ever loaded reached that limit and
    crashed inside XLA."""

    def __init__(self, limit: int = 1024):
        self._lock = threading.Lock()
        self._done: dict[str, object] = {}
        self._inflight: dict[str, concurrent.futures.Future] = {}
        self.limit = limit

    def _bound(self) -> None:  # under the lock
        if len(self._done) > self.limit:
            for digest in list(self._done)[:len(self._done) // 2]:  # the oldest (dicts keep insertion order)
                del self._done[digest]

    def peek(self, digest: str):
        with self._lock:
            return self._done.get(digest)

    def put(self, digest: str, value) -> None:
        with self._lock:
            self._done[digest] = value
            self._bound()

    def clear(self) -> None:
        with self._lock:
            self._done.clear()

    def __len__(self) -> int:
        return len(self._done)

    def get_or_create(self, digest: str, create: Callable[[], object]) -> tuple[object, bool]:
        """(value, True) when this call built it, (value, False) when it was there or another thread built it.
        A failed build raises in the builder and in every waiter, and leaves nothing behind."""
        with self._lock:
            if digest in self._done:
                return self._done[digest], False
            future = self._inflight.get(digest)
            owner = future is None
            if owner:
                future = self._inflight[digest] = concurrent.futures.Future()
        if not owner:
            return future.result(), False
        try:
            value = create()
        except BaseException as exc:
            with self._lock:
                del self._inflight[digest]
            future.set_exception(exc)
            raise
        with self._lock:
            self._done[digest] = value
            del self._inflight[digest]
            self._bound()
        future.set_result(value)
        return value, True


# ---------------------------------------------------------------------------------------------
# the two levels together


class Pending(Protocol):
    """A lowered graph: its content key, and how to finish compiling it."""

    key: CacheKey

    def compile(self) -> tuple[Artifact, XlaExecutable]: ...


@dataclass
class Loaded:
    """A usable cache entry: the loaded executable and its manifest."""

    executable: XlaExecutable
    manifest: dict
    key: str  # content digest
    size: int = 0
    source: str = "miss"  # how it was first obtained in this process: "disk" or "miss"


@dataclass
class CacheResult:
    loaded: Loaded
    source: str  # "memory", "disk" or "miss"
    seconds_saved: float = 0.0
    bytes_written: int = 0
    bytes_read: int = 0


def _compile_seconds(manifest: dict) -> float:
    return float(sum(v for v in manifest.get("stages", {}).values() if isinstance(v, (int, float))))


class CompileCache:
    """Memory in front of disk; see the module docstring for the protocol."""

    def __init__(self, memory: MemoryCache, disk: ArtifactCache | None):
        self.memory = memory
        self.disk = disk

    def get(self, front: CacheKey, lower: Callable[[], Pending],
            check: Callable[[dict], str | None] | None = None) -> CacheResult:
        """The executable for ``front``; ``check(manifest)`` returns why a cached entry does not fit, or None."""
        start = time.perf_counter()
        box: dict = {}

        def build():
            result = self._from_disk_or_compile(front, lower, check)
            box["result"] = result
            return result.loaded

        loaded, built = self.memory.get_or_create(front.digest, build)
        if built:
            result = box["result"]
        else:
            result = CacheResult(loaded, "memory")
        if result.source != "miss":
            result.seconds_saved = max(0.0, _compile_seconds(result.loaded.manifest) - (time.perf_counter() - start))
        log.debug("cache %s %s -> %s (%s)", "miss" if result.source == "miss" else f"{result.source} hit",
                  front, result.loaded.key[:16], result.loaded.manifest.get("graph", ""))
        if self.disk is not None:
            self.disk.record(**{f"{result.source}_hits" if result.source != "miss" else "misses": 1},
                             compiles=int(result.source == "miss"), bytes_written=result.bytes_written,
                             compile_seconds_saved=round(result.seconds_saved, 6))
        return result

    def _load(self, digest: str, check) -> Loaded | None:
        artifact = self.disk.load(digest)
        if artifact is None:
            return None
        reason = check(artifact.manifest) if check else None
        if reason is None:
            try:
                executable = XlaExecutable.deserialize(artifact.executable, artifact.manifest.get("replicas", 1))
            except Exception as exc:  # jaxlib raises XlaRuntimeError on a foreign or damaged executable
                reason = f"XLA cannot load the executable: {str(exc)[:200]}"
        if reason is not None:
            self.disk.discard(digest, reason)
            return None
        # its StableHLO, decoded only if asked for (a fused run of eager ops is built from its kernels' modules)
        executable.source = functools.partial(stablehlo_text, Artifact(artifact.manifest, artifact.stablehlo))
        return Loaded(executable, artifact.manifest, digest, artifact.size, "disk")

    def _from_disk_or_compile(self, front: CacheKey, lower, check) -> CacheResult:
        disk = self.disk
        if disk is None or not disk.usable():
            return self._compile(front, lower(), None)
        loaded = self._indexed(front, check)
        if loaded is not None:
            return CacheResult(loaded, "disk", bytes_read=loaded.size)
        with disk.lock(front.digest):
            loaded = self._indexed(front, check)  # another process may have built it meanwhile
            if loaded is not None:
                return CacheResult(loaded, "disk", bytes_read=loaded.size)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("cache miss %s: %s", front, self.explain_miss(front))
            pending = lower()
            content = pending.key.digest
            known = self.memory.peek(content)
            if known is not None:
                disk.put_index(front, content, known.manifest.get("graph", ""))
                return CacheResult(known, "memory")
            with disk.lock(content):
                loaded = self._load(content, check)
                if loaded is not None:
                    disk.put_index(front, content, loaded.manifest.get("graph", ""))
                    self.memory.put(content, loaded)
                    return CacheResult(loaded, "disk", bytes_read=loaded.size)
                return self._compile(front, pending, disk)

    def _indexed(self, front: CacheKey, check) -> Loaded | None:
        content = self.disk.lookup(front.digest)
        if content is None:
            return None
        known = self.memory.peek(content)
        if known is not None:
            return known
        loaded = self._load(content, check)
        if loaded is not None:
            self.memory.put(content, loaded)
        return loaded

    def _compile(self, front: CacheKey, pending: Pending, disk: ArtifactCache | None) -> CacheResult:
        artifact, executable = pending.compile()  # raises on failure: nothing is stored
        content = pending.key.digest
        written = 0
        if disk is not None:
            written = disk.put(content, artifact)
            disk.put_index(front, content, artifact.manifest.get("graph", ""))
        loaded = Loaded(executable, artifact.manifest, content, written, "miss")
        self.memory.put(content, loaded)
        return CacheResult(loaded, "miss", bytes_written=written)

    def explain_miss(self, front: CacheKey, limit: int = 256) -> str:
        """Which parts differ from the nearest index entry of the same kind (the most recent ``limit`` looked at)."""
        folder = self.disk.root / "index"
        try:
            paths = sorted(folder.glob("*/*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
        except OSError:
            return "no index"
        best: tuple[int, list[str], str] | None = None
        for path in paths:
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if entry.get("kind") != front.kind:
                continue
            differ = front.diff(entry.get("parts", {}))
            if best is None or len(differ) < best[0]:
                best = (len(differ), differ, entry.get("graph", ""))
        if best is None:
            return "the cache holds no entry of this kind; key parts:\n" + front.describe()
        return f"nearest entry ({best[2] or 'unnamed'}) differs in {best[1]}; key parts:\n" + front.describe()
