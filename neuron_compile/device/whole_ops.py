"""Composite ops run whole: an LSTM layer stack or an attention is one device op forward and one backward.

``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and ``F.scaled_dot_product_attention`` call ATen ops that have no kernel
of their own for a device without cuDNN or flash attention (``CompositeImplicitAutograd``): on ours their
decompositions ran, a Python dispatch per piece forward and per derivative backward (a 2-layer LSTM over
20 steps: some 450 dispatches a training step, 9x CPU's step in Python alone). CUDA runs them as one op
each way (``_cudnn_rnn``, ``_scaled_dot_product_efficient_attention``); here:

    forward    the op's decomposition and its derivative are traced once per signature, on fake tensors
               (``make_fx`` of ``torch.autograd.grad``), and split as AOTAutograd splits a joint graph
               (``_whole_op_hooks.partition``). The forward (outputs, then what the backward reads) is
               one op, ``neuron_compile::whole_forward``: a kernel like any other, queued and fused with
               its neighbours, kept in the op index
    backward   ``neuron_compile::whole_backward``: what the forward saved, the saved inputs and the output
               gradients in, the input gradients out. A double backward (``create_graph=True``)
               differentiates the decomposition again from the saved inputs
    no graph   a call that records none (``no_grad``, ``generate``, inputs that need no gradient) runs the
               decomposition, as before: its pieces fuse in the queue's runs, and an inference loop at
               growing lengths keeps its bucketed kernels (``lengths``)
    adaptive   a kernel is built from its second sighting (``op_queue.REPEATS``; a backward's from its
               first), a sighting being a turn of the loop (a host read between: a model's layers in one
               step are one): traced on the issuing thread, compiled on the queue's background thread; calls run
               the decomposition until it is built (a backward runs its graph op by op). A second process
               finds the kernels in the op index and loads them there too

Where the op must be its decomposition, it is: eager fusion off (``NEURON_COMPILE_EAGER_FUSION=0``,
``NEURON_LAUNCH_BLOCKING=1``, deterministic mode: op-by-op's bits), a float64 or complex input
(numerical checks compare passes bit for bit), dropout (its mask is drawn by CPU's generator op by op), a
tracer or functorch transform (FakeTensor, DTensor, ``vmap``), a tensor of another device,
``NEURON_COMPILE_WHOLE_OPS=0``. The numbers are a fused run's: XLA computes the whole op as one graph.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
import threading
import warnings

import torch

from . import _whole_op_hooks as _hooks
from ..runtime.devices import env_flag
from . import op_queue, ops
from ._autograd_hooks import in_backward

aten = torch.ops.aten

# op -> its dropout argument and training flag (name, position): a call that drops out is its decomposition
_OPS = {
    aten.lstm.input: ("dropout", 5, "train", 6),
    aten.gru.input: ("dropout", 5, "train", 6),
    aten.rnn_tanh.input: ("dropout", 5, "train", 6),
    aten.rnn_relu.input: ("dropout", 5, "train", 6),
    aten.scaled_dot_product_attention.default: ("dropout_p", 4, None, None),
}
ENABLED = env_flag("NEURON_COMPILE_WHOLE_OPS", True)  # =0: every call is its decomposition
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass that dispatches (DTensor) or a FakeTensor
# calls run whole (forward ops, backward ops); kernels built, and builds that failed
COUNTS = {"whole_forward": 0, "whole_backward": 0, "builds": 0, "failures": 0}
_LOCK = threading.Lock()


def register(library: torch.library.Library) -> None:
    """Our kernels for ``_OPS``, at ``AutogradPrivateUse1`` (past their composite kernels)."""
    for op in _OPS:
        library.impl(op, functools.partial(_autograd, op), "AutogradPrivateUse1")


# --- which calls run whole ----------------------------------------------------------------------

def _spec(op, args, kwargs) -> tuple | None:
    """(spec, tensors) for a call that may run whole, else None. ``spec`` is a string naming the op, its
    non-tensor arguments and each tensor's size, stride, dtype and whether it needs a gradient: all the
    traced graphs depend on (a new process rebuilds them from it)."""
    if not ENABLED or not op_queue.active() or _hooks.traced() or _hooks.saved_tensor_hooks() or in_backward():
        # activation checkpointing (its saved-tensor hooks, its forward recomputed inside the backward): the
        # decomposition; the whole op under it ended with the autograd engine aborting the process (TRL's
        # SFTTrainer, which checkpoints by default)
        return None
    dropout = _OPS[op]
    if dropout is not None:
        name, position, train_name, train_position = dropout
        rate = kwargs.get(name, args[position] if len(args) > position else 0.0)
        train = True if train_name is None else kwargs.get(train_name, args[train_position]
                                                           if len(args) > train_position else True)
        if rate and train:
            return None
    tensors, metas = [], []
    grad = torch.is_grad_enabled()
    shape = _template(list(args), tensors, metas, grad)
    named = {name: _template(value, tensors, metas, grad) for name, value in kwargs.items()}
    if shape is _NO or _NO in named.values() or not tensors or len({t.get_device() for t in tensors}) != 1:
        return None
    spec = repr((op._schema.name[6:], op._overloadname, shape, named, metas))
    return spec, tensors, tuple(i for i, meta in enumerate(metas) if meta[3])


_NO = ("no",)  # a template of a value that cannot be in a whole op's call


def _template(value, tensors: list, metas: list, grad: bool):
    """``value`` with each tensor as ("tensor", its index), or _NO where the call cannot be whole; each
    tensor goes to ``tensors`` and its size, stride, dtype and need of a gradient to ``metas``. (A function
    of the module's, not a closure of ``_spec``'s: a closure that calls itself is a reference cycle, and it
    held every whole-op call's tensors, an LSTM's hidden state and output, until Python's cyclic
    collector ran; that collection, mid-step, changed which results a fused run returns.)"""
    if isinstance(value, torch.Tensor):
        if (type(value) not in _PLAIN or value.device.type != "neuron" or _hooks.wrapped(value)
                or (value.is_floating_point() and value.dtype not in _FLOATS) or value.is_complex()):
            return _NO
        tensors.append(value)
        metas.append((tuple(value.shape), tuple(value.stride()), str(value.dtype)[6:], grad and value.requires_grad))
        return ("tensor", len(tensors) - 1)
    if isinstance(value, list):
        items = [_template(v, tensors, metas, grad) for v in value]
        return _NO if _NO in items else items
    if value is None or value.__class__ in (bool, int) or value.__class__ is float and math.isfinite(value):
        return value
    return _NO


def _autograd(op, *args, **kwargs):
    """``AutogradPrivateUse1``: one forward op and one backward op once built, or the decomposition."""
    found = _spec(op, args, kwargs)
    if found is None:
        return _hooks.composite(op, *args, **kwargs)
    spec, tensors, wanted = found
    if not wanted or not ready(_forward_op(), (spec, tensors), {}):
        return _hooks.composite(op, *args, **kwargs)
    results = _Whole.apply((spec, wanted), len(op._schema.returns), *tensors)
    return results[0] if len(results) == 1 else tuple(results)


# --- built in the background --------------------------------------------------------------------

_SIGHTINGS: dict = {}  # kernel key -> turns it was called in while it was not built, or _BUILDING / _FAILED
_BUILDING, _FAILED, _RETRACE = "building", "failed", "retrace"  # _RETRACE: its index entry did not fit
_TURNS: dict = {}  # kernel key -> (the turn of its last counted sighting, calls in that turn since)
SAME_TURN = 16  # calls in one turn that count as a sighting of their own (a loop that never reads)


def _turn() -> int:
    """Which turn of the user's loop this is: the host reads and synchronizations so far. Calls of an op in
    one turn are one sighting: a model's identical layers call it again and again in its first step, which
    is no loop of the user's yet (a GPT-2's two attentions traced and compiled theirs during its cold first
    step, beside the step's own compiles, on shared cores)."""
    return op_queue.COUNTS["host_reads"] + op_queue.COUNTS["synchronizations"]


