"""The compile cache in one process: keys, broken entries, failed compiles, unusable and unsafe folders, eviction.

Every test gets its own empty cache folder (the ``fresh_cache`` fixture sets
NEURON_COMPILE_CACHE_DIR under tmp_path), never the user's. Tests run as
root here, and root writes through chmod 0o500, so a read-only folder is
simulated by a cache path *under a regular file* (mkdir fails as it would on
a read-only mount) or by making the cache's writes raise EROFS / ENOSPC.
"""

import errno
import json
import os
import threading
import time
import warnings

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compile
import neuron_compile.runtime.cache_key
import neuron_compile.runtime.executor
from neuron_compile import COUNTERS
from neuron_compile.graph_keys import fx_cache_key, stablehlo_cache_key, strip_debug_locations
from neuron_compile.runtime.artifact import FORMAT_VERSION, Artifact, read_artifact
from neuron_compile.runtime.cache import ArtifactCache, CacheWarning
from neuron_compile.runtime.compile_cache import MemoryCache
from neuron_compile.runtime.cache_key import CacheKey
from neuron_compile.runtime.executor import XlaCompileError, XlaExecutable


class MLP(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.fc1 = nn.Linear(width, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def run_compiled(model, x):
    """A first call in a 'new process' as far as our in-memory state goes (Dynamo and memory cache reset)."""
    torch._dynamo.reset()
    neuron_compile.reset()
    with torch.no_grad():
        out = torch.compile(model, backend="neuron")(x)
        torch.testing.assert_close(out, model(x))
    return neuron_compile.compile_reports()[-1]


def artifacts(folder):
    return sorted(folder.glob("artifacts/*/*.ncart"))


def cache_warnings(record):
    return [w for w in record if issubclass(w.category, CacheWarning)]


# ---------------------------------------------------------------------------------------------
# keys


def traced(fn, *shapes, dtype=torch.float32):
    return make_fx(fn, tracing_mode="fake")(*[torch.randn(s, dtype=dtype) for s in shapes])


def f_relu(x, w):
    return torch.relu(x @ w)


def f_tanh(x, w):
    return torch.tanh(x @ w)


def test_same_inputs_same_key():
    a = fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")
    b = fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")
    assert a.digest == b.digest and a.diff(b.part_hashes()) == []


def test_same_graph_other_names_same_key():
    def other_names(inputs, weights):  # another function, other variable names, other source line
        product = inputs @ weights
        return torch.relu(product)

    assert fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default").digest == \
        fx_cache_key(traced(other_names, (4, 8), (8, 2)), "default").digest


def test_each_part_changed_gives_a_new_key(monkeypatch):
    base = fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")

    def changed(key):
        assert key.digest != base.digest
        return key.diff(base.part_hashes())

    assert changed(fx_cache_key(traced(f_tanh, (4, 8), (8, 2)), "default")) == ["fx_graph"]
    assert "input_signature" in changed(fx_cache_key(traced(f_relu, (4, 9), (9, 2)), "default"))
    assert "input_signature" in changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2), dtype=torch.float64), "default"))
    assert changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "none")) == ["pass_pipeline"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")) == ["xla_compile_options"]
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(neuron_compile.runtime.cache_key, "tool_versions", lambda: {"torch": "9.9", "jaxlib": "9.9"})
    assert changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")) == ["tool_versions"]
    monkeypatch.undo()
    monkeypatch.setattr(neuron_compile.runtime.executor, "platform_description", lambda: {"platform": "neuron", "device_kind": "trn2"})
    assert changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")) == ["platform"]
    monkeypatch.undo()
    monkeypatch.setattr("neuron_compile.graph_keys.source_fingerprint", lambda: "edited lowering")
    assert changed(fx_cache_key(traced(f_relu, (4, 8), (8, 2)), "default")) == ["neuron_compile"]


def test_stablehlo_key_ignores_locations_and_explains_itself():
    text = 'func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.abs %a : tensor<2xf32> loc("x.py":3:1)\n' \
           '  return %0 : tensor<2xf32> loc(#loc2)\n} loc(unknown)\n#loc2 = loc("y.py":9:4)\n'
    plain = strip_debug_locations(text)
    assert "loc" not in plain
    a = stablehlo_cache_key(text, ["float32[2]s[1]"], "canonicalize")
    b = stablehlo_cache_key(plain.replace("y.py", "z.py"), ["float32[2]s[1]"], "canonicalize")
    assert a.digest == b.digest
    c = stablehlo_cache_key(plain.replace("abs", "negate"), ["float32[2]s[1]"], "canonicalize")
    assert c.diff(a.part_hashes()) == ["stablehlo"]
    described = c.describe()
    for part in ("stablehlo", "input_signature", "pass_pipeline", "tool_versions", "platform", "xla_compile_options"):
        assert part in described
    assert CacheKey.build("fx", {"x": 1}).digest != CacheKey.build("stablehlo", {"x": 1}).digest


# ---------------------------------------------------------------------------------------------
# hits and misses


def test_miss_then_disk_hit_then_memory_hit(fresh_cache):
    model, x = MLP().eval(), torch.randn(8, 16)
    assert run_compiled(model, x).cache == "miss"
    assert COUNTERS["xla_compiles"] == 1 and COUNTERS["lowerings"] == 1 and COUNTERS["bytes_written"] > 0
    assert len(artifacts(fresh_cache)) == 1
    assert oct(fresh_cache.stat().st_mode & 0o777) == "0o700"

    report = run_compiled(model, x)  # memory reset: from disk, no lowering, no compile
    assert report.cache == "disk"
    assert COUNTERS["xla_compiles"] == 0 and COUNTERS["lowerings"] == 0 and COUNTERS["disk_hits"] == 1

    # Same process, another model object of the same structure, traced again: the memory level.
    with torch.no_grad():
        torch._dynamo.reset()
        other = MLP().eval()
        torch.testing.assert_close(torch.compile(other, backend="neuron")(x), other(x))
    assert neuron_compile.compile_reports()[-1].cache == "memory"
    stats = neuron_compile.cache_stats()
    assert stats["process"]["disk_hits"] == 1 and stats["process"]["memory_hits"] == 1
    assert stats["disk"]["entries"] == 1 and stats["disk"]["totals"]["misses"] == 1
    assert stats["process"]["compile_seconds_saved"] > 0


def test_cache_off(fresh_cache, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE", "0")
    report = run_compiled(MLP().eval(), torch.randn(8, 16))
    assert report.cache == "" and COUNTERS["xla_compiles"] == 1
    assert not fresh_cache.exists()


def test_debug_log_line_per_hit_and_miss(fresh_cache, caplog):
    model, x = MLP().eval(), torch.randn(8, 16)
    with caplog.at_level("DEBUG", logger="neuron_compile.cache"):
        run_compiled(model, x)
        run_compiled(model, x)
    lines = [r.getMessage() for r in caplog.records if r.name == "neuron_compile.cache"]
    assert any(line.startswith("cache miss fx:") and "differs in" not in line for line in lines), lines
    assert any(line.startswith("cache disk hit fx:") for line in lines), lines


# ---------------------------------------------------------------------------------------------
# broken entries: a miss with one warning, replaced by a fresh compile


def _truncate(data):
    return data[: len(data) // 3]


def _flip(data):
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]


def _magic(data):
    return b"GARBAGE!" + data[8:]


def _version(data):
    return data[:8] + (FORMAT_VERSION + 1).to_bytes(4, "little") + data[12:]


@pytest.mark.parametrize("damage", [_truncate, _flip, _magic, _version])
def test_broken_artifact_is_a_miss_with_one_warning(fresh_cache, damage):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)
    [path] = artifacts(fresh_cache)
    path.write_bytes(damage(path.read_bytes()))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        report = run_compiled(model, x)  # compares with eager inside
    assert len(cache_warnings(record)) == 1, [str(w.message) for w in record]
    assert "broken entry" in str(cache_warnings(record)[0].message)
    assert report.cache == "miss" and COUNTERS["xla_compiles"] == 1
    read_artifact(path)  # replaced by a valid one
    assert run_compiled(model, x).cache == "disk"


def test_broken_index_entry_is_a_miss_with_one_warning(fresh_cache):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)
    [index] = fresh_cache.glob("index/*/*.json")
    index.write_text("{not json")
    with pytest.warns(CacheWarning, match="index entry") as record:
        report = run_compiled(model, x)
    assert len(cache_warnings(record)) == 1
    assert report.cache == "disk"  # the StableHLO-level key still finds the artifact, after lowering
    assert COUNTERS["lowerings"] == 1 and COUNTERS["xla_compiles"] == 0


