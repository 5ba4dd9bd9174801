"""The files a TorchTitan 0.2.2 debug run needs, put in place locally (nothing is read from the internet).

TorchTitan's wheel ships neither its llama3 debug config nor the test tokenizer; both are taken from the
TorchTitan repository at tag v0.2.2, read from a local clone or mirror of it (``git show``) and checked
against the sha256 recorded here. No third-party file is committed to this repository: ``materialize``
writes them under a cache folder on first use.

The data set: TorchTitan's ``c4_test`` (``tests/assets/c4_test/data.json``, blob 3dac4f76 at v0.2.2) is
absent from every stored copy of the repository this project can read (the mirror lists the blob without
its content), so the runs use a data set generated here, seeded and the same on every machine, in
``c4_test``'s format (a folder with ``data.json``, one ``{"text": ...}`` per line) passed through
``--training.dataset_path``. Each document encodes to exactly ``seq_len + 1`` tokens (BOS, ``seq_len - 1``
letters, one token each with this tokenizer, EOS), so each document is one sample and a data-parallel rank's batch is
known: ``interleaved`` orders the rows so that one process with the global batch reads, at each step,
the same samples as the ranks together (``split_dataset_by_node`` gives rank r the r-th contiguous
block). The letters follow a fixed random bigram table, so the loss falls as the model learns it.

The seed checkpoint is TorchTitan's own (``--checkpoint.create_seed_checkpoint``), made on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

TAG = "v0.2.2"
COMMIT = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"  # pytorch/torchtitan, "Bump version to v0.2.2 (#2412)"
SOURCE = "https://github.com/pytorch/torchtitan"
# repository path -> (path under the cache folder, sha256 of the file at COMMIT)
FILES = {
    "torchtitan/models/llama3/train_configs/debug_model.toml": (
        "debug_model.toml", "449e7bc46adfd214dc86849a22eb438ce7dd729f84f0e7f4367f41d6620757fa"),
    "tests/assets/tokenizer/tokenizer.json": (
        "tokenizer/tokenizer.json", "4a1dbfa47fb7260f2be2fe7774d241741bd3cadbeaabc6d3ec19a05d46f00048"),
    "tests/assets/tokenizer/tokenizer_config.json": (
        "tokenizer/tokenizer_config.json", "f4b11c2e94179e9f7956e0e48e1ecc9cf17d73d71cf4c0221ccb82a806f9c9f7"),
}
# where a clone or mirror of pytorch/torchtitan may lie (first that holds COMMIT wins)
REPO_CANDIDATES = ("/work/.mirror/pytorch+torchtitan/repo",)
CACHE = Path(os.environ.get("NEURON_TORCHTITAN_CACHE",
                            Path.home() / ".cache" / "neuron_compile" / f"torchtitan-{TAG}"))


class AssetsMissing(RuntimeError):
    """TorchTitan's config and tokenizer could not be found locally."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git_show(repo: str, path: str) -> bytes | None:
    for git_dir in (repo, os.path.join(repo, ".git")):
        try:
            return subprocess.run(["git", "--git-dir", git_dir, "show", f"{COMMIT}:{path}"],
                                  check=True, capture_output=True).stdout
        except (subprocess.CalledProcessError, FileNotFoundError):
            continue
    return None


def third_party_files(cache: Path = CACHE) -> Path:
    """The debug config and tokenizer under ``cache``, each checked against its recorded sha256."""
    repos = [r for r in (os.environ.get("NEURON_TORCHTITAN_REPO"), *REPO_CANDIDATES) if r]
    for repo_path, (local, digest) in FILES.items():
        target = cache / local
        if target.exists() and _sha256(target.read_bytes()) == digest:
            continue
        data = next((d for d in (_git_show(r, repo_path) for r in repos if os.path.isdir(r))
                     if d is not None and _sha256(d) == digest), None)
        if data is None:
            raise AssetsMissing(
                f"{repo_path} at {SOURCE} {COMMIT} (sha256 {digest}) not found: set NEURON_TORCHTITAN_REPO "
                f"to a clone of pytorch/torchtitan holding tag {TAG}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return cache


def one_token_symbols(tokenizer_json: Path) -> list[str]:
    """Letters the test tokenizer encodes as one token each, in any context. (Its vocabulary spells a
    space as " " under a ByteLevel pre-tokenizer that maps it to "\u0120": spaces vanish, no merge
    applies, and text encodes letter by letter.)"""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    letters = "abcdefghijklmnopqrstuvwxyz"
    ids = tok.encode(letters, add_special_tokens=False).ids
    return list(letters) if len(ids) == len(letters) else [c for c in letters if len(
        tok.encode(c + c + c, add_special_tokens=False).ids) == 3]


def _documents(symbols: list[str], n_docs: int, seq_len: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    successors = {s: rng.sample(symbols, 3) for s in symbols}  # the bigram table the model can learn
    docs = []
    for _ in range(n_docs):
        s = rng.choice(symbols)
        out = []
        for _ in range(seq_len - 1):
            out.append(s)
            s = rng.choice(successors[s]) if rng.random() < 0.9 else rng.choice(symbols)
        docs.append("".join(out))
    return docs


def interleaved(docs: list[str], world: int, local_batch: int) -> list[str]:
    """Rows in the order one process reads, ``world * local_batch`` a step, what ``world`` ranks read
    together: rank r reads the r-th contiguous block of the rows (``split_dataset_by_node``)."""
    per_rank = len(docs) // world
    blocks = [docs[r * per_rank:(r + 1) * per_rank] for r in range(world)]
    out = []
    for step in range(per_rank // local_batch):
        for block in blocks:
            out.extend(block[step * local_batch:(step + 1) * local_batch])
    return out


def dataset(cache: Path, seq_len: int, n_docs: int, world: int = 1, local_batch: int = 1,
            seed: int = 0) -> Path:
    """A ``c4_test``-format folder; with ``world > 1`` its rows are ``interleaved`` for one process."""
    folder = cache / "data" / f"seq{seq_len}_n{n_docs}_seed{seed}" / f"w{world}_b{local_batch}"
    target = folder / "data.json"
    if target.exists():
        return folder
    tokenizer = cache / "tokenizer" / "tokenizer.json"
    docs = _documents(one_token_symbols(tokenizer), n_docs, seq_len, seed)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    assert all(len(tok.encode(d, add_special_tokens=False).ids) == seq_len - 1 for d in docs)
    if world > 1:
        docs = interleaved(docs, world, local_batch)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"data.json.{os.getpid()}.tmp"
    tmp.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tmp.replace(target)
    return folder