def ready(op, args, kwargs, repeats: int | None = None) -> bool:
    """Whether ``op``'s kernel for this call is built (``ops``' kernels by signature). Until it is, the
    call is the op's decomposition. Its ``repeats``-th sighting (``op_queue.REPEATS``: a loop) traces it
    here and compiles it on the background thread (an LSTM's backward: 6 s of XLA), or loads it there
    from the op index; no call waits on a compile. A sighting is a turn of the user's loop that calls it
    (``_turn``), or ``SAME_TURN`` calls in one."""
    from .opkernel import leaves_of
    from .transfers import _writes, _written_positions

    leaves = leaves_of(args, kwargs)
    if leaves.offsets and _writes(op):  # as ops.dispatch keys the call (an op writing its arguments in place)
        leaves.pin_written(_written_positions(op, args, kwargs))
    key = (id(op), tuple(leaves.parts))
    if ops.known(key) is not None:
        return True
    seen = _SIGHTINGS.get(key, 0)
    if seen is _RETRACE:
        _SIGHTINGS[key] = _start(op, key, args, kwargs, leaves, retrace=True)
    elif seen.__class__ is int and not (leaves.retypes or leaves.two_dtypes or leaves.mixed is not None):
        turn = _turn()
        last, calls = _TURNS.get(key, (None, 0))
        if last == turn and calls + 1 < SAME_TURN:  # called again in the turn of its last sighting
            _TURNS[key] = (turn, calls + 1)
            return False
        _TURNS[key] = (turn, 0)
        seen += 1
        if seen >= (repeats or op_queue.REPEATS):
            seen = _start(op, key, args, kwargs, leaves)
        _SIGHTINGS[key] = seen
    return False