def test_executable_xla_cannot_load_is_a_miss(fresh_cache, monkeypatch):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)

    def foreign(data):
        raise RuntimeError("INVALID_ARGUMENT: executable built for another platform")

    monkeypatch.setattr(XlaExecutable, "deserialize", staticmethod(foreign))
    with pytest.warns(CacheWarning, match="XLA cannot load"):
        assert run_compiled(model, x).cache == "miss"


def test_failed_compile_is_never_stored(fresh_cache, monkeypatch):
    model, x = MLP().eval(), torch.randn(8, 16)
    real = XlaExecutable.compile.__func__

    def failing(cls, text):
        raise XlaCompileError("simulated XLA failure")

    monkeypatch.setattr(XlaExecutable, "compile", classmethod(failing))
    with pytest.raises(Exception, match="simulated XLA failure"):
        run_compiled(model, x)
    assert artifacts(fresh_cache) == [] and list(fresh_cache.glob("index/*/*")) == []
    monkeypatch.setattr(XlaExecutable, "compile", classmethod(real))
    torch._dynamo.reset()  # keep the memory level: it must not remember the failure either
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
    assert neuron_compile.compile_reports()[-1].cache == "miss"
    assert len(artifacts(fresh_cache)) == 1


# ---------------------------------------------------------------------------------------------
# unusable and unsafe folders: compiling goes on, with one warning


