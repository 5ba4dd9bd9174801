"""The compile cache's disk level: artifacts sharded, locked and capped under one folder.

The level above it, in memory with single flight per key, is ``runtime.compile_cache``.

Generic: keys in (``runtime.cache_key.CacheKey``), artifacts out
(``runtime.artifact``). The caller supplies two keys:

* a *front* key, cheap to compute before any lowering (``neuron_compile`` uses
  the FX graph and its input signature, like Inductor's FX graph cache); an
  index entry maps it to
* a *content* key, known after lowering (the StableHLO with locations
  stripped), under which the artifact is stored. Two FX graphs that lower to
  the same StableHLO share one artifact.

``runtime.compile_cache.CompileCache.get(front, lower)`` walks both levels under the two keys.

Disk layout under the cache folder (created 0700)::

    artifacts/<2 hex>/<content digest>.ncart   one artifact (runtime.artifact format)
    index/<2 hex>/<front digest>.json          {"artifact": content digest, "parts": {...}, ...}
    locks/<digest>.lock                        one inter-process lock per key (filelock)
    stats.json                                 cumulative counters of every process (a process adds
                                               its own at most once a second, and at exit)

Never stale, never broken, never poisoned: writes go to a temp file in the
same folder and are renamed into place; a key's lock is taken and the cache
checked again before compiling; a broken entry (``ArtifactError``, or an
executable XLA will not load) is a miss with one warning and is deleted, then
replaced by the fresh compile; a failed compile raises before anything is
stored; a folder that cannot be created or written gives one warning and
compiling goes on without it; a folder owned by another user or writable by
group/others is refused with one warning (an artifact is machine code); above
``max_bytes`` the least recently used artifacts (by mtime, touched on every
hit) are evicted. A write does not list the folder each time (a cache of
thousands of eager-op artifacts took milliseconds a write to list): the folder's
size is counted when it is listed and kept up to date with this process's
writes, and it is listed again when that count passes the cap, or after
``RESCAN_EVERY`` writes (other processes write too), whichever comes first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
import warnings
from pathlib import Path

from .artifact import Artifact, ArtifactError, encode_artifact, read_artifact, read_manifest, write_atomic
from .cache_key import CacheKey

__all__ = ["DEFAULT_MAX_BYTES", "ArtifactCache", "CacheWarning"]

log = logging.getLogger("neuron_compile.cache")

DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB
ARTIFACT_SUFFIX = ".ncart"
LOCK_TIMEOUT_S = 600.0
_STALE_TEMP_S = 3600.0


# writes between two listings of the artifacts folder (``ArtifactCache.put``)
RESCAN_EVERY = 64
STATS_FLUSH_S = 1.0  # a process adds its counters to stats.json at most this often (and at exit)
_PENDING_STATS: dict = {}  # cache folder -> counters not yet in its stats.json
_STATS_FLUSHED: dict = {}  # cache folder -> time.monotonic() of its last flush
_STATS_LOCK = threading.Lock()


class CacheWarning(UserWarning):
    """The cache could not be used as asked (broken entry, unusable or unsafe folder); compiling goes on."""


def _warn(message: str) -> None:
    log.warning("%s", message)
    warnings.warn(message, CacheWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# disk level


class ArtifactCache:
    """Artifacts on disk, one file per content key, plus the front-key index."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(path)
        self.max_bytes = int(max_bytes)
        self._writable = True
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._bytes: int | None = None  # the artifacts' size when last listed, plus this process's writes
        self._writes = 0  # writes since the folder was last listed

    # -- paths --------------------------------------------------------------------------------
    def artifact_path(self, digest: str) -> Path:
        return self.root / "artifacts" / digest[:2] / f"{digest}{ARTIFACT_SUFFIX}"

    def index_path(self, digest: str) -> Path:
        return self.root / "index" / digest[:2] / f"{digest}.json"

    def _lock_path(self, digest: str) -> Path:
        return self.root / "locks" / f"{digest}.lock"

    # -- one warning per problem --------------------------------------------------------------
    def _warn_once(self, tag: str, message: str) -> None:
        with self._lock:
            if tag in self._warned:
                return
            self._warned.add(tag)
        _warn(message)

    # -- folder safety ------------------------------------------------------------------------
    def usable(self) -> bool:
        """Create the folder (0700) if needed and check it is safe; warns once if not.

        Checked on every use (a stat or two, nothing next to a compile): a folder
        whose permissions change while the process runs is refused from then on.
        """
        return self._check_folder()

    def _check_folder(self) -> bool:
        try:
            try:
                st = os.stat(self.root)
            except FileNotFoundError:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                st = os.stat(self.root)
        except OSError as exc:
            self._warn_once("folder", f"neuron_compile cache: cannot use {self.root} ({exc}); compiling without the disk cache")
            return False
        problem = _unsafe(st)
        if problem:
            self._warn_once("unsafe", f"neuron_compile cache: refusing {self.root}: {problem}; serialized executables are "
                                      f"machine code. Fix with `chmod 700 {self.root}` (as its owner) or choose "
                                      "another NEURON_COMPILE_CACHE_DIR; compiling without the disk cache")
            return False
        return True

    def _mkdir(self, folder: Path) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _write_failed(self, what: str, exc: OSError) -> None:
        self._writable = False
        self._warn_once("write", f"neuron_compile cache: cannot write {what} in {self.root} ({exc}); "
                                 "compiling goes on, results are not cached")

    # -- locks --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, digest: str):
        """Inter-process lock for one key; without one (read-only folder, timeout) we go on unlocked."""
        if not self.usable() or not self._writable:
            yield
            return
        import filelock

        path = self._lock_path(digest)
        try:
            self._mkdir(path.parent)
            lock = filelock.FileLock(str(path), timeout=LOCK_TIMEOUT_S, mode=0o600)
            lock.acquire()
        except filelock.Timeout:
            self._warn_once("timeout", f"neuron_compile cache: waited {LOCK_TIMEOUT_S:.0f}s for {path}; compiling anyway")
            yield
            return
        except OSError as exc:
            self._write_failed("a lock file", exc)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    # -- reading ------------------------------------------------------------------------------
    def _broken(self, path: Path, reason: str) -> None:
        self._warn_once(f"broken:{path}", f"neuron_compile cache: ignoring broken entry {path}: {reason}; recompiling")
        with contextlib.suppress(OSError):
            path.unlink()

    def _safe_file(self, path: Path) -> str | None:
        """Why an existing entry must not be trusted (owner, permissions, not a plain file), or None."""
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        problem = _unsafe(st, file=True) or _unsafe(os.stat(path.parent))
        return problem

    def load(self, digest: str) -> Artifact | None:
        """The artifact for a content key, or None (absent, broken: warned once and deleted, refused)."""
        if not self.usable():
            return None
        path = self.artifact_path(digest)
        try:
            problem = self._safe_file(path)
            if problem:
                self._warn_once(f"unsafe:{path}", f"neuron_compile cache: refusing {path}: {problem}")
                return None
            artifact = read_artifact(path)
        except FileNotFoundError:
            return None
        except ArtifactError as exc:
            self._broken(path, str(exc))
            return None
        except OSError as exc:
            self._warn_once(f"read:{path}", f"neuron_compile cache: cannot read {path}: {exc}")
            return None
        if artifact.manifest.get("key") != digest:
            self._broken(path, f"manifest key {artifact.manifest.get('key')!r} is not the file's key")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used = oldest mtime
        return artifact

    def discard(self, digest: str, reason: str) -> None:
        """An artifact that read fine but cannot be used (XLA will not load it): a broken entry."""
        self._broken(self.artifact_path(digest), reason)

    def lookup(self, front: str) -> str | None:
        """The content digest a front key's index entry points to, or None."""
        if not self.usable():
            return None
        path = self.index_path(front)
        try:
            problem = self._safe_file(path)
            if problem:
                self._warn_once(f"unsafe:{path}", f"neuron_compile cache: refusing {path}: {problem}")
                return None
            entry = json.loads(path.read_text())
            target = entry["artifact"]
            if not isinstance(target, str) or len(target) != 64:
                raise ValueError(f"bad artifact digest {target!r}")
            return target
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._broken(path, f"index entry unreadable: {exc}")
            return None

    # -- writing ------------------------------------------------------------------------------
    def put(self, digest: str, artifact: Artifact) -> int:
        """Store an artifact under its content key; returns the bytes written (0 when it could not be)."""
        if not self.usable() or not self._writable:
            return 0
        data = encode_artifact(artifact)
        path = self.artifact_path(digest)
        try:
            self._mkdir(path.parent)
            write_atomic(path, data)
        except OSError as exc:
            self._write_failed("an artifact", exc)
            return 0
        with self._lock:
            self._writes += 1
            if self._bytes is not None:
                self._bytes += len(data)
            due = self._bytes is None or self._bytes > self.max_bytes or self._writes >= RESCAN_EVERY
        if due:
            self._evict(keep=path)
        return len(data)

    def put_index(self, front: CacheKey, content_digest: str, graph: str = "") -> None:
        if not self.usable() or not self._writable:
            return
        entry = {"front": front.digest, "kind": front.kind, "artifact": content_digest, "graph": graph,
                 "parts": front.part_hashes(), "created": time.time()}
        path = self.index_path(front.digest)
        try:
            self._mkdir(path.parent)
            write_atomic(path, json.dumps(entry, sort_keys=True).encode())
        except OSError as exc:
            self._write_failed("an index entry", exc)

    def record(self, **increments) -> None:
        """Add to the cumulative counters in stats.json (best effort). Counted in memory and written at most
        once every ``STATS_FLUSH_S`` and at exit: its read-modify-write under a file lock cost every
        compile about 2 ms (an eager op's cold build is tens of milliseconds); ``stats()`` writes first."""
        if not increments or not self.usable() or not self._writable:
            return
        root = str(self.root)
        with _STATS_LOCK:
            first = root not in _PENDING_STATS
            pending = _PENDING_STATS.setdefault(root, {})
            for name, value in increments.items():
                pending[name] = pending.get(name, 0) + value
            due = time.monotonic() - _STATS_FLUSHED.get(root, float("-inf")) >= STATS_FLUSH_S
        if first:
            import atexit

            atexit.register(self.flush_stats)
        if due:
            self.flush_stats()

    def flush_stats(self) -> None:
        """Write this process's counters not yet in stats.json (under its lock)."""
        root = str(self.root)
        with _STATS_LOCK:
            pending = _PENDING_STATS.get(root)
            if not pending:
                return
            increments = dict(pending)
            pending.clear()
            _STATS_FLUSHED[root] = time.monotonic()
        if not self.usable() or not self._writable:
            return
        path = self.root / "stats.json"
        try:
            with self.lock("stats"):
                try:
                    totals = json.loads(path.read_text())
                except (OSError, ValueError):
                    totals = {}
                for name, value in increments.items():
                    totals[name] = totals.get(name, 0) + value
                write_atomic(path, json.dumps(totals, sort_keys=True).encode())
        except OSError as exc:
            self._write_failed("stats.json", exc)

    # -- eviction -----------------------------------------------------------------------------
    def _artifact_files(self) -> list[tuple[float, int, Path]]:
        files = []
        top = self.root / "artifacts"
        try:
            shards = list(os.scandir(top))
        except OSError:
            return files
        for shard in shards:
            try:
                for entry in os.scandir(shard.path):
                    if entry.name.endswith(ARTIFACT_SUFFIX):
                        st = entry.stat(follow_symlinks=False)
                        files.append((st.st_mtime, st.st_size, Path(entry.path)))
            except OSError:
                continue
        return files

    def _evict(self, keep: Path | None = None, max_bytes: int | None = None) -> int:
        limit = self.max_bytes if max_bytes is None else max_bytes
        files = self._artifact_files()
        total = sum(size for _, size, _ in files)
        removed = 0
        for _mtime, size, path in sorted(files, key=lambda f: f[0]):
            if total <= limit:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass  # another process evicted it
            except OSError:
                continue
            total -= size
            removed += 1
            log.debug("cache evict %s (%d bytes)", path.name, size)
        with self._lock:
            self._bytes, self._writes = total, 0
        return removed

    # -- the CLI's interface ------------------------------------------------------------------
    def stats(self) -> dict:
        self.flush_stats()
        files = self._artifact_files()
        index = list((self.root / "index").glob("*/*.json")) if self.root.is_dir() else []
        try:
            totals = json.loads((self.root / "stats.json").read_text())
        except (OSError, ValueError):
            totals = {}
        return {"path": str(self.root), "entries": len(files), "bytes": sum(s for _, s, _ in files),
                "max_bytes": self.max_bytes, "index_entries": len(index), "totals": totals}

    def entries(self) -> list[dict]:
        """One dict per artifact, most recently used first."""
        out = []
        for mtime, size, path in sorted(self._artifact_files(), key=lambda f: -f[0]):
            try:
                manifest = read_manifest(path)
            except (OSError, ArtifactError):
                manifest = {}
            out.append({"key": path.name[: -len(ARTIFACT_SUFFIX)], "path": str(path), "bytes": size,
                        "last_used": mtime, "graph": manifest.get("graph"), "created": manifest.get("created")})
        return out

    def verify(self) -> list[tuple[str, bool, str]]:
        """Check every artifact (checksum, format, key) and index entry; nothing is changed."""
        results = []
        for _mtime, _size, path in self._artifact_files():
            try:
                artifact = read_artifact(path)
                key = path.name[: -len(ARTIFACT_SUFFIX)]
                if artifact.manifest.get("key") != key:
                    results.append((str(path), False, "manifest key does not match the file name"))
                else:
                    results.append((str(path), True, "ok"))
            except (OSError, ArtifactError) as exc:
                results.append((str(path), False, str(exc)))
        for path in sorted((self.root / "index").glob("*/*.json")) if self.root.is_dir() else []:
            try:
                target = json.loads(path.read_text())["artifact"]
                ok = self.artifact_path(target).exists()
                results.append((str(path), ok, "ok" if ok else f"points to missing artifact {target[:16]}"))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                results.append((str(path), False, f"unreadable index entry: {exc}"))
        return results

    def clear(self) -> int:
        """Remove every artifact, index entry, lock and temp file; returns the artifacts removed."""
        removed = 0
        for sub in ("artifacts", "index", "locks"):
            folder = self.root / sub
            if not folder.is_dir():
                continue
            for path in sorted(folder.rglob("*"), reverse=True):
                try:
                    if path.is_dir() and not path.is_symlink():
                        path.rmdir()
                    else:
                        path.unlink()
                        removed += path.name.endswith(ARTIFACT_SUFFIX)
                except OSError:
                    pass
        with _STATS_LOCK:
            _PENDING_STATS.pop(str(self.root), None)
        with contextlib.suppress(OSError):
            (self.root / "stats.json").unlink()
        return removed

    def prune(self, max_bytes: int | None = None) -> int:
        """Evict LRU artifacts down to ``max_bytes`` (default: the cap), drop broken and dangling
        entries and stale temp files; returns the artifacts removed."""
        removed = 0
        for path, ok, _reason in self.verify():
            if not ok:
                with contextlib.suppress(OSError):
                    Path(path).unlink()
                    removed += path.endswith(ARTIFACT_SUFFIX)
        now = time.time()
        for sub in ("artifacts", "index"):
            for tmp in (self.root / sub).glob("*/.tmp-*") if self.root.is_dir() else []:
                with contextlib.suppress(OSError):
                    if now - tmp.stat().st_mtime > _STALE_TEMP_S:
                        tmp.unlink()
        removed += self._evict(max_bytes=max_bytes)
        return removed


def _unsafe(st: os.stat_result, file: bool = False) -> str | None:
    """Why a folder (or file) with this stat must not be trusted, or None."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        what = "file" if file else "folder"
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


# ---------------------------------------------------------------------------------------------
# memory level
