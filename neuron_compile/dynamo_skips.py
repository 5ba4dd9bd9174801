"""Which of our frames Dynamo never traces: the eager ops' compile stack (``torch._dynamo.trace_rules``' skip
folders, a private Dynamo API, here alone; checked by ``tests/test_device_hooks.py``).

It sits outside ``neuron_compile.device`` and ``neuron_compile.capture`` because both call it: the
device at its first op and in its process group, the backend when Dynamo first looks it up.
"""

from __future__ import annotations


def skip_in_dynamo(*packages: str) -> None:
    """Dynamo never compiles a frame of these packages or modules (``torch._dynamo.trace_rules``' skip folders,
    as ``trace_rules.add`` makes for a library Dynamo should not trace): C++ that runs inside a compiled region
    (DDP's reducer, the eager part after a graph break) calls the device's Python kernels, whose frames Dynamo
    would otherwise compile, each a few times, to no graph. Added together: the skip pattern is compiled once
    (``add`` compiles it per name, about 10 ms each)."""
    from importlib.util import find_spec

    import torch._dynamo.trace_rules as rules

    for package in packages:
        spec = find_spec(package)
        if spec is None:
            continue
        if spec.origin is not None:  # a module or a regular package: its file or folder
            rules.SKIP_DIRS.append(rules._strip_init_py(spec.origin))
        else:  # a namespace package (torch_mlir), which ``add`` ignores: its folders
            rules.SKIP_DIRS.extend(location.rstrip("/") + "/" for location in spec.submodule_search_locations or ())
    rules._recompile_re()


# an eager op's way down to XLA (not neuron_compile.cli, whose built-in models are for compiling)
COMPILE_STACK = ("neuron_compile.device", "neuron_compile.capture", "neuron_compile.lowering",
                 "neuron_compile.decompositions", "neuron_compile.graph_keys", "neuron_compile.compiler",
                 "neuron_compile.output_views", "neuron_compile.runtime", "neuron_compile.passes", "torch_mlir", "jax", "jaxlib")
_stack_hidden = False


def hide_compile_stack_from_dynamo() -> None:
    """Dynamo never compiles a frame of the eager ops' compile stack (idempotent).

    C++ calls the device's Python kernels from inside a compiled function: in the
    eager part after a graph break (MPT's ``.item()`` in its attention), in DDP's
    reducer. Dynamo's frame callback is on there, so it would compile each kernel
    frame it meets (``ops.dispatch`` and what it calls), to no graph but at a
    cost: MPT's static-cache ``generate`` took 58 s with the kernels traced and
    21 s without, on a warm cache.
    """
    global _stack_hidden
    if _stack_hidden:
        return
    skip_in_dynamo(*COMPILE_STACK)
    _stack_hidden = True


def traced_through(original, handler):
    """``original`` (a torch function we route, ``torch.optim.adam._multi_tensor_adam``) calling
    ``handler(original, *args, **kwargs)`` when run eagerly, and ``original`` itself under Dynamo. The router's
    frame lives here, outside ``COMPILE_STACK``: Dynamo inlines it and traces torch's own function, as with
    no router (a router in a skipped module is a graph break, and torch's function a frame of its own, which
    Dynamo then fails to trace: a compiled Adam step broke so)."""
    import functools

    import torch

    @functools.wraps(original)
    def routed(*args, **kwargs):
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        return handler(original, *args, **kwargs)

    routed._neuron = True
    return routed
