"""Every ```python block of README.md and docs/*.md runs here, so a documented example cannot rot.

A small collector of our own rather than the ``pytest-markdown-docs`` plugin: the plugin collects
Markdown only when pytest is handed the ``.md`` files (our ``testpaths`` is ``tests``, and CI runs a
plain ``python -m pytest -q``) and, switched on, also runs the code fences of every docstring in
every ``.py`` file it collects, ours and the tests' alike. Here the pages are parametrized tests of
one file, so they run under the suite's own options (xdist's ``loadfile`` keeps them in one worker).

The rules, for whoever writes a page:

* a block fenced ```python is run, alone: its own imports, a tiny model (``nn.Linear``...), random
  weights, nothing downloaded; each block in a fresh namespace, in a temporary folder (a block may
  write files), after the suite's usual reset of Dynamo and our counters (``conftest._fresh_state``);
* a block that cannot run in the suite (it needs ``torchrun``, a GPU, the network, a Hugging Face
  checkpoint) is fenced ```text or ```bash, or, to keep Python highlighting, ```python notest: REASON
  (``notest`` as pytest-markdown-docs spells it, and a reason, which ``test_notest_blocks_say_why``
  requires);
* a traceback points at the page and its line (``docs/device.md``, line 42).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's top
    line: int  # 1-based line of the block's first source line
    info: str  # the fence's info string: "python", "python notest: needs torchrun"...
    source: str

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def notest(self) -> str | None:
        """The reason given after ``notest``, "" if none, None for a block that runs."""
        rest = self.info.split(None, 1)[1] if len(self.info.split()) > 1 else ""
        if not rest.startswith("notest"):
            return None
        return rest[len("notest"):].lstrip(" :").strip()


def fenced_blocks(text: str, page: str = "") -> list[Block]:
    """The fenced code blocks of a Markdown text (CommonMark's fences: three or more backticks or
    tildes, closed by at least as many of the same; indented ones, inside list items, dedented)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened or (opened["fence"][0] == "`" and "`" in opened["info"]):
            i += 1
            continue
        indent, fence = len(opened["indent"]), opened["fence"]
        body, j = [], i + 1
        while j < len(lines):
            closed = _FENCE.match(lines[j])
            if closed and closed["fence"][0] == fence[0] and len(closed["fence"]) >= len(fence) \
                    and not closed["info"].strip():
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        blocks.append(Block(page, i + 2, opened["info"].strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _page_blocks() -> list[Block]:
    found = []
    for path in PAGES:
        found += fenced_blocks(path.read_text(), path.relative_to(ROOT).as_posix())
    return found


BLOCKS = _page_blocks()
PYTHON = [b for b in BLOCKS if b.language in ("python", "py")]
RUN = [b for b in PYTHON if b.notest is None]


def run_block(block: Block) -> dict:
    """Run one block as a script of its own; its line numbers are the page's."""
    code = compile("\n" * (block.line - 1) + block.source, block.page, "exec")
    namespace = {"__name__": "__main__", "__file__": str(ROOT / block.page)}
    exec(code, namespace)
    return namespace


@contextlib.contextmanager
def kernels_kept():
    """The kernel registry as it was, after: what a block added goes, what it replaced or removed comes
    back (a block's ``unregister_kernel`` of a name it took over left no shipped kernel by that name)."""
    import neuron_compile.kernels.attention  # noqa: F401 - the shipped kernels register when imported:
    import neuron_compile.kernels.rms_norm  # noqa: F401 - here, before the snapshot, not inside a block
    from neuron_compile.kernels import kernels, unregister_kernel
    from neuron_compile.kernels.kernel_registry import add

    registered = kernels()
    try:
        yield
    finally:
        for name in set(kernels()) - registered.keys():
            unregister_kernel(name)
        for name, kernel in registered.items():
            if kernels().get(name) is not kernel:
                add(kernel)


@pytest.mark.parametrize("block", RUN, ids=[f"{b.page}:{b.line}" for b in RUN])
def test_python_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with kernels_kept():
        run_block(block)


def test_blocks_leave_the_shipped_kernels_registered(tmp_path, monkeypatch):
    """The pages' kernel blocks run, the shipped kernels are still there (the attention kernel a block's
    import registered was unregistered after it, and test_kernels.py failed later in the same worker)."""
    import dataclasses

    from neuron_compile.kernels import kernels, unregister_kernel
    from neuron_compile.kernels.kernel_registry import add

    monkeypatch.chdir(tmp_path)
    shipped = kernels()
    assert {"neuron::attention", "neuron::rms_norm"} <= shipped.keys(), sorted(shipped)
    with kernels_kept():  # a block that takes over a shipped name, then unregisters it
        add(dataclasses.replace(shipped["neuron::attention"], version="a block's"))
        unregister_kernel("neuron::attention")
    assert kernels()["neuron::attention"] is shipped["neuron::attention"]
    for block in [b for b in RUN if "register_kernel" in b.source or "kernels.attention" in b.source]:
        with kernels_kept():
            run_block(block)
    assert kernels() == shipped


def test_notest_blocks_say_why():
    silent = [f"{b.page}:{b.line}" for b in PYTHON if b.notest == ""]
    assert not silent, f"```python notest blocks need a reason (```python notest: needs torchrun): {silent}"


def test_pages_have_examples():
    """The collector finds the pages' blocks (a change to the fence syntax it reads would find none)."""
    pages = {b.page for b in RUN}
    assert "README.md" in pages and len(RUN) >= 20, sorted(pages)


def test_fence_reader():
    text = ("intro\n```python\nx = 1\n```\n* item\n\n  ```python notest: needs torchrun\n  y = 2\n"
            "    z = 3\n  ```\n~~~~text\n```\nnot closed by backticks\n~~~~\nsee ```inline``` code\n")
    blocks = fenced_blocks(text, "page.md")
    assert [(b.line, b.language, b.notest, b.source) for b in blocks] == [
        (3, "python", None, "x = 1\n"),
        (8, "python", "needs torchrun", "y = 2\n  z = 3\n"),
        (12, "text", None, "```\nnot closed by backticks\n"),
    ]
    with pytest.raises(ZeroDivisionError) as raised:
        run_block(Block("docs/x.md", 7, "python", "a = 1\nb = a / 0\n"))
    assert raised.traceback[-1].frame.code.path == "docs/x.md" and raised.traceback[-1].lineno + 1 == 8
