"""The compiled-graph artifact: one self-checking file per compiled graph (our "NEFF").

An artifact holds everything needed to run a graph again without compiling it,
plus enough to explain and rebuild it: the manifest (what it is and how it was
made), the StableHLO as portable versioned bytecode (the graph outlives the
executable: a newer XLA can recompile it), and the serialized XLA executable.
No pickle anywhere: the manifest is JSON, the rest are opaque byte strings.

File layout (all integers unsigned little-endian)
-------------------------------------------------

    offset  size  field
    0       8     magic            b"\\x89NCART\\r\\n" (a high byte first, so it is never
                                   mistaken for text; CR LF catches line-ending mangling)
    8       4     format_version   FORMAT_VERSION (1); any other value is refused
    12      4     flags            0 (reserved)
    16      8     manifest_len     M
    24      8     stablehlo_len    S
    32      8     executable_len   E
    40      M     manifest         JSON, UTF-8, keys sorted (see below)
    40+M    S     stablehlo        portable StableHLO bytecode
                                   (``serialize_portable_artifact_str`` at the version named
                                   in ``manifest["stablehlo"]["version"]``), or MLIR text
                                   when ``manifest["stablehlo"]["encoding"] == "mlir-text"``
    40+M+S  E     executable       ``PjRtClient.serialize_executable`` bytes (machine code)
    end-32  32    sha256           SHA-256 of every byte before it (header included)

The file size must be exactly 40 + M + S + E + 32. A file that is short, long,
has another magic or version, or whose checksum does not match raises
``ArtifactError`` with the reason; the cache turns that into a miss with one
warning.

Manifest fields
---------------

    format, format_version   "neuron_compile artifact", FORMAT_VERSION
    key                      hex SHA-256 cache key of the StableHLO level
    key_parts                {part name: {"hash": hex, "value": short printable form}}
    fx_key, fx_key_parts     the FX-level key this artifact was first built for (other
                             FX keys may alias it through the index)
    graph, kind              e.g. "g0.inference", "inference"
    inputs, outputs          [{"shape": [..], "dtype": "float32"}] of the XLA parameters/results
    aliases                  graph outputs not computed by XLA: {"output": i, "input": j}
                             (an input handed back as is) or {"output": i, "constant": repr}
    pipeline                 canonical pass pipeline spec; ``passes``: per-pass stats
                             (name, options, fired, seconds, details: padding done...)
    versions                 neuron_compile, torch, torch-mlir, jax, jaxlib
    platform                 XLA platform, platform_version, device_kind
    xla_compile_options      hash of the serialized CompileOptions and XLA_FLAGS
    stages                   {stage: seconds} of the compile that made it
    stablehlo                {"encoding": "portable-bytecode" | "mlir-text", "version": ...}
    created                  UTC time, ISO 8601
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "Artifact",
    "ArtifactError",
    "decode_artifact",
    "encode_artifact",
    "read_artifact",
    "read_manifest",
    "write_atomic",
    "portable_stablehlo",
    "stablehlo_text",
]

MAGIC = b"\x89NCART\r\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII QQQ".replace(" ", ""))  # 40 bytes
_DIGEST = 32
assert _HEADER.size == 40


class ArtifactError(ValueError):
    """An artifact file is not a valid artifact of this format version; the message says why."""


@dataclass
class Artifact:
    manifest: dict
    stablehlo: bytes = b""
    executable: bytes = b""
    size: int = field(default=0, compare=False)  # bytes on disk, when read from a file


def encode_artifact(artifact: Artifact) -> bytes:
    manifest = json.dumps(artifact.manifest, sort_keys=True, separators=(",", ":"), default=str).encode()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(manifest), len(artifact.stablehlo), len(artifact.executable))
    body = b"".join((header, manifest, artifact.stablehlo, artifact.executable))
    return body + hashlib.sha256(body).digest()


def _parse_header(data: bytes, total: int | None = None):
    if len(data) < _HEADER.size:
        raise ArtifactError(f"truncated: {len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, _flags, m, s, e = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactError(f"wrong magic {magic!r} (expected {MAGIC!r}): not a neuron_compile artifact")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"format version {version}, this neuron_compile reads version {FORMAT_VERSION}")
    expected = _HEADER.size + m + s + e + _DIGEST
    if total is not None and total != expected:
        what = "truncated" if total < expected else "trailing bytes"
        raise ArtifactError(f"{what}: {total} bytes, the header announces {expected}")
    return m, s, e


def decode_artifact(data: bytes) -> Artifact:
    """Parse and verify an artifact's bytes; raises ``ArtifactError`` with the reason."""
    m, s, e = _parse_header(data, len(data))
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise ArtifactError("checksum mismatch: the file is corrupted")
    start = _HEADER.size
    try:
        manifest = json.loads(body[start:start + m].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # only reachable with a forged checksum
        raise ArtifactError(f"manifest is not JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError("manifest is not a JSON object")
    stablehlo = body[start + m:start + m + s]
    executable = body[start + m + s:start + m + s + e]
    return Artifact(manifest, stablehlo, executable, size=len(data))


def read_artifact(path: str | os.PathLike) -> Artifact:
    """Read and verify an artifact file; raises ``ArtifactError`` (or ``OSError`` if unreadable)."""
    with open(path, "rb") as f:
        data = f.read()
    return decode_artifact(data)


def read_manifest(path: str | os.PathLike) -> dict:
    """Only the manifest, without reading the executable or checking the checksum (for listings)."""
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        head = f.read(_HEADER.size)
        m, _s, _e = _parse_header(head, total)
        raw = f.read(m)
    try:
        return json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"manifest is not JSON: {exc}") from None


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o600) -> None:
    """Write to a temp file in the same folder, fsync-free, then rename into place.

    Readers see the old file or the new one, never a torn one. The temp file is
    removed when anything fails (a full disk included).
    """
    folder = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def portable_stablehlo(text: str) -> tuple[bytes, dict]:
    """StableHLO text -> (bytes, manifest["stablehlo"]): portable bytecode, or text if it can't be."""
    try:
        from torch_mlir._mlir_libs import _stablehlo

        version = _stablehlo.get_current_version()
        return bytes(_stablehlo.serialize_portable_artifact_str(text, version)), {
            "encoding": "portable-bytecode", "version": version}
    except Exception as exc:  # an op outside the portable opset: keep the text, say why
        return text.encode(), {"encoding": "mlir-text", "reason": str(exc)[:300]}


def stablehlo_text(artifact: Artifact) -> str:
    """The StableHLO module of an artifact as MLIR text (for ``inspect`` and recompiling)."""
    info = artifact.manifest.get("stablehlo", {})
    if info.get("encoding") == "mlir-text":
        return artifact.stablehlo.decode()
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _stablehlo

    bytecode = _stablehlo.deserialize_portable_artifact_str(artifact.stablehlo)
    ctx = ir.Context()
    _stablehlo.register_dialect(ctx)
    return str(ir.Module.parse(bytecode, ctx))