def test_cache_folder_that_cannot_be_created(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(blocker / "cache"))  # mkdir fails, even for root
    with pytest.warns(CacheWarning, match="cannot use") as record:
        assert run_compiled(MLP().eval(), torch.randn(8, 16)).cache == "miss"
    assert len(cache_warnings(record)) == 1


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_read_only_or_full_folder(fresh_cache, monkeypatch, err):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)  # a warm entry, written before the folder "became" read-only / full

    def refuse(path, data, mode=0o600):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr("neuron_compile.runtime.cache.write_atomic", refuse)
    with pytest.warns(CacheWarning, match="cannot write") as record:
        assert run_compiled(model, x).cache == "disk"  # reading still works
        assert run_compiled(MLP(width=24).eval(), torch.randn(8, 24)).cache == "miss"
    assert len(cache_warnings(record)) <= 2  # one per process-level cache object at most
    assert len(artifacts(fresh_cache)) == 1


@pytest.mark.parametrize("how", ["world-writable", "other-owner"])
def test_unsafe_folder_is_refused(fresh_cache, how):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)
    if how == "world-writable":
        os.chmod(fresh_cache, 0o777)
    else:
        os.chown(fresh_cache, 12345, 12345)
    with pytest.warns(CacheWarning, match="refusing") as record:
        report = run_compiled(model, x)
    assert len(cache_warnings(record)) == 1
    assert report.cache == "miss" and COUNTERS["xla_compiles"] == 1


