"""The package layout (docs/architecture.md's "Layout"): every module imports, no import cycle,
``passes`` and ``runtime`` stand alone, and no file is too long to read.

The import graph is read from the sources with ``ast``: every ``import`` and
``from ... import`` anywhere in a module (function-level imports included, so
a lazy import that goes back up is a cycle too), relative imports resolved.
An edge goes to the module imported, and, since importing ``a.b.c`` runs
``a/__init__`` and ``a/b/__init__`` first, to each package above it that is
not already above the importer (those are initialized before the importer
runs). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``'s ``__init__``: a submodule taking a name its parent
package's ``__init__`` re-exports, while that ``__init__`` imports the
submodule, is a cycle.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the dotted name it installs as (pyproject's package-dir): passes/ and runtime/ stay at the
# repository's top and install under neuron_compile
PACKAGES = {"neuron_compile": "neuron_compile", "passes": "neuron_compile.passes", "runtime": "neuron_compile.runtime"}
MAX_LINES = 600

# Modules allowed over MAX_LINES, each with its reason.
LONG_MODULES: dict[str, str] = {}


def _modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """Dotted name -> source file, for every module of our three packages."""
    found = {}
    packages = packages if isinstance(packages, dict) else {p: p for p in packages}
    for folder, dotted in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((dotted, *parts))] = path
    return found


MODULES = _modules()


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _known(name: str, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``import a.b.c`` imports them all)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def _imports(name: str, modules: dict) -> set[str]:
    """The modules of ours that ``name`` imports, anywhere in its source."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found = _known(alias.name, modules)
                if found:
                    targets.add(found)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found = sub if sub in modules else _known(module, modules)
                if found:
                    targets.add(found)
    edges = set()
    above = set(_ancestors(name))
    for target in targets:
        edges.add(target)
        edges.update(a for a in _ancestors(target) if a not in above)
    edges.discard(name)
    return edges


def import_graph(modules: dict = MODULES) -> dict[str, set[str]]:
    return {name: _imports(name, modules) for name in modules}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first search meets (one per back edge), each as a list of modules."""
    cycles, state, path = [], {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder():
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _graph_of(tmp_path: Path, files: dict) -> dict[str, set[str]]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return import_graph(_modules(tmp_path, ("pkg",)))


def test_graph_reads_lazy_relative_and_parent_imports(tmp_path):
    graph = _graph_of(tmp_path, {
        "pkg/__init__.py": "from .sub import f\n",  # a package importing its submodule: fine
        "pkg/sub.py": "def f():\n    from . import g\n",  # a name of the parent's __init__: an edge to it
        "pkg/inner/__init__.py": "",
        "pkg/inner/leaf.py": "from ..sub import f\nimport pkg.other\n",
        "pkg/other.py": "from .inner import leaf\n",  # a submodule of a package: not the package's own init
    })
    assert graph["pkg"] == {"pkg.sub"}
    assert graph["pkg.sub"] == {"pkg"}
    assert graph["pkg.inner.leaf"] == {"pkg.sub", "pkg.other"}
    assert graph["pkg.other"] == {"pkg.inner", "pkg.inner.leaf"}
    assert find_cycles(graph) == [["pkg", "pkg.sub", "pkg"], ["pkg.inner.leaf", "pkg.other", "pkg.inner.leaf"]]


@pytest.mark.parametrize("package", ["neuron_compile.passes", "neuron_compile.runtime"])
def test_passes_and_runtime_never_import_neuron_compile(package):
    """They stand alone: nothing of neuron_compile but themselves (and the package above them, which
    importing them runs first)."""
    graph = import_graph()
    bad = {name: sorted(t for t in targets if t not in ("neuron_compile", package) and not t.startswith(package + "."))
           for name, targets in graph.items() if name == package or name.startswith(package + ".")}
    assert not {k: v for k, v in bad.items() if v}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.endswith("__main__")))
def test_every_module_imports(name):
    importlib.import_module(name)


def _unresolved_relative_imports(name: str, modules: dict) -> list[str]:
    """Relative imports of ``name`` (function-level ones included) whose module is not one of ours."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
            if module not in modules:
                bad.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''} ({module})")
    return bad


def test_lazy_imports_name_modules_that_exist():
    """A function-level import runs only when its function does: after a move, one left pointing at
    the old place fails at that call, long after every module imported fine."""
    bad = {name: found for name in MODULES if (found := _unresolved_relative_imports(name, MODULES))}
    assert not bad, bad


def test_modules_are_short_enough_to_read():
    long = {}
    for path in MODULES.values():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and rel not in LONG_MODULES:
            long[rel] = lines
    assert not long, f"over {MAX_LINES} lines (split it, or add it to LONG_MODULES with a reason): {long}"
    stale = [rel for rel in LONG_MODULES
             if not (ROOT / rel).is_file() or len((ROOT / rel).read_text().splitlines()) <= MAX_LINES]
    assert not stale, f"LONG_MODULES entries no longer needed: {stale}"


def test_fingerprint_exclusions_name_files():
    """``cache_key._NOT_IN_FINGERPRINT`` names files by path: a moved file must be renamed there."""
    from neuron_compile.graph_keys import _NOT_IN_FINGERPRINT, _our_sources

    names = {name for name, _ in _our_sources()}
    assert [p for p in sorted(_NOT_IN_FINGERPRINT) if p not in names] == []


