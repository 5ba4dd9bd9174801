"""The artifact file format: round trip, and every kind of damage is an ArtifactError with a reason."""

import struct

import pytest

from neuron_compile.runtime.artifact import (
    FORMAT_VERSION,
    MAGIC,
    Artifact,
    ArtifactError,
    decode_artifact,
    encode_artifact,
    portable_stablehlo,
    read_artifact,
    read_manifest,
    stablehlo_text,
    write_atomic,
)

MODULE = """
func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x2xf32>) -> tensor<4x2xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %1 = stablehlo.tanh %0 : tensor<4x2xf32>
  return %1 : tensor<4x2xf32>
}
"""


def sample() -> Artifact:
    return Artifact({"key": "ab" * 32, "graph": "g0.inference", "inputs": [{"shape": [4, 8], "dtype": "float32"}]},
                    b"\x01\x02stablehlo", b"\x7fELF-ish executable bytes" * 10)


def test_round_trip(tmp_path):
    artifact = sample()
    path = tmp_path / "a.ncart"
    write_atomic(path, encode_artifact(artifact))
    back = read_artifact(path)
    assert back == artifact
    assert back.size == path.stat().st_size
    assert read_manifest(path) == artifact.manifest
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["a.ncart"]  # no temp file left behind


def test_header_layout():
    data = encode_artifact(sample())
    assert data[:8] == MAGIC
    assert struct.unpack_from("<I", data, 8)[0] == FORMAT_VERSION


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[: len(d) // 2], "truncated"),
    (lambda d: d[:20], "truncated"),
    (lambda d: b"", "truncated"),
    (lambda d: d + b"x", "trailing bytes"),
    (lambda d: d[:100] + bytes([d[100] ^ 0x01]) + d[101:], "checksum"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 0x80]), "checksum"),
    (lambda d: b"PK\x03\x04" + d[4:], "wrong magic"),
    (lambda d: d[:8] + struct.pack("<I", FORMAT_VERSION + 1) + d[12:], "format version"),
])
def test_damage_is_an_error_with_a_reason(damage, reason):
    with pytest.raises(ArtifactError, match=reason):
        decode_artifact(damage(encode_artifact(sample())))


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import os

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "a.ncart", b"data")
    assert list(tmp_path.iterdir()) == []


def test_portable_stablehlo_round_trip():
    data, info = portable_stablehlo(MODULE)
    assert info["encoding"] == "portable-bytecode", info
    assert not data.startswith(b"func")  # bytecode, not text
    text = stablehlo_text(Artifact({"stablehlo": info}, data, b""))
    assert "stablehlo.dot_general" in text and "stablehlo.tanh" in text
