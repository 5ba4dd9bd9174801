"""Where the device's queue ends a run (``op_queue``) other than at a host read: the same ops, the same runs.

A run's signature is its ops and their wiring, so where runs end decides whether they repeat, and so whether
they fuse. Both rules here look only at the ops around the cut, through their kernels' ``token`` (a hash of
the kernel every process computes alike), never at how many ops came before:

    a full queue   (``LIMIT`` ops) is cut before the op, among its second half and the op being queued,
                   whose pair (the op before it, itself) hashes lowest (``cut_at``). Cut at a fixed count,
                   a loop that never reads a value (inference collecting outputs on the device) was cut at
                   another op of its turn each time: a new signature every run, none fused, or a build of
                   each phase (a 70-op GPT-2 forward: 35 modules of 1,024 ops). A loop of up to
                   ``LIMIT // 2`` ops a turn is cut at the same op each time
    a chunk        with the asynchronous client, ``CHUNK`` ops or more queued, the run ends before an op
                   whose pair hashes to a multiple of ``CHUNK`` (``chunk_ends``): runs of about 2 *
                   ``CHUNK`` ops, each dispatched while the host issues the next, so XLA computes a step's
                   forward while its backward is issued. Measured in alternating processes against CPU
                   eager beside it: a GPT-2 AdamW step as one run of 122 ops 1.41-1.44x, in runs of 30-60
                   ops (the queue bounded at 64) 0.96-1.02x, at 32 0.94-1.00x; nanoGPT 1.93x, 1.53x,
                   1.52x; the LSTM and LBFGS steps (runs under 32 ops) unchanged. A synchronous client
                   (``NEURON_COMPILE_ASYNC_DISPATCH=0``) would only wait at each end: no chunks there
"""

from __future__ import annotations

CHUNK = 32
_PIPELINED = None  # the device's client is asynchronous (read at the first chunk: the client exists by then)


def _pair(token: int, later: int) -> int:
    return (token * 1000003 ^ later) & 0xFFFFFFFF


def cut_at(records: list, kernel) -> int:
    """Where a full queue (``records``: op_queue's) is cut before ``kernel`` is queued: the position of the op
    starting the lowest-hashing pair among the second half."""
    best, cut = None, len(records)
    later = kernel.token
    for i in range(len(records) - 1, len(records) // 2 - 1, -1):  # latest first: a tie keeps the latest
        token = records[i][0].token
        pair = _pair(token, later)
        if best is None or pair < best:
            best, cut = pair, i + 1
        later = token
    return cut


def chunk_ends(last, kernel) -> bool:
    """A run ends between the kernel queued ``last`` and ``kernel`` (the caller holds ``CHUNK`` ops or more)."""
    global _PIPELINED
    if _PIPELINED is None:
        from ..runtime import executor

        _PIPELINED = executor.is_asynchronous()
    return _PIPELINED and _pair(last.token, kernel.token) % CHUNK == 0