def _start(op, key, args, kwargs, leaves, retrace: bool = False):
    """Begin building ``op``'s kernel for this call: the new state of its sightings."""
    from ..options import Options
    from . import op_index
    from .trace import trace_op
    from .transfers import _written_positions

    options = Options.resolve()
    name = op_index.entry_name(op, key[1])
    entry = None if retrace else op_index.load(options, name)
    if entry is not None and entry.get("kind") == "kernel":
        op_queue.build_later(functools.partial(_build, op, key, lambda: _load(op, entry, options), args))
        return _BUILDING
    try:
        # here, not on the background thread: tracing sets torch.fx's process-wide "tracing" flag, and a
        # torch.compile'd function called meanwhile refuses to run
        # (the arguments its schema marks written: LBFGS's ``_lbfgs_add_`` writes the parameters in place)
        traced = trace_op(op, args, kwargs, leaves, _written_positions(op, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - the op stays its decomposition, said once
        _warn(op, args, exc)
        return _FAILED
    if traced.by_value:
        # a float argument sits where the executable cannot take it at run time (a comparison's): its kernel
        # would hold this call's value, and the signature does not say which (ops.dispatch builds one kernel
        # per value, on the issuing thread, which a loop of changing values must not wait for)
        _warn(op, args, RuntimeError("a float argument is taken only as a constant"))
        return _FAILED
    op_queue.build_later(functools.partial(_build, op, key, lambda: ops._compile(op, traced, options, name), args))
    return _BUILDING


def _load(op, entry, options):
    def rebuild():  # the artifact was evicted: traced again on the issuing thread, at the next sighting
        raise RuntimeError("evicted")

    return ops.kernel_from_entry(op, entry, options, rebuild)


def _build(op, key, make, args) -> None:
    """On the background thread: ``make()`` the kernel and keep it where ``ops.dispatch`` finds it."""
    from .opkernel import OpKernel

    try:
        kernel = make()
    except Exception as exc:  # noqa: BLE001 - the op stays its decomposition, said once
        _SIGHTINGS[key] = _FAILED
        _warn(op, args, exc)
        return
    if kernel.__class__ is not OpKernel:  # an index entry that no longer fits: traced at the next sighting
        _SIGHTINGS[key] = _RETRACE
        return
    ops._OPS[key[0]] = op
    ops.keep(key, kernel)
    _SIGHTINGS.pop(key, None)
    COUNTS["builds"] += 1


def _warn(op, args, exc) -> None:
    """Once per signature: the op (a whole op's spec, ``args[0]``, names it), why, and what happens instead."""
    COUNTS["failures"] += 1
    name = ast.literal_eval(args[0])[0] if args and isinstance(args[0], str) else str(op)
    warnings.warn(f"neuron: {name} could not be built as one op ({str(exc).splitlines()[0][:300]}); it runs as "
                  "its decomposition", stacklevel=3)


class _Whole(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, count, *inputs):
        COUNTS["whole_forward"] += 1
        spec, ctx.wanted = call
        results = _forward_op()(spec, list(inputs))
        ctx.spec, ctx.inputs = spec, len(inputs)
        ctx.save_for_backward(*inputs, *results[count:])
        return tuple(results[:count])

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, residuals = saved[:ctx.inputs], saved[ctx.inputs:]
        wanted = ctx.wanted
        call = (ctx.spec, list(inputs), list(residuals), list(grads))
        if torch.is_grad_enabled():  # create_graph=True: a gradient that is itself differentiable
            outputs = _call(ctx.spec, inputs)
            found = torch.autograd.grad(outputs, [inputs[i] for i in wanted], grads, create_graph=True,
                                        allow_unused=True)
        elif not ready(_backward_op(), call, {}, repeats=1):  # not built yet: its graph, op by op
            found = _backward(*call, eager=True)
        else:
            COUNTS["whole_backward"] += 1
            found = _backward_op()(*call)
        out = [None] * len(inputs)
        for i, g in zip(wanted, found):
            out[i] = g
        return (None, None, *out)


# --- the graphs ---------------------------------------------------------------------------------

def _call(spec: str, tensors, graph: bool = False) -> list:
    """The op of ``spec`` on ``tensors``: its outputs, flat. ``graph``: as the whole op's graph computes it,
    through the decomposition torch registers for tracers where there is one (``op.decompose``: an LSTM's
    input projection one matmul over all steps, where eager's C++ kernel makes one a step), else eager's."""
    packet, overload, shape, named, _ = ast.literal_eval(spec)
    op = getattr(getattr(aten, packet), overload)

    args, kwargs = _fill(shape, tensors), {name: _fill(value, tensors) for name, value in named.items()}
    result = op.decompose(*args, **kwargs) if graph else NotImplemented
    if result is NotImplemented:
        result = _hooks.composite(op, *args, **kwargs)
    return list(result) if isinstance(result, tuple) else [result]


def _fill(value, tensors):
    """A template of ``_spec``'s with its tensors put back (a function of the module's: see ``_template``)."""
    if isinstance(value, tuple):  # ("tensor", i)
        return tensors[value[1]]
    return [_fill(v, tensors) for v in value] if isinstance(value, list) else value


class _Graphs:
    """The forward and backward graphs of one spec, and where each saved value comes from."""

    def __init__(self, spec: str):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx

        from ._torch_hooks import plain_dispatch

        metas = ast.literal_eval(spec)[4]
        wanted = [i for i, meta in enumerate(metas) if meta[3]]
        with plain_dispatch(), _hooks.saved_tensor_hooks_off(), FakeTensorMode() as mode:
            primals = [torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device="neuron")
                       .requires_grad_(needs) for shape, stride, dtype, needs in metas]
            with torch.no_grad():  # the outputs' sizes, for the tangents (the joint records the graph)
                outputs = _call(spec, primals, graph=True)
            tangents = [torch.empty_like(o) for o in outputs]

            def joint(primals, tangents):
                with torch.enable_grad():
                    outs = _call(spec, primals, graph=True)
                    grads = torch.autograd.grad(outs, [primals[i] for i in wanted], tangents, allow_unused=True)
                grads = [torch.zeros_like(primals[i]) if g is None else g for i, g in zip(wanted, grads)]
                return [*outs, *grads]

            gm = make_fx(joint)(primals, tangents)
        del mode
        self.count = len(outputs)
        forward, backward = _hooks.partition(gm, (primals, tangents), num_fwd_outputs=self.count)
        placeholders = [n for n in forward.graph.nodes if n.op == "placeholder"]
        output = next(n for n in forward.graph.nodes if n.op == "output")
        values = list(output.args[0])
        # a saved value that is an input is the caller's tensor, saved as it is (autograd checks its version);
        # the rest are the forward op's results after its outputs
        self.sources = [("input", placeholders.index(v)) if v.op == "placeholder" else ("result", None)
                        for v in values[self.count:]]
        output.args = (values[:self.count] + [v for v in values[self.count:] if v.op != "placeholder"],)
        self.backward_eager = copy.deepcopy(backward)  # its factories on the device (run op by op)
        for graph in (forward, backward):
            _on_host(graph)
        self.forward, self.backward = forward, backward
        self.forward_metas, self.backward_metas = _metas(forward), _metas(backward)

    def backward_inputs(self, inputs, residuals, grads) -> list:
        produced = iter(residuals)
        return [inputs[k] if kind == "input" else next(produced) for kind, k in self.sources] + list(grads)


def _metas(gm: torch.fx.GraphModule) -> list:
    """(size, stride, dtype) of each output of ``gm``, from its trace."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return [(tuple(v.meta["val"].shape), tuple(v.meta["val"].stride()), v.meta["val"].dtype)
            for v in output.args[0]]


def _on_host(gm: torch.fx.GraphModule) -> None:
    """Factories in the graphs (a causal mask's ``ones``) name the device they were traced on; an op's trace
    runs on host fakes (``trace.trace_op``), so they make host tensors there."""
    for node in gm.graph.nodes:
        device = node.kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "neuron":
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
    gm.graph.lint()
    gm.recompile()


_GRAPHS: dict = {}


def _graphs(spec: str) -> _Graphs:
    graphs = _GRAPHS.get(spec)
    if graphs is None:
        with _LOCK:
            graphs = _GRAPHS.get(spec)
            if graphs is None:
                if len(_GRAPHS) > 256:
                    _GRAPHS.clear()
                graphs = _GRAPHS[spec] = _Graphs(spec)
    return graphs


def _forward(spec, inputs):
    return list(_graphs(spec).forward(*inputs))


def _backward(spec, inputs, residuals, grads, eager: bool = False):
    """The backward graph on the call's values: traced (the op's body), or ``eager``ly on neuron tensors, op
    by op, while its kernel builds (no reentrant backward inside the engine's device thread)."""
    graphs = _graphs(spec)
    values = graphs.backward_inputs(inputs, residuals, grads)
    graph = graphs.backward_eager if eager else graphs.backward
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    return list(graph(*(_as_traced(v, p.meta["val"]) for v, p in zip(values, placeholders))))


def _as_traced(value: torch.Tensor, traced: torch.Tensor) -> torch.Tensor:
    """``value`` in the layout the graph was traced with (a ``view`` in it may need that layout): a gradient
    autograd hands in may be laid out otherwise (attention's, as the transpose it came from)."""
    if value.stride() == traced.stride() or value.numel() <= 1:
        return value
    if traced.is_contiguous():
        return value.contiguous()
    return torch.empty_strided(traced.shape, traced.stride(), dtype=value.dtype, device=value.device).copy_(value)


def _empty(metas) -> list:
    return [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in metas]


def _forward_meta(spec, inputs):
    return _empty(_graphs(spec).forward_metas)


def _backward_meta(spec, inputs, residuals, grads):
    return _empty(_graphs(spec).backward_metas)


@functools.cache
def _forward_op():
    from .optim import define

    return define("whole_forward", "whole_forward(str spec, Tensor[] inputs) -> Tensor[]", _forward, _forward_meta)


@functools.cache
def _backward_op():
    from .optim import define

    return define("whole_backward", "whole_backward(str spec, Tensor[] inputs, Tensor[] residuals, "
                  "Tensor[] grads) -> Tensor[]", _backward, _backward_meta)
