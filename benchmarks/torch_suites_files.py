"""The PyTorch test files ``torch_suites.py`` runs: where each comes from, its sha256, and how it gets here.

Every machine runs the same bytes. Each file is pinned to a commit of a public
repository; a few lines that do not import under the torch we pin (2.13) are
dropped by recorded edits, and both the raw file's sha256 and the edited one's
are kept here. The files are PyTorch's, never committed to this repository:
``ensure_files`` puts them in a cache folder (default
``~/.cache/neuron_compile/torch_suites/files/``), from

- a local copy (``--tests-dir DIR``): ``DIR/<file>`` as the pinned commit has it
  (the edits are then applied) or already edited; or
- ``https://raw.githubusercontent.com/<repo>/<commit>/<path>`` when no local copy is given.

Either way the bytes must hash to the recorded sha256 (raw, then edited), or
the file is refused with a message that names both hashes and the source.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

FILES_DIR = Path.home() / ".cache" / "neuron_compile" / "torch_suites" / "files"


@dataclass(frozen=True)
class SuiteFile:
    repo: str
    commit: str
    path: str
    raw_sha256: str  # the bytes at repo@commit:path
    edits: tuple[tuple[str, str], ...]  # (text, replacement): each text occurs exactly once in the raw file
    sha256: str  # the bytes after the edits: what runs

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.path}"

    def record(self) -> dict:
        return {"repo": self.repo, "commit": self.commit, "path": self.path, "url": self.url,
                "raw_sha256": self.raw_sha256, "sha256": self.sha256,
                "edits": [{"drop" if not new else "replace": old, **({"with": new} if new else {})}
                          for old, new in self.edits]}


_OPTIM_IMPORTS = (  # test/optim/: LR schedulers, differentiable optimizers, SWA; none device-generic
    "from optim.test_lrscheduler import (\n    TestLRScheduler,  # noqa: F401\n)\n"
    "from optim.test_optim import (\n    TestDifferentiableOptimizer,  # noqa: F401\n)\n"
    "from optim.test_swa_utils import (\n    TestSWAUtils,  # noqa: F401\n)\n\n")

SOURCES: dict[str, SuiteFile] = {
    "test_view_ops.py": SuiteFile(
        "pytorch/pytorch", "9c491bc34c6ab131b18cf51db02636d65ffd3472", "test/test_view_ops.py",
        raw_sha256="d66cabc237335a0c79f25e85b4defeefba695fb7e00e0d884720ebd391c6f8d3", edits=(),
        sha256="d66cabc237335a0c79f25e85b4defeefba695fb7e00e0d884720ebd391c6f8d3"),
    "test_modules.py": SuiteFile(  # HardwareClassification is newer than torch 2.13
        "cyyever/pytorch", "3708c33c7424656640eac0ed4383b47d2e605214", "test/test_modules.py",
        raw_sha256="bd58dd5dc754291a8d06221c0b131192ca7acef1ed76d59f2cac6200d94b60bd",
        edits=((", TEST_WITH_ROCM, HardwareClassification)", ", TEST_WITH_ROCM)"),
               ("    hw_classification = HardwareClassification.ACCELERATOR\n", ""),
               ("    hw_classification = HardwareClassification.CPU\n", "")),
        sha256="69f3789afd061fb120f1a08cd8a193c789bb40e61e0364253dd6b75780f65c6d"),
    "test_optim.py": SuiteFile(
        "maggiemoss/pytorch", "eb4247c60570b3bd9f6404efae673f748ea0a5ea", "test/test_optim.py",
        raw_sha256="60d71097cb5fb60a9776020a819993245bd212361b662e72a45610e4460e1225",
        edits=((_OPTIM_IMPORTS, ""),),
        sha256="bf2353ce395b753d3a814a9f4ac1e2c12cc74ec7a6b453069f1ab999a3cb4681"),
}


class SuiteFileError(RuntimeError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def apply_edits(name: str, raw: bytes, source: SuiteFile) -> bytes:
    text = raw.decode("utf-8")
    for old, new in source.edits:
        count = text.count(old)
        if count != 1:
            raise SuiteFileError(f"{name}: the recorded edit {old!r} matches {count} places, not 1")
        text = text.replace(old, new)
    return text.encode("utf-8")


def verified(name: str, data: bytes, origin: str, source: SuiteFile | None = None) -> bytes:
    """``data`` as it runs (edited), if it is the pinned file raw or edited; else ``SuiteFileError``."""
    source = source or SOURCES[name]
    digest = sha256(data)
    if digest == source.sha256:
        return data
    if digest != source.raw_sha256:
        raise SuiteFileError(
            f"{name} from {origin} has sha256 {digest}; expected {source.raw_sha256} "
            f"({source.repo}@{source.commit}:{source.path} as is) or {source.sha256} (with the recorded edits). "
            "Refusing to run a different file: fetch that commit's file, or drop --tests-dir to download it.")
    edited = apply_edits(name, data, source)
    if sha256(edited) != source.sha256:
        raise SuiteFileError(f"{name}: after the recorded edits its sha256 is {sha256(edited)}, "
                             f"not the recorded {source.sha256}")
    return edited


def _download(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (a fixed https URL)
        return response.read()


def ensure_files(names, files_dir: Path = FILES_DIR, seed_dir: Path | None = None, download=_download,
                 sources: dict[str, SuiteFile] | None = None) -> Path:
    """Put each pinned file of ``names`` in ``files_dir`` (checked), from ``seed_dir`` or the network."""
    sources = sources or SOURCES
    files_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = sources[name]
        dest = files_dir / name
        local = Path(seed_dir) / name if seed_dir is not None else None
        if local is not None and local.exists():
            data, origin = local.read_bytes(), str(local)
        elif dest.exists() and sha256(dest.read_bytes()) == source.sha256:
            continue
        else:
            try:
                data, origin = download(source.url), source.url
            except OSError as error:
                raise SuiteFileError(f"{name}: could not download {source.url} ({error}); without the internet, "
                                     f"seed it from a local copy of {source.repo}@{source.commit}:{source.path} "
                                     "with --tests-dir DIR") from error
        data = verified(name, data, origin, source)
        tmp = dest.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    return files_dir
