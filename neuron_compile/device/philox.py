"""Philox4x32-10, the counter-based generator CUDA's (and the neuron device's) ``(seed, offset)`` state drives.

Pure arithmetic on numpy arrays, no state: the 32-bit words an element draws are a function of the seed and
of the element's *position* alone (``philox4x32(counter=(position lo, position hi, 0, 0), key=(seed lo, seed
hi))``), so any subset of a stream's positions, in any order, on any process, gives the very words the whole
stream has there. That is what lets each shard of a DTensor draw its own part of one stream (``rng.py``).

The algorithm is Salmon et al.'s (SC'11) and Random123's ``philox4x32`` with 10 rounds (the answers to its
known-answer vectors are in ``tests/test_device_rng.py``). The transforms from words to values are the
device's own (CUDA's depend on its launch grid, so no device could match them): one Philox block per
element, its first two words used:

* uniform on [0, 1): ``r0 * 2**-32`` (float64: ``(r0 << 21 | r1 >> 11) * 2**-53``);
* standard normal: Box-Muller, ``sqrt(-2 ln u1) * cos(2 pi u2)`` with ``u1 = (r0 + 1) * 2**-32`` on (0, 1]
  and ``u2 = r1 * 2**-32``;
* 64 random bits: ``r0 << 32 | r1``.

Values are computed in float64 and rounded once to the tensor's dtype.
"""

from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
ROUNDS = 10
CHUNK = 1 << 20  # positions per pass: a handful of uint64 temporaries of this length at a time


def philox4x32(counter, key, rounds: int = ROUNDS):
    """The four 32-bit output words (uint64 arrays) for counters ``counter`` (four arrays or ints, each below
    2**32, broadcast together) under ``key`` (two ints below 2**32)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = c0 * M0, c2 * M1  # exact: a product of two 32-bit words fits 64 bits
        c0, c1, c2, c3 = ((p1 >> _SHIFT) ^ c1 ^ np.uint64(k0), p1 & _MASK,
                          (p0 >> _SHIFT) ^ c3 ^ np.uint64(k1), p0 & _MASK)
    return c0, c1, c2, c3


def words(seed: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first two words (uint64 arrays, each below 2**32) element ``i`` draws at stream position
    ``positions[i]`` (non-negative int64) under ``seed`` (a uint64)."""
    positions = np.asarray(positions, dtype=np.uint64).reshape(-1)
    r0, r1 = np.empty_like(positions), np.empty_like(positions)
    key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    for start in range(0, positions.size, CHUNK):
        p = positions[start:start + CHUNK]
        out = philox4x32((p & _MASK, p >> _SHIFT, 0, 0), key)
        r0[start:start + CHUNK], r1[start:start + CHUNK] = out[0], out[1]
    return r0, r1


def uniform(seed: int, positions, double: bool = False) -> np.ndarray:
    """Uniform float64 values on [0, 1) (53 bits of them when ``double``, else 32)."""
    r0, r1 = words(seed, positions)
    if double:
        return ((r0 << np.uint64(21)) | (r1 >> np.uint64(11))).astype(np.float64) * 2.0 ** -53
    return r0.astype(np.float64) * 2.0 ** -32


def normal(seed: int, positions) -> np.ndarray:
    """Standard normal float64 values (Box-Muller of the two words)."""
    r0, r1 = words(seed, positions)
    u1 = (r0.astype(np.float64) + 1.0) * 2.0 ** -32  # (0, 1]: log is finite
    u2 = r1.astype(np.float64) * 2.0 ** -32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def bits64(seed: int, positions) -> np.ndarray:
    """64 random bits per element (uint64)."""
    r0, r1 = words(seed, positions)
    return (r0 << _SHIFT) | r1