def test_unsafe_shard_folder_is_refused(fresh_cache):
    model, x = MLP().eval(), torch.randn(8, 16)
    run_compiled(model, x)
    [path] = artifacts(fresh_cache)
    os.chmod(path.parent, 0o777)
    with pytest.warns(CacheWarning, match="refusing"):
        assert run_compiled(model, x).cache == "miss"


# ---------------------------------------------------------------------------------------------
# eviction


def fake_artifact(n: int, size: int = 1000) -> tuple[str, Artifact]:
    digest = f"{n:02x}" * 32
    return digest, Artifact({"key": digest, "graph": f"g{n}"}, b"", bytes(size))


def test_eviction_keeps_the_most_recently_used(tmp_path):
    cache = ArtifactCache(tmp_path / "c", max_bytes=3500)
    digests = []
    for n in range(3):
        digest, artifact = fake_artifact(n)
        assert cache.put(digest, artifact) > 1000
        os.utime(cache.artifact_path(digest), (1000 + n, 1000 + n))  # distinct, ordered mtimes
        digests.append(digest)
    assert cache.load(digests[0]) is not None  # touch: now the most recently used
    digest, artifact = fake_artifact(3)
    cache.put(digest, artifact)
    kept = {e["key"] for e in cache.entries()}
    assert kept == {digests[0], digests[2], digest}, "the least recently used (1) goes first"
    assert cache.stats()["bytes"] <= 3500
    assert cache.prune(max_bytes=0) == 3
    assert cache.stats()["entries"] == 0


def test_a_write_lists_the_folder_only_when_the_cap_may_be_passed(tmp_path, monkeypatch):
    """Listing thousands of artifacts on every write cost an eager op's cold build milliseconds: the
    folder is listed on the first write, when this process's count passes the cap, and every
    RESCAN_EVERY writes (for what other processes wrote)."""
    import neuron_compile.runtime.cache as cache_module

    listings = []
    original = ArtifactCache._artifact_files
    monkeypatch.setattr(ArtifactCache, "_artifact_files", lambda self: listings.append(1) or original(self))
    monkeypatch.setattr(cache_module, "RESCAN_EVERY", 8)
    cache = ArtifactCache(tmp_path / "c", max_bytes=20_000)
    for n in range(8):
        cache.put(*fake_artifact(n))
    assert len(listings) == 1, "only the first write lists the folder while far under the cap"
    other = ArtifactCache(tmp_path / "c", max_bytes=20_000)  # another process fills the folder past the cap
    for n in range(8, 30):
        other.put(*fake_artifact(n))
    assert other.stats()["bytes"] <= 20_000
    listings.clear()
    cache.put(*fake_artifact(30))  # its 8th write since it listed: listed again, though its own count is low
    assert len(listings) == 1 and cache.stats()["bytes"] <= 20_000
    for n in range(31, 60):  # past the cap by this process's own count: listed, and the cap holds
        cache.put(*fake_artifact(n))
        assert cache.stats()["bytes"] <= 20_000


