"""What ``torch.profiler`` shows of our work: named events beneath each ATen op and each compiled call.

The dispatcher records every ATen op that reaches the ``neuron`` device as an
event (``aten::add``...) before our Python kernel runs, so an event recorded
inside the kernel nests beneath its op in ``key_averages()`` and in the Chrome
trace. The events (``_profiler_hooks.event``: a ``record_function`` whose
inputs give shapes under ``record_shapes=True`` and whose values are the
trace event's ``args``):

    neuron::execute           an eager op's kernel run on the device (op, inputs' shapes)
    neuron::compile           a graph through the compile path (graph, kind), its stages
                              beneath it as ``neuron::compile.<stage>`` (lowering, passes,
                              xla-compile, cache-io...: ``CompileReport.stage``)
    neuron::host_to_device    a transfer into a PJRT buffer (bytes)
    neuron::device_to_host    a transfer out of one (bytes)
    neuron::index_check       an index tensor read on the host to check its bounds (op)
    neuron::host_fallback     an op run on host copies (op)
    neuron::collective        a collective of the ``neuron`` process group (collective, path:
                              "xla" on the device's buffers or "gloo" on host copies)
    neuron::graph <id>        one call of a graph ``torch.compile`` compiled (graph)

The hooks sit where the work happens (``ops.dispatch``, ``transfers.run_on_host``,
``storage.host_to_buffer``/``buffer_to_host``, ``bounds``, ``report.CompileReport.stage``,
``compiler.compile_graph``, ``capture.backend.NeuronOutputCode.__call__``, and
``instrument_collectives``' wrappers of the process group's two collective paths); each
reads ``_profiler_hooks.STATE._is_profiler_enabled`` inline first:
with no profiler on, that attribute read is the whole cost
(``benchmarks/bench_profiler_off.py`` measures it). What a Python backend
cannot have is a device timeline of its own: torch 2.13's profiler takes
device activities only from a native Kineto plugin (a ``PrivateUse1``
activity registered from C++), so our events are CPU-side events of the
thread that runs the device, which is also where our (synchronous) PJRT CPU
client does the work.
"""

from __future__ import annotations

# module references only: ``import neuron_compile`` before torch imports torch from ``_profiler_hooks``, whose
# autoload registers the device, which imports this module while ``_profiler_hooks`` is still half made
from torch.autograd import profiler as STATE  # STATE._is_profiler_enabled: the cheap check (_profiler_hooks)

from . import _profiler_hooks

_on_host_depth = 0  # host fallbacks under way on this process (a nested one shows in its parent's event)


def execute(run, op, leaves):
    """``run()`` (``ops.dispatch``'s last step: an eager op's kernel on its leaves) inside a ``neuron::execute``
    event. (The device passes the call in: this module sits above the device and imports none of it.)"""
    with _profiler_hooks.event("neuron::execute", leaves.tensors, {"op": str(op)}):
        return run()


def host_fallback(run, op, args, kwargs):
    """``run(op, args, kwargs)`` (``transfers.run_on_host``) inside a ``neuron::host_fallback`` event."""
    global _on_host_depth
    _on_host_depth += 1
    try:
        with _profiler_hooks.event("neuron::host_fallback", _tensors(args, kwargs), {"op": str(op)}):
            return run(op, args, kwargs)
    finally:
        _on_host_depth -= 1


def outside_host_fallback() -> bool:
    return not _on_host_depth


def instrument_collectives(group_class) -> None:
    """Put a ``neuron::collective`` event around the two paths by which ``distributed.NeuronProcessGroup``
    runs a collective: ``_on_xla`` (XLA's collectives on the device's buffers) and ``_run`` (gloo on staged
    host copies). Each is wrapped once, from ``device.register``, so that ``collectives/process_group.py`` stays as it is;
    off, a wrapper costs one check per collective."""
    for method, path in (("_on_xla", "xla"), ("_run", "gloo")):
        original = getattr(group_class, method, None)
        if original is None or getattr(original, "_neuron_profiled", False):
            continue
        setattr(group_class, method, _collective_event(original, path))


def _collective_event(method, path: str):
    import functools

    @functools.wraps(method)
    def run(self, collective, *args, **kwargs):
        if not STATE._is_profiler_enabled:
            return method(self, collective, *args, **kwargs)
        with _profiler_hooks.event("neuron::collective", _tensors(args, {}), {"collective": collective, "path": path}):
            return method(self, collective, *args, **kwargs)

    run._neuron_profiled = True
    return run


def _tensors(args, kwargs) -> list:
    from torch.utils._pytree import tree_leaves

    return [v for v in tree_leaves((args, kwargs)) if hasattr(v, "dim")]


__all__ = ["STATE", "execute", "host_fallback", "instrument_collectives", "outside_host_fallback"]
