"""The private torch APIs our profiler events and structured-trace artifacts stand on, and nothing else.

* ``torch.autograd.profiler._is_profiler_enabled``: a Python bool torch sets
  from C++ when any profiler (``torch.profiler.profile``, the legacy
  ``torch.autograd.profiler.profile``, Kineto started by ``on_trace_ready``
  schedules) starts and clears when it stops. Reading it is the per-op check
  of a profiler that is off: one module attribute (about 40 ns here, where
  ``torch._C._autograd._profiler_enabled()`` is a C call of about 75 ns);
* ``torch._C._profiler._RecordFunctionFast(name, input_values, keyword_values)``:
  a ``record_function`` whose inputs become the event's shapes under
  ``record_shapes=True`` and whose keyword values (ints, strings) are the
  event's ``args`` in the Chrome trace (Inductor's kernel launches use it);
* ``torch._logging.trace_structured``: one record of ``TORCH_TRACE``'s log,
  which ``tlparse`` renders (an ``artifact`` record under the compile id that
  is current, as Dynamo's and Inductor's own).

``tests/test_profiler_hooks.py`` checks each, so a torch upgrade that changes
one fails there, by name.
"""

from __future__ import annotations

import torch.autograd.profiler as STATE  # STATE._is_profiler_enabled: the cheap check

from torch._C._profiler import _RecordFunctionFast


def profiler_active() -> bool:
    """Whether a torch profiler records now (what hooks read inline as ``STATE._is_profiler_enabled``)."""
    return STATE._is_profiler_enabled


def event(name: str, inputs=(), values: dict | None = None):
    """A context manager recording one profiler event named ``name`` around its block: ``inputs`` (a list or
    tuple of tensors) are the event's input shapes, ``values`` (str or int) its arguments. torch raises from
    C++ (a process abort, not an exception) on anything but a list or tuple and a dict: never pass None."""
    return _RecordFunctionFast(name, inputs if inputs.__class__ in (list, tuple) else tuple(inputs or ()),
                               values if values is not None else {})


def trace_active() -> bool:
    """Whether ``TORCH_TRACE`` (or ``torch._logging``'s trace handler) logs structured records now."""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def current_compile_id():
    """Dynamo's compile id of the frame being compiled now (None outside a compile): a backward compiled at
    its first call logs under its forward's (``torch._guards.CompileContext``)."""
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def trace_artifact(name: str, encoding: str, payload_fn, compile_id=None) -> None:
    """Log one artifact (``encoding`` "string" or "json") under ``compile_id`` (None: the current one);
    ``payload_fn`` runs only when a trace is being written."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=payload_fn,
                     compile_id=compile_id)