def test_cap_applies_to_compiles(fresh_cache, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_MAX_BYTES", "1")  # below one artifact: only the newest stays
    for width in (8, 16, 24):
        run_compiled(MLP(width).eval(), torch.randn(4, width))
    assert len(artifacts(fresh_cache)) == 1


# ---------------------------------------------------------------------------------------------
# the CLI's library interface


def test_cli_interface(fresh_cache):
    run_compiled(MLP().eval(), torch.randn(8, 16))
    run_compiled(MLP(24).eval(), torch.randn(8, 24))
    cache = ArtifactCache(fresh_cache)
    entries = cache.entries()
    assert len(entries) == 2 and {"key", "path", "bytes", "last_used", "graph"} <= entries[0].keys()
    assert entries[0]["graph"].endswith(".inference")
    assert all(ok for _, ok, _ in cache.verify())
    manifest = read_artifact(entries[0]["path"]).manifest
    for field in ("key", "key_parts", "fx_key", "inputs", "outputs", "pipeline", "versions", "platform", "stages",
                  "stablehlo"):
        assert field in manifest, field
    assert manifest["stablehlo"]["encoding"] == "portable-bytecode"
    assert set(manifest["versions"]) == {"neuron_compile", "torch", "torch-mlir", "jax", "jaxlib"}
    assert {"xla-compile", "passes"} <= manifest["stages"].keys()
    # damage one: verify reports it, prune removes it
    path = entries[1]["path"]
    with open(path, "r+b") as f:
        f.truncate(100)
    bad = [(p, reason) for p, ok, reason in cache.verify() if not ok]
    assert [p for p, _ in bad][:1] == [path] and "truncated" in bad[0][1]
    assert cache.prune() == 1
    stats = cache.stats()
    assert stats["entries"] == 1 and json.loads((fresh_cache / "stats.json").read_text())["misses"] == 2
    assert cache.clear() == 1 and cache.stats()["entries"] == 0


# ---------------------------------------------------------------------------------------------
# the memory level: one build per key, however many threads ask


def test_memory_single_flight():
    memory, calls = MemoryCache(), []

    def build():
        calls.append(1)
        time.sleep(0.2)
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(memory.get_or_create("k", build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len({id(v) for v, _ in results}) == 1 and sorted(built for _, built in results) == [False, False, False, True]


def test_memory_failed_build_is_not_remembered():
    memory = MemoryCache()
    with pytest.raises(ValueError):
        memory.get_or_create("k", lambda: (_ for _ in ()).throw(ValueError("compile failed")))
    assert memory.get_or_create("k", lambda: 42) == (42, True)


def test_a_report_names_where_a_compile_spent_its_time(monkeypatch):
    """Every part of a miss is a named stage: the lowering's own setup and the printing of the module apart
    from cache-io, which is left with the cache's reads, writes and locks. ``remainder`` gives a block's
    time less what its inner stages timed (a fake clock: no timing in the test)."""
    import neuron_compile.report as report_module

    clock = iter([0.0, 1.0, 3.0, 10.0])  # outer start, inner start, inner end, outer end
    monkeypatch.setattr(report_module.time, "perf_counter", lambda: next(clock))
    report = report_module.CompileReport(graph="g", kind="inference")
    with report.remainder("setup"):
        with report.stage("inner"):
            pass
    assert report.stages == {"inner": 2.0, "setup": 8.0}
    monkeypatch.undo()

    miss = run_compiled(MLP(), torch.randn(3, 16))
    assert miss.cache == "miss"
    assert {"lowering-setup", "mlir-print", "import", "xla-compile", "serialize", "cache-io"} <= miss.stages.keys()


def test_counters_reach_stats_json_at_most_once_a_second_all_of_them_by_stats_and_at_exit(tmp_path, monkeypatch):
    """stats.json's read-modify-write under its file lock ran on every compile (about 2 ms of an eager op's
    cold build): a process counts in memory, writes at most once every STATS_FLUSH_S, and in full when the
    counters are read (``stats()``) and at exit."""
    import subprocess
    import sys

    import neuron_compile.runtime.cache as cache_module

    cache = ArtifactCache(tmp_path / "c")
    written = []
    write = cache_module.write_atomic
    monkeypatch.setattr(cache_module, "write_atomic", lambda path, data, *a: (written.append(str(path)),
                                                                               write(path, data, *a)))
    for _ in range(50):
        cache.record(misses=1, compiles=1)
    assert sum(p.endswith("stats.json") for p in written) == 1  # the first; the rest within the second wait
    assert cache.stats()["totals"] == {"misses": 50, "compiles": 50}
    code = ("from neuron_compile.runtime.cache import ArtifactCache\n"
            f"cache = ArtifactCache({str(tmp_path / 'c')!r})\n"
            "for _ in range(3):\n    cache.record(misses=1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads((tmp_path / "c" / "stats.json").read_text())["misses"] == 53  # written at its exit