def test_benchmarks_and_tests_import_modules_that_exist():
    """Benchmarks import our modules inside functions too (the OpInfo harness's worker): after a
    move, a stale path fails only when that benchmark runs."""
    import importlib.util

    bad = []
    for path in sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.split(".")[0] in ("passes", "runtime"):  # importable only from the repository's top
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name} (neuron_compile.{name})")
                elif name.split(".")[0] == "neuron_compile" and importlib.util.find_spec(name) is None:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not bad, bad


# The stages, top to bottom: a module imports only from its own layer and those below it
# (docs/architecture.md, "Stages and import rules"). neuron_compile's own __init__ is the public face, above them all.
LAYERS = [
    ("cli", ["neuron_compile.__main__", "neuron_compile.cli"]),
    ("device", ["neuron_compile.device"]),
    ("capture", ["neuron_compile.capture"]),
    ("bucketing", ["neuron_compile.bucketing"]),
    ("spine", ["neuron_compile.compiler", "neuron_compile.graph_keys", "neuron_compile.index_bounds",
               "neuron_compile.output_views", "neuron_compile.dump", "neuron_compile.structured_trace",
               "neuron_compile.profiling", "neuron_compile.dynamo_skips"]),
    ("kernels", ["neuron_compile.kernels"]),
    ("lowering", ["neuron_compile.lowering", "neuron_compile.decompositions"]),
    ("leaves", ["neuron_compile.options", "neuron_compile.report", "neuron_compile.traced",
                "neuron_compile._profiler_hooks", "neuron_compile._version"]),
    ("passes and runtime", ["neuron_compile.passes", "neuron_compile.runtime"]),
]


def layer_of(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "neuron_compile" and layer_of(m) is None] == []


def test_imports_go_down_the_stages():
    """compiler.py imports nothing of capture/, the device nothing of capture's bucketing... an arrow up
    (a lazy import in a function included) fails here."""
    up = [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
          for a, targets in import_graph().items() if a != "neuron_compile"
          for b in targets if b != "neuron_compile" and layer_of(b) < layer_of(a)]
    assert not up, "imports going up the stages:\n" + "\n".join(sorted(up))


def test_stage_check_sees_an_arrow_up(tmp_path):
    graph = _graph_of(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "from .high import f\n",
                                 "pkg/high.py": "def f():\n    from . import low\n"})
    ranks = {"pkg.high": 0, "pkg.low": 1}
    assert [(a, b) for a, ts in graph.items() for b in ts if b in ranks and a in ranks and ranks[b] < ranks[a]] \
        == [("pkg.low", "pkg.high")]


def test_installed_import_names_are_ours(tmp_path):
    """Installed, passes/ and runtime/ are neuron_compile.passes and neuron_compile.runtime: no top-level
    ``passes`` or ``runtime`` of ours that another distribution's module could shadow or be shadowed by.
    Run away from the repository's top, where the folders themselves would be importable."""
    import subprocess
    import sys

    code = ("import importlib.util, json, neuron_compile.passes, neuron_compile.runtime\n"
            "print(json.dumps({n: (s.origin if (s := importlib.util.find_spec(n)) else None) "
            "for n in ('passes', 'runtime', 'neuron_compile.passes', 'neuron_compile.runtime')}))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    found = json.loads(done.stdout.splitlines()[-1])
    ours = [n for n in ("passes", "runtime") if found[n] and Path(found[n]).resolve().is_relative_to(ROOT)]
    assert ours == [], f"top-level names installed from this repository: {ours}"
    assert Path(found["neuron_compile.passes"]).resolve() == ROOT / "passes" / "__init__.py"
    assert Path(found["neuron_compile.runtime"]).resolve() == ROOT / "runtime" / "__init__.py"


def test_pyproject_lists_every_package():
    """pyproject's ``packages`` is explicit (package-dir maps two of them): a new package folder
    missing from it would be left out of a wheel."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert set(config["packages"]) == folders
    assert config["package-dir"] == {"neuron_compile.passes": "passes", "neuron_compile.runtime": "runtime"}


ARCHITECTURE = ROOT / "docs" / "architecture.md"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def layout_rows(text: str) -> list[tuple[str, str]]:
    """(path, what it holds) of each table row in the page's "## Layout" section."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return [(m[1], m[2].strip()) for line in section.splitlines() if (m := _ROW.match(line))]


def test_layout_table_lists_every_module_once():
    """docs/architecture.md's layout table: one row per module file (a folder's row, ``pkg/``, is its
    ``__init__.py``), each saying what the file holds, and no row for a file that does not exist."""
    rows = layout_rows(ARCHITECTURE.read_text())
    covered = [path + "__init__.py" if path.endswith("/") else path for path, _ in rows]
    files = {path.relative_to(ROOT).as_posix() for path in MODULES.values()}
    problems = {
        "missing (add a row)": sorted(files - set(covered)),
        "no such file (remove the row)": sorted(set(covered) - files),
        "listed twice": sorted({p for p in covered if covered.count(p) > 1}),
        "no description": [path for path, what in rows if not what.strip(" |")],
    }
    assert not any(problems.values()), {k: v for k, v in problems.items() if v}


def test_layout_rows_reader():
    text = ("# T\n## Layout\n| file | what |\n| --- | --- |\n| `a/` | the package |\n| `a/b.py` | b's things |\n"
            "### More\n| `c.py` | | \n## Next\n| `d.py` | not in the layout |\n")
    assert layout_rows(text) == [("a/", "the package"), ("a/b.py", "b's things"), ("c.py", "")]

