"""README.md and docs/*.md point at what exists: links (and their #anchors) resolve, the files they
name in backticks are in the repository, and docs/reference.md's table has every option and every
environment variable of ours that the code reads. (Their Python blocks run in test_docs_examples.py;
the layout table is checked in test_layout.py.)"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [*(ROOT / "neuron_compile").rglob("*.py"), *(ROOT / "passes").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCED = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.S | re.M)
_NAMED_FILE = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|md|json|mlir|png|toml))`")


def _prose(path: Path) -> str:
    """The page without its fenced blocks (code may name files the reader makes)."""
    return _FENCED.sub("", path.read_text())


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {github_anchor(line.lstrip("#")) for line in _prose(path).splitlines() if line.startswith("#")}


def _repository_files() -> tuple[set[str], set[str]]:
    """Every file of the working tree (from its top) and every folder name in it."""
    files, folders = set(), set()
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")]
        folders.update(dirs)
        files.update(Path(folder, f).relative_to(ROOT).as_posix() for f in names)
    return files, folders


def test_links_resolve():
    bad = []
    for page in PAGES:
        for target in _LINK.findall(_prose(page)):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            if not resolved.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_named_files_exist():
    """A path in backticks (`device/op_queue.py`, `benchmarks/results/device.md`) that starts with one
    of our folders' names is a file of the repository, named from the top or from any folder above it:
    after a move, the page says so. (`torchtitan/train.py`, another project's file, is not checked.)"""
    files, folders = _repository_files()
    bad = []
    for page in PAGES:
        for name in _NAMED_FILE.findall(_prose(page)):
            if name.split("/")[0] not in folders:
                continue
            if not any(f == name or f.endswith("/" + name) for f in files):
                bad.append(f"{page.relative_to(ROOT)}: {name}")
    assert not bad, "\n".join(bad)


def test_anchor_of_a_heading():
    assert github_anchor("`torch.compile` on neuron tensors") == "torchcompile-on-neuron-tensors"
    assert github_anchor("Precompile: skipping Dynamo") == "precompile-skipping-dynamo"
    assert github_anchor("`TORCH_TRACE` and `tlparse`") == "torch_trace-and-tlparse"


def test_reference_lists_every_option_and_variable():
    from neuron_compile.options import ALIASES, Options

    table = "\n".join(line for line in (ROOT / "docs" / "reference.md").read_text().splitlines()
                      if line.startswith("| `"))
    names = {f"`{field.name}`" for field in dataclasses.fields(Options)}
    for source in SOURCES:
        names.update(f"`{v}`" for v in re.findall(r"\b((?:NEURON|TORCH_NEURONX)_[A-Z0-9_]*[A-Z0-9])\b",
                                                   source.read_text()))
    names.update(f"`{v}`" for pair in ALIASES.items() for v in pair)
    missing = sorted(name for name in names if name not in table)
    assert not missing, f"docs/reference.md's table lacks {missing}"
