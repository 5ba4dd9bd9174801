"""Where a queued op was issued: the innermost frame of the user's code, found cheaply.

An op that waits in the device's queue (``op_queue``) may fail when its run executes, far from the line that
issued it. Each queued op records where it came from (``issuer``: a code object and a line, a dict lookup a
frame), formatted only if it fails (``describe``); a warning that should point at the user's code finds its
frame the same way.
"""

from __future__ import annotations

import os
import sys

_OURS: dict = {}
_OUR_PARTS = (os.sep + "torch" + os.sep, os.sep + "neuron_compile" + os.sep, "<frozen", os.sep + "jax" + os.sep)


_ENTRY = 5  # frames from here to aten_kernels.handle on an op's usual way in (see issuer)


def issuer():
    """The innermost frame of the user's code issuing this op, as (code, line): kept cheap (a dict
    lookup per frame), formatted only if the op fails. An op queued on its usual way in (enqueue, OpKernel,
    ops.dispatch, the op's kernel function, aten_kernels.handle, which the dispatcher calls directly for the
    ops ``register_direct_kernels`` lists and through the fallback for the rest) skips those frames unread:
    the walk is then one dict lookup a frame of the user's own code."""
    try:
        frame = sys._getframe(_ENTRY)
    except ValueError:
        frame = None
    if frame is not None and frame.f_code is HANDLE:
        frame = frame.f_back
        if frame is not None and frame.f_code is FALLBACK:
            frame = frame.f_back
    else:
        frame = sys._getframe(2)
    ours = _OURS
    while frame is not None:
        code = frame.f_code
        # by id: a code object's hash hashes its bytecode and constants (half this walk's cost); the entry
        # holds the code, so a code object that took a dead one's id is looked at anew
        entry = ours.get(id(code))
        if entry is None or entry[0] is not code:
            if len(ours) > 65536:
                ours.clear()
            path = code.co_filename
            entry = ours[id(code)] = (code, any(part in path for part in _OUR_PARTS))
        if not entry[1]:
            return code, frame.f_lineno
        frame = frame.f_back
    return None


FALLBACK = None  # the code of the device's dispatcher fallback (``device._fallback``): ``device.register`` sets it
HANDLE = None  # the code of ``aten_kernels.handle``, which sets it


def describe(issuer) -> str:
    if issuer is None:
        return "<unknown>"
    import linecache

    code, line = issuer
    return f"{code.co_filename}:{line} in {code.co_name}: {linecache.getline(code.co_filename, line).strip()}"
