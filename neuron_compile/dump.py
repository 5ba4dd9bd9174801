"""The dump folder: the compile chain of every graph written to disk, stage by stage.

Set ``NEURON_COMPILE_DUMP_DIR`` (or ``options={"dump_dir": ...}``, or use
``neuron-compile dump``) and each compiled graph gets a folder
``DIR/<process>/<graph>[-<n>]/`` holding, in order:

    00-fx-graph.py          the FX graph AOTAutograd handed us (readable code)
    01-torch.mlir           Torch-MLIR, torch backend form
    02-stablehlo.mlir       StableHLO before our passes
    03-pass-<i>-<name>.mlir StableHLO after each pass
    04-final.mlir           what XLA compiles
    report.json             the compile report (stages, counts, passes)
    manifest.json           the artifact manifest, when the cache wrote one

Writing is best effort: a dump that fails logs a warning and never fails the compile.
"""

from __future__ import annotations

import json
import keyword
import logging
import os
import re
import threading
from pathlib import Path

log = logging.getLogger("neuron_compile")

_SEQ_LOCK = threading.Lock()
_SEEN: dict[str, int] = {}


def process_folder(root: str | os.PathLike) -> Path:
    return Path(root) / f"pid{os.getpid()}"


class GraphDump:
    """Writes one graph's stages into its own folder."""

    def __init__(self, root: str | os.PathLike, graph_name: str):
        safe = re.sub(r"[^\w.-]", "_", graph_name)
        with _SEQ_LOCK:
            n = _SEEN.get(safe, 0)
            _SEEN[safe] = n + 1
        self.folder = process_folder(root) / (safe if n == 0 else f"{safe}-{n}")
        self.ok = True
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if self.ok:
            log.warning("neuron_compile: cannot write dumps to %s: %s", self.folder, exc)
        self.ok = False

    def write(self, name: str, text: str) -> None:
        if not self.ok:
            return
        if name.endswith(".py"):
            text = python_class_name(text)
        try:
            (self.folder / name).write_text(text)
        except OSError as exc:
            self._fail(exc)

    def write_json(self, name: str, value) -> None:
        self.write(name, json.dumps(value, indent=2, default=str) + "\n")


def python_class_name(code: str) -> str:
    """FX names re-traced graphs ``class <lambda>(...)``: give the dump a class name Python parses."""
    match = re.match(r"class ([^\s(]+)\(", code)
    if match and (not match.group(1).isidentifier() or keyword.iskeyword(match.group(1))):
        code = "class GraphModule(" + code[match.end():]
    return code


def pass_file_name(index: int, name: str) -> str:
    safe = re.sub(r"[^\w.-]", "_", name)
    return f"03-pass-{index}-{safe}.mlir"
