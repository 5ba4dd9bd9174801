"""Op coverage of the ``neuron`` backend against PyTorch's OpInfo database.

Every entry of ``torch.testing._internal.common_methods_invocations.op_db``
(702 in torch 2.13) with its own sample inputs, through
``torch.compile(fn, backend="neuron", fullgraph=True)`` against eager:
forward in float32 (and bfloat16, int64, bool where the op supports them),
and backward in float32 where the op supports autograd. Each sample is one of

    pass            compiled result equals eager's (assert_close)
    mismatch        it ran, the numbers differ (the error is kept)
    does-not-lower  LoweringError: Torch-MLIR has no StableHLO for an ATen op
    xla-rejects     XlaCompileError: the StableHLO did not compile on XLA
    graph-break     fullgraph capture failed in Dynamo; without fullgraph the
                    result is correct (the op just runs outside our graph)
    crash           anything else: an exception in our backend, a segfault,
                    a timeout (the worker process is restarted after it)

Samples whose eager run raises, and values with no defined content (``empty``,
random ops: compared by shape and dtype only), are noted, not counted as
failures. Per (op, dtype, direction) at most ``--max-samples`` samples are
taken, the first ones OpInfo generates.

Isolation: samples run in a worker subprocess (a segfault in a native library
is a ``crash``, not the end of the run); ``torch._dynamo.reset()`` before each
sample, so recompile limits never interfere. Raw results are appended to a
JSONL file as they come, so a run is resumable (``--resume``) and chunkable
(``--chunk 2/8``); ``--table`` rebuilds ``benchmarks/results/opinfo.{md,json}``
and ``--write-passing tests/opinfo_passing.json`` the list the CI subset pins.

    nice -n 10 python benchmarks/opinfo_coverage.py --resume            # everything
    python benchmarks/opinfo_coverage.py --ops add,sin,histc --table-to /tmp/x

Sequence mode (``--sequence``): the way a user calls one compiled function many
times with changing shapes and arguments. Per (op, dtype) one
``torch.compile(lambda inp, args, kwargs: op(inp, *args, **kwargs))`` takes
every sample's input, args and kwargs as real arguments, with no
``torch._dynamo.reset()`` between samples: from the second sample on, Dynamo's
automatic dynamic shapes makes changed sizes and changed Python ints (also ints
inside lists, e.g. split sizes) symbolic. Each sample is still compared with
eager and gets one of the statuses above (graph-break: a second compiled
function without fullgraph, as persistent as the first, gave the right
result). ``--buckets 0`` runs the worker with NEURON_COMPILE_BUCKETS=0
(bucketing off); the job is named after it, e.g. ``float32 seq buckets=off``.
Raw records go to their own JSONL file (``opinfo_sequence.jsonl``), the
table to ``opinfo_sequence.{md,json}``; forward only.

    nice -n 10 python benchmarks/opinfo_coverage.py --sequence --dtypes float32,int64 --resume
    nice -n 10 python benchmarks/opinfo_coverage.py --sequence --dtypes float32,int64 --buckets 0 --resume

Device mode (``--device``, code in ``opinfo_device.py``): no torch.compile;
each sample runs EAGERLY on the ``neuron`` device (every tensor of input, args
and kwargs copied there, requires_grad kept; results back with ``.cpu()``) and
is compared with CPU eager by ``compare_op``; backward compares the input
gradients computed on the device. Statuses as above without graph-break; a
crash names the ATen op the device was dispatching. Default dtypes float32 and
int64 (forward) and float32 backward; workers run with
NEURON_COMPILE_FALLBACK=error, the artifact cache as the environment sets it,
and ``--ops-per-worker`` ops each. Raw records in ``opinfo_device.jsonl``,
the table in ``opinfo_device.{md,json}``, set beside ``opinfo.json``'s
compiled results (the ops that pass compiled but not on the device, by cause).

    nice -n 10 python benchmarks/opinfo_coverage.py --device --max-samples 2 --resume   # all, resumable
    python benchmarks/opinfo_coverage.py --device --ops add,softmax --raw /tmp/d.jsonl --table-to /tmp/d
    python benchmarks/opinfo_coverage.py --device --table       # rebuild opinfo_device.{md,json} only
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# Raw per-sample records (about 2 MB for a full run): outside the repository, so a run resumes
# across invocations on one machine; --raw puts them elsewhere.
RAW = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neuron_compile" / "opinfo.jsonl"
RAW_SEQUENCE = RAW.with_name("opinfo_sequence.jsonl")  # --sequence's records: never mixed with RAW's
RAW_DEVICE = RAW.with_name("opinfo_device.jsonl")  # --device's records

STATUSES = ("pass", "mismatch", "does-not-lower", "xla-rejects", "graph-break", "crash")
DTYPES = ("float32", "bfloat16", "int64", "bool")
# Values with no defined content: compared by shape and dtype only.
UNDEFINED_VALUES = ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
                    "bernoulli", "normal", "uniform", "multinomial", "randn", "randn_like", "rand_like",
                    "randint", "randint_like", "nn.functional.dropout", "nn.functional.dropout2d",
                    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
                    "nn.functional.rrelu", "cauchy", "exponential", "geometric", "log_normal",
                    "torch.empty", "torch.randn")
TOLERANCES = {"float32": dict(rtol=1e-4, atol=1e-4), "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


# --------------------------------------------------------------------------- worker


def _classify(exc: BaseException) -> tuple[str, str]:
    """Walk an exception's chain (Dynamo wraps backend errors) to a status and a short message."""
    import torch._dynamo.exc as dexc

    from neuron_compile.lowering import LoweringError, exception_chain, innermost_exception
    from neuron_compile.runtime.executor import XlaCompileError

    for e in exception_chain(exc):
        if isinstance(e, LoweringError):
            return "does-not-lower", f"{e.op or '?'} [{e.stage}]"
        if isinstance(e, XlaCompileError):
            return "xla-rejects", _first_line(e)
    if isinstance(exc, (dexc.Unsupported, dexc.UserError)):
        return "graph-break", _first_line(exc)
    inner = innermost_exception(exc)
    return "crash", f"{type(inner).__name__}: {_first_line(inner)}"


def _first_line(exc) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _compare(got, ref, dtype_name: str, shape_only: bool):
    """assert_close over pytrees of outputs; raises AssertionError with the difference."""
    import torch
    from torch.utils._pytree import tree_flatten

    got_leaves, got_spec = tree_flatten(got)
    ref_leaves, ref_spec = tree_flatten(ref)
    if got_spec != ref_spec:
        raise AssertionError(f"output structure {got_spec} != eager's {ref_spec}")
    # The job's input dtype sets a floor; each output's own dtype sets its tolerance: integer
    # and bool outputs exactly, float outputs (an int64 sample's FFT, mean...) to float32's.
    job = TOLERANCES.get(dtype_name, dict(rtol=0, atol=0))
    for g, r in zip(got_leaves, ref_leaves):
        if isinstance(r, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                raise AssertionError(f"got {type(g).__name__}, eager gave a tensor")
            if shape_only:
                if g.shape != r.shape or g.dtype != r.dtype:
                    raise AssertionError(f"shape/dtype {g.shape}/{g.dtype} != eager's {r.shape}/{r.dtype}")
                continue
            if g.dtype != r.dtype:
                raise AssertionError(f"dtype {g.dtype} != eager's {r.dtype}")
            own = (TOLERANCES["bfloat16"] if r.dtype in (torch.float16, torch.bfloat16)
                   else TOLERANCES["float32"] if r.dtype.is_floating_point or r.dtype.is_complex
                   else dict(rtol=0, atol=0))
            torch.testing.assert_close(g, r, rtol=max(job["rtol"], own["rtol"]), atol=max(job["atol"], own["atol"]),
                                       equal_nan=True)
        elif g != r and not (isinstance(r, float) and r != r and g != g):
            raise AssertionError(f"{g!r} != eager's {r!r}")


# Ops whose outputs are not unique: compared on what they determine (README, "Ops Torch-MLIR cannot
# lower"). Indices of equal values (ties, common in int64 samples) may name any of them; eigen and
# singular vectors may differ by sign or phase, and by a rotation within a repeated value's space;
# a randomized low-rank factorization differs in its random projection; matrix_exp's float32 noise
# is relative to the matrix's largest element, not to each element.
_PICKED_ALONG_DIM = {"kthvalue": 1, "mode": 0, "median": 0, "nanmedian": 0, "max.reduction_with_dim": 0,
                     "min.reduction_with_dim": 0}  # op -> position of dim among the args (after k)
_PICKED_KEEP_SHAPE = {"topk": 1, "sort": 0}  # values and indices have the input's rank
_FACTORIZATIONS = {"linalg.eigh": "eigh", "svd_lowrank": "usv", "pca_lowrank": "usv", "svd": "usv",
                   "linalg.svd": "usvh"}


def _arg(sample, position, name, default):
    args = list(sample.args)
    if position < len(args):
        return args[position]
    return sample.kwargs.get(name, default)


def _compare_picked(sample, got, ref, dim, keepdim, dtype_name):
    """(values, indices): values as usual; indices must pick, from the input, the values eager picked."""
    import torch

    inp = sample.input
    values, indices = got[0], got[1]
    _compare(values, ref[0], dtype_name, False)
    if tuple(indices.shape) != tuple(ref[1].shape) or indices.dtype != ref[1].dtype:
        raise AssertionError(f"indices {tuple(indices.shape)}/{indices.dtype} != eager's "
                             f"{tuple(ref[1].shape)}/{ref[1].dtype}")
    if inp.dim() == 0:
        if indices.numel() and int(indices) != 0:
            raise AssertionError(f"index {int(indices)} of a 0-d input")
        return
    dim = dim % inp.dim()
    idx = indices if keepdim else indices.unsqueeze(dim)
    picked = inp.gather(dim, idx)
    expected = ref[0] if keepdim else ref[0].unsqueeze(dim)
    torch.testing.assert_close(picked, expected, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"indices pick other values than eager's: {m}")


_POOL_INDICES = {"nn.functional.max_pool1d": 1, "nn.functional.max_pool2d": 2, "nn.functional.max_pool3d": 3}


def _compare_pool_indices(spatial, sample, got, ref, dtype_name):
    """max pooling's (values, indices): indices into each flattened plane of the input."""
    import torch

    _compare(got[0], ref[0], dtype_name, False)
    if tuple(got[1].shape) != tuple(ref[1].shape):
        raise AssertionError(f"indices {tuple(got[1].shape)} != eager's {tuple(ref[1].shape)}")
    picked = sample.input.flatten(-spatial).gather(-1, got[1].flatten(-spatial))
    torch.testing.assert_close(picked, ref[0].flatten(-spatial), rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"indices pick other values than eager's: {m}")


def _compare_factorization(kind, sample, got, ref, dtype_name):
    import torch

    def rebuild(out):
        if kind == "eigh":
            vals, vecs = out
            return (vecs * vals.unsqueeze(-2)) @ vecs.mH, vals
        u, s, v = out
        vh = v if kind == "usvh" else v.mH
        k = s.shape[-1]
        return (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :], s

    g_mat, g_vals = rebuild(got)
    r_mat, r_vals = rebuild(ref)
    scale = max(float(r_mat.abs().max()) if r_mat.numel() else 0.0, 1.0)
    torch.testing.assert_close(g_vals, r_vals, **TOLERANCES["float32"], msg=lambda m: f"values: {m}")
    torch.testing.assert_close(g_mat / scale, r_mat / scale, **TOLERANCES["float32"],
                               msg=lambda m: f"the product of the factors (relative to its largest entry): {m}")


def _compare_matrix_exp(sample, got, ref):
    import torch

    if got.shape != ref.shape or got.dtype != ref.dtype:
        raise AssertionError(f"shape/dtype {tuple(got.shape)}/{got.dtype} != eager's {tuple(ref.shape)}/{ref.dtype}")
    truth = torch.matrix_exp(sample.input.double())
    err = (got.double() - truth).abs().amax((-2, -1)) if got.numel() else torch.zeros(())
    own = (ref.double() - truth).abs().amax((-2, -1)) if got.numel() else torch.zeros(())
    scale = truth.abs().amax((-2, -1)) if got.numel() else torch.ones(())
    if not bool((err <= torch.maximum(1e-5 * scale, 10 * own)).all()):
        raise AssertionError(f"error against float64 {err.tolist()} of {scale.tolist()} (eager's {own.tolist()})")


def compare_op(op, sample, got, ref, dtype_name: str, shape_only: bool):
    """``_compare``, except for ops whose outputs are not unique: compared on what they determine."""
    name = full_name(op)
    if shape_only or not isinstance(ref, (tuple, list)) and name != "matrix_exp":
        return _compare(got, ref, dtype_name, shape_only)
    if name in _PICKED_ALONG_DIM or name in _PICKED_KEEP_SHAPE:
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"got {type(got).__name__}, eager gave (values, indices)")
        if name in _PICKED_KEEP_SHAPE:
            dim = _arg(sample, _PICKED_KEEP_SHAPE[name], "dim", -1)
            return _compare_picked(sample, got, ref, dim, True, dtype_name)
        dim = _arg(sample, _PICKED_ALONG_DIM[name], "dim", -1)
        keepdim = _arg(sample, _PICKED_ALONG_DIM[name] + 1, "keepdim", False)
        return _compare_picked(sample, got, ref, dim, keepdim, dtype_name)
    if name in _POOL_INDICES and isinstance(ref, (tuple, list)) and len(ref) == 2:
        return _compare_pool_indices(_POOL_INDICES[name], sample, got, ref, dtype_name)
    if name in _FACTORIZATIONS and dtype_name == "float32":
        return _compare_factorization(_FACTORIZATIONS[name], sample, got, ref, dtype_name)
    if name == "matrix_exp" and dtype_name == "float32":
        return _compare_matrix_exp(sample, got, ref)
    return _compare(got, ref, dtype_name, shape_only)


def _split(sample):
    """Tensor leaves of (input, args, kwargs) become graph inputs; the rest is baked into a closure.

    Only plain lists, tuples and dicts are walked (a torch.Size stays a leaf: rebuilding
    one inside the compiled function is a Dynamo graph break of the harness's own).
    """
    import torch

    tensors = []

    def collect(obj):
        if type(obj) in (list, tuple):
            for x in obj:
                collect(x)
        elif type(obj) is dict:
            for x in obj.values():
                collect(x)
        elif isinstance(obj, torch.Tensor):
            tensors.append(obj)

    def fill(obj, it):
        if type(obj) in (list, tuple):
            return type(obj)(fill(x, it) for x in obj)
        if type(obj) is dict:
            return {k: fill(v, it) for k, v in obj.items()}
        if isinstance(obj, torch.Tensor):
            return next(it)
        return obj

    template = (sample.input, list(sample.args), dict(sample.kwargs))
    collect(template)

    def rebuild(flat_tensors):
        return fill(template, iter(flat_tensors))

    return tensors, rebuild


def _make_fn(op, rebuild):
    def fn(*tensors):
        inp, args, kwargs = rebuild(tensors)
        return op.op(inp, *args, **kwargs)

    return fn


def _judge(eager, fullgraph, broken, compare) -> tuple[str, str]:
    """One sample's status: ``eager()``'s result, then ``fullgraph()``'s compared with it; when the
    fullgraph capture fails in Dynamo, whether ``broken()`` (compiled without fullgraph) is right."""
    try:
        ref = eager()
    except Exception as exc:
        return "eager-error", _first_line(exc)
    try:
        got = fullgraph()
    except Exception as exc:
        status, msg = _classify(exc)
        if status != "crash" or not _is_graph_break(exc):
            return status, msg
        status, msg = "graph-break", _first_line(exc)
    else:
        try:
            compare(got, ref)
            return "pass", ""
        except AssertionError as exc:
            return "mismatch", " ".join(str(exc).split())[:300]
    # fullgraph failed in Dynamo: is the result right with the graph broken?
    try:
        compare(broken(), ref)
        return "graph-break", msg
    except AssertionError as exc:
        return "mismatch", "after graph break: " + " ".join(str(exc).split())[:280]
    except Exception as exc:
        return _classify(exc)


def _run_forward(op, sample, dtype_name, shape_only):
    import torch

    tensors, rebuild = _split(sample)
    fn = _make_fn(op, rebuild)

    def compiled(**options):
        torch._dynamo.reset()
        return torch.compile(fn, backend="neuron", **options)(*[t.clone() for t in tensors])

    return _judge(lambda: fn(*[t.clone() for t in tensors]), lambda: compiled(fullgraph=True), compiled,
                  lambda got, ref: compare_op(op, sample, got, ref, dtype_name, shape_only))


def _is_graph_break(exc) -> bool:
    import torch._dynamo.exc as dexc

    e = exc
    while e is not None:
        if isinstance(e, (dexc.Unsupported, dexc.UserError)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _run_backward(op, sample, shape_only):
    """Gradients of sum(out * w) with respect to every input that requires grad."""
    import torch
    from torch.utils._pytree import tree_flatten

    tensors, rebuild = _split(sample)
    fn = _make_fn(op, rebuild)

    def fresh():
        return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]

    def grads(call, inputs):
        out = call(*inputs)
        leaves = [o for o in tree_flatten(out)[0]
                  if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]
        wanted = [t for t in inputs if t.requires_grad]
        if not leaves or not wanted:
            return None
        gen = torch.Generator().manual_seed(0)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in leaves)
        return torch.autograd.grad(loss, wanted, allow_unused=True)

    try:
        ref = grads(fn, fresh())
    except Exception as exc:
        return "eager-error", _first_line(exc)
    if ref is None:
        return "no-grad", ""
    torch._dynamo.reset()
    try:
        got = grads(torch.compile(fn, backend="neuron", fullgraph=True), fresh())
    except Exception as exc:
        status, msg = _classify(exc)
        if status == "crash" and _is_graph_break(exc):
            return "graph-break", msg
        return status, msg
    try:
        _compare(got, ref, "float32", shape_only)
        return "pass", ""
    except AssertionError as exc:
        return "mismatch", " ".join(str(exc).split())[:300]


def _fresh_call_args(sample):
    """(input, args, kwargs) of a sample with every tensor leaf cloned (ops may write to their inputs)."""
    tensors, rebuild = _split(sample)
    return rebuild([t.clone() for t in tensors])


def _sequence_fn(op):
    """The op with the whole sample as arguments: ints and lists of ints travel as inputs Dynamo can make symbolic."""
    def call(inp, args, kwargs):
        return op.op(inp, *args, **kwargs)

    return call


def _copy_function(fn):
    """The same function on its own code object: Dynamo keeps cache entries and automatic-dynamic state per
    code object, so a fullgraph=True and a fullgraph=False compile of one function must not share them."""
    import types

    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Sequence:
    """One (op, dtype) of sequence mode: one compiled function called with every sample, never reset.

    ``fullgraph`` is ``torch.compile(..., fullgraph=True)``; the first sample whose fullgraph capture
    fails in Dynamo creates ``broken`` (no fullgraph, its own code object), which then serves that
    sample and every later one that breaks: each sees the same history a user's function would.
    """

    def __init__(self, op):
        import torch

        self.op = op
        self.fn = _sequence_fn(op)
        self.fullgraph = torch.compile(_copy_function(self.fn), backend="neuron", fullgraph=True)
        self.broken = None

    def replay(self, sample) -> None:
        """Call the compiled function on a sample already recorded (a restarted worker rebuilds its history)."""
        try:
            self.fullgraph(*_fresh_call_args(sample))
        except Exception:
            pass

    def run(self, sample, dtype_name, shape_only) -> tuple[str, str]:
        return _judge(lambda: self.fn(*_fresh_call_args(sample)), lambda: self.fullgraph(*_fresh_call_args(sample)),
                      lambda: self._broken()(*_fresh_call_args(sample)),
                      lambda got, ref: compare_op(self.op, sample, got, ref, dtype_name, shape_only))

    def _broken(self):
        import torch

        if self.broken is None:
            self.broken = torch.compile(_copy_function(self.fn), backend="neuron")
        return self.broken


def buckets_label(value=None) -> str:
    """``on`` (the default, multiples of 128), ``off`` (NEURON_COMPILE_BUCKETS=0) or the setting itself."""
    from neuron_compile.options import parse_buckets

    value = os.environ.get("NEURON_COMPILE_BUCKETS", "128") if value is None else value
    parsed = parse_buckets(value)
    if parsed == 0:
        return "off"
    if parsed == 128:
        return "on"
    return str(value).replace(" ", "").replace(":", "")


def sequence_direction(value=None) -> str:
    """The direction field of sequence records (the job is '<dtype> <direction>')."""
    return f"seq buckets={buckets_label(value)}"


def _jobs(op, dtypes, max_samples, backward):
    """(dtype, direction) pairs this op is run with."""
    import torch

    supported = op.supported_dtypes("cpu")
    jobs = []
    for name in dtypes:
        dtype = getattr(torch, name)
        if dtype in supported:
            jobs.append((name, "forward"))
    if backward and op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu") \
            and "float32" in dtypes:
        jobs.append(("float32", "backward"))
    return jobs


def _random_sample(op, sample) -> bool:
    """Samples of deterministic ops that ask for randomness (dropout_p > 0, attention in training)."""
    kwargs = sample.kwargs
    if isinstance(kwargs.get("dropout_p"), float) and kwargs["dropout_p"] > 0:
        return True
    return "attention" in op.name and kwargs.get("training") is True


def ops_by_name() -> dict:
    """op_db by full name, ready for Dynamo (the harness and tests/test_opinfo_subset.py use this)."""
    import torch.testing._internal.common_methods_invocations as cmi

    # OpInfo wraps random ops in wrapper_set_seed (fork_rng + manual_seed), which Dynamo
    # cannot trace: a graph break of the test's own. Their values are compared by shape
    # and dtype only, so the seed does not matter: call the op directly.
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    return {full_name(op): op for op in cmi.op_db}


def is_shape_only(op, sample) -> bool:
    """Compare by shape and dtype only: ops with undefined values, and random samples."""
    return op.name in UNDEFINED_VALUES or any(s in op.name for s in ("dropout", "rand")) or _random_sample(op, sample)


def first_samples(op, dtype_name: str, direction: str, max_samples: int) -> list:
    """The first ``max_samples`` samples OpInfo generates for a job, generated under seed 0."""
    import torch

    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", getattr(torch, dtype_name), requires_grad=direction == "backward")
    return [s for _, s in zip(range(max_samples), samples)]


def worker(names: list[str], dtypes, max_samples: int, backward: bool, skip: set, sequence: bool = False,
           no_replay: set = frozenset()) -> None:
    """Run ops; one JSON line per event on stdout (begin of a sample, its result, end of an op).

    ``sequence``: forward only, one ``Sequence`` per (op, dtype); samples in ``skip`` (recorded by an
    earlier worker) are replayed unrecorded to rebuild the compiled function's history, except those
    in ``no_replay`` (the ones that killed or hung a worker).
    """
    import warnings

    import torch
    import torch._dynamo

    import neuron_compile

    warnings.filterwarnings("ignore")
    torch._dynamo.config.recompile_limit = 1 << 20
    torch._dynamo.config.accumulated_recompile_limit = 1 << 20
    torch._logging.set_logs(dynamo=50, aot=50, inductor=50)
    import logging
    logging.getLogger("torch").setLevel(logging.CRITICAL)
    by_name = ops_by_name()

    def emit(**record):
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    seq_direction = sequence_direction() if sequence else None
    for name in names:
        op = by_name[name]
        shape_only = op.name in UNDEFINED_VALUES or any(s in op.name for s in ("dropout", "rand"))
        for dtype_name, direction in _jobs(op, dtypes, max_samples, backward and not sequence):
            if sequence:
                direction = seq_direction
                torch._dynamo.reset()
                neuron_compile.reset()
                seq = Sequence(op)
            try:
                samples = first_samples(op, dtype_name, direction, max_samples)
            except Exception as exc:
                emit(kind="note", op=name, dtype=dtype_name, direction=direction,
                     note=f"sample_inputs failed: {_first_line(exc)}")
                continue
            for index, sample in enumerate(samples):
                key = f"{dtype_name}:{direction}:{index}"
                random = _random_sample(op, sample)
                if f"{name}|{key}" in skip:
                    if sequence and f"{name}|{key}" not in no_replay:
                        seq.replay(sample)
                    continue
                emit(kind="begin", op=name, key=key)
                start = time.perf_counter()
                if not sequence:
                    neuron_compile.reset()
                try:
                    if sequence:
                        status, msg = seq.run(sample, dtype_name, shape_only or random)
                    elif direction == "forward":
                        status, msg = _run_forward(op, sample, dtype_name, shape_only or random)
                    else:
                        status, msg = _run_backward(op, sample, shape_only or random)
                except Exception as exc:  # the harness itself must not die on one sample
                    status, msg = "crash", f"harness: {type(exc).__name__}: {_first_line(exc)}"
                    traceback.print_exc(file=sys.stderr)
                emit(kind="sample", op=name, dtype=dtype_name, direction=direction, index=index, status=status,
                     error=msg, seconds=round(time.perf_counter() - start, 3),
                     shape_only=(shape_only or random) or None)
        emit(kind="done", op=name, **({"mode": seq_direction} if sequence else {}))
    torch._dynamo.reset()


# --------------------------------------------------------------------------- supervisor


def all_op_names() -> list[str]:
    from torch.testing._internal.common_methods_invocations import op_db

    return [full_name(op) for op in op_db]


def load_raw(path: Path, *more: Path, mode: str | None = None) -> tuple[dict, set]:
    """Sample records by op and the set of ops finished, from JSONL files (later records win).

    ``mode``: only "done" records of that mode count (sequence runs: e.g. "seq buckets=off"; single-sample
    runs write none); None: any.
    """
    samples, done = defaultdict(dict), set()
    for one in (path, *more):
        if not one.exists():
            continue
        for line in one.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec["kind"] == "sample":
                samples[rec["op"]][f"{rec['dtype']}:{rec['direction']}:{rec['index']}"] = rec
            elif rec["kind"] == "done" and (mode is None or rec.get("mode", "") == mode):
                done.add(rec["op"])
            elif rec["kind"] == "note":
                samples[rec["op"]].setdefault("notes", []).append(rec)
    return samples, done


def _device_module():
    """benchmarks/opinfo_device.py (--device), importable however this file was loaded."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import opinfo_device

    return opinfo_device


def supervise(names, args, raw: Path) -> None:
    """Feed ops to worker processes; a dead or stuck worker costs one sample (a crash), then restarts.
    A worker that exits cleanly with ops left (a device worker after --ops-per-worker) is followed by the next."""
    raw.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.buckets is not None:
        env["NEURON_COMPILE_BUCKETS"] = args.buckets
    mode = sequence_direction(env.get("NEURON_COMPILE_BUCKETS", "128")) if args.sequence else ""
    if args.device:
        mode = _device_module().device_mode(args.dtypes, args.backward)
        env["NEURON_COMPILE_FALLBACK"] = "error"  # an op that does not lower must fail, not run on the host
    samples, done = load_raw(raw, mode=mode)
    todo = [n for n in names if n not in done] if args.resume else list(names)
    skip = {f"{op}|{key}" for op, recs in samples.items() for key in recs if key != "notes"} if args.resume else set()
    # samples that killed or hung a worker: a restarted sequence worker must not replay them
    no_replay = {f"{op}|{key}" for op, recs in samples.items() for key, rec in recs.items()
                 if key != "notes" and rec["status"] == "crash" and rec.get("seconds") is None}
    if not args.device:  # the device compiles one op per signature: its artifact cache stays as set
        env.setdefault("NEURON_COMPILE_CACHE", "0")
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    started = time.time()
    total = len(todo)
    with raw.open("a") as out:
        while todo:
            cmd = [sys.executable, __file__, "--worker", "--dtypes", ",".join(args.dtypes),
                   "--max-samples", str(args.max_samples), "--ops", ",".join(todo)]
            if not args.backward:
                cmd.append("--no-backward")
            if args.device:
                cmd += ["--device", "--ops-per-worker", str(args.ops_per_worker)]
            # per supervisor: runs of both bucketing settings (or chunks) may share one raw file
            skip_file = raw.with_name(f"{raw.stem}.{os.getpid()}.skip")
            skip_file.write_text("\n".join(sorted(skip)))
            cmd += ["--skip-file", str(skip_file)]
            if args.sequence:
                no_replay_file = raw.with_name(f"{raw.stem}.{os.getpid()}.noreplay")
                no_replay_file.write_text("\n".join(sorted(no_replay)))
                cmd += ["--sequence", "--no-replay-file", str(no_replay_file)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if not args.verbose else None,
                                    text=True, env=env, cwd=str(HERE.parent))
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            current, deadline = None, time.time() + args.timeout
            while True:
                if not sel.select(timeout=max(0.1, deadline - time.time())):
                    if time.time() >= deadline:
                        proc.kill()
                        proc.wait()
                        break
                    continue
                line = proc.stdout.readline()
                if not line:
                    proc.wait()
                    break
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec["kind"] == "begin":
                    current = rec
                    deadline = time.time() + args.timeout
                    continue
                out.write(line)
                out.flush()
                if rec["kind"] == "sample":
                    skip.add(f"{rec['op']}|{rec['dtype']}:{rec['direction']}:{rec['index']}")
                    current = None
                    if args.verbose:
                        print(f"  {rec['op']} {rec['dtype']} {rec['direction']} #{rec['index']}: {rec['status']} "
                              f"{rec['error'][:100]}", flush=True)
                if rec["kind"] == "done":
                    todo.remove(rec["op"])
                    n = total - len(todo)
                    print(f"[{n}/{total} {time.time() - started:.0f}s] {rec['op']}", flush=True)
            sel.close()
            if current is not None:
                # the worker died (or hung) inside a sample: that sample crashed
                dtype, direction, index = current["key"].split(":")
                why = "timeout" if time.time() >= deadline else f"worker died (exit {proc.returncode})"
                rec = dict(kind="sample", op=current["op"], dtype=dtype, direction=direction, index=int(index),
                           status="crash", error=why, seconds=None)
                out.write(json.dumps(rec) + "\n")
                out.flush()
                skip.add(f"{current['op']}|{current['key']}")
                no_replay.add(f"{current['op']}|{current['key']}")
                print(f"  {current['op']} {current['key']}: crash ({why})", flush=True)
            elif proc.returncode not in (0, None) and todo:
                # died between samples (e.g. while generating them): give up on that op
                op = todo.pop(0)
                out.write(json.dumps(dict(kind="note", op=op, dtype="", direction="",
                                          note=f"worker died outside a sample (exit {proc.returncode})")) + "\n")
                out.write(json.dumps(dict(kind="done", op=op, **({"mode": mode} if mode else {}))) + "\n")
                out.flush()
    for suffix in ("skip", "noreplay"):
        raw.with_name(f"{raw.stem}.{os.getpid()}.{suffix}").unlink(missing_ok=True)


# --------------------------------------------------------------------------- table


def summarize(raw: Path, *more: Path) -> dict:
    samples, done = load_raw(raw, *more)
    per_op = {}
    totals = defaultdict(Counter)  # "float32 forward" -> status counts
    ops_totals = defaultdict(Counter)  # per job: ops where every sample passes
    failures = defaultdict(Counter)  # status -> message counts (float32 forward)
    for op in sorted(samples):
        jobs = defaultdict(Counter)
        errors = defaultdict(list)
        for key, rec in samples[op].items():
            if key == "notes":
                continue
            job = f"{rec['dtype']} {rec['direction']}"
            jobs[job][rec["status"]] += 1
            if rec["status"] not in ("pass", "eager-error", "no-grad"):
                errors[job].append(f"{rec['status']}: {rec['error']}")
                if job == "float32 forward":
                    failures[rec["status"]][_failure_key(rec)] += 1
        for job, counts in jobs.items():
            totals[job].update(counts)
            counted = sum(counts[s] for s in STATUSES)
            if counted:
                ops_totals[job]["ops"] += 1
                ops_totals[job]["all pass"] += counts["pass"] == counted
        per_op[op] = {
            "jobs": {job: dict(c) for job, c in sorted(jobs.items())},
            "errors": {job: sorted(set(e))[:3] for job, e in errors.items()},
            "notes": [n["note"] for n in samples[op].get("notes", [])],
        }
    return {"ops": per_op, "totals": {job: dict(c) for job, c in totals.items()},
            "ops_totals": {job: dict(c) for job, c in ops_totals.items()},
            "float32_forward_failures": {s: dict(c.most_common()) for s, c in failures.items()},
            "ops_done": len(done)}


def _failure_key(rec) -> str:
    if rec["status"] == "does-not-lower":
        return rec["error"].split(" [")[0]
    return rec["error"][:80]


def _rate(counts: dict) -> str:
    counted = sum(counts.get(s, 0) for s in STATUSES)
    return f"{counts.get('pass', 0)}/{counted} ({100 * counts.get('pass', 0) / max(counted, 1):.1f}%)"


def write_table(summary: dict, out_dir: Path, meta: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "opinfo.json").write_text(json.dumps({"meta": meta, **summary}, indent=1, sort_keys=True) + "\n")
    lines = ["# OpInfo coverage of the `neuron` backend", "",
             f"Generated by `benchmarks/opinfo_coverage.py` ({meta.get('note', '')}). "
             f"{summary['ops_done']} of {meta.get('op_db', '?')} OpInfo entries run; at most "
             f"{meta.get('max_samples')} samples per op, dtype and direction (the first ones OpInfo generates). "
             "Statuses: pass, mismatch, does-not-lower (LoweringError), xla-rejects (XlaCompileError), "
             "graph-break (fullgraph capture fails in Dynamo, result correct without it), crash. "
             "Samples whose eager run raises are left out.", "",
             "## Totals (samples)", "",
             "| job | pass rate | " + " | ".join(STATUSES[1:]) + " | ops all-pass |",
             "| --- | --- | " + " | ".join("---" for _ in STATUSES[1:]) + " | --- |"]
    for job in sorted(summary["totals"], key=lambda j: (j.split()[1], DTYPES.index(j.split()[0]))):
        c = summary["totals"][job]
        o = summary["ops_totals"].get(job, {})
        lines.append(f"| {job} | {_rate(c)} | " + " | ".join(str(c.get(s, 0)) for s in STATUSES[1:])
                     + f" | {o.get('all pass', 0)}/{o.get('ops', 0)} |")
    lines += ["", "## float32 forward failures by cause", "", "| status | cause | samples |", "| --- | --- | --- |"]
    for status, causes in summary["float32_forward_failures"].items():
        for cause, n in list(causes.items())[:25]:
            lines.append(f"| {status} | {cause.replace('|', '/')} | {n} |")
    lines += ["", "## Per op", "", "Counts per job as pass/counted; the first error of each failing job.", "",
              "| op | " + " | ".join(f"{d} fw" for d in DTYPES) + " | float32 bw | first error |",
              "| --- | " + " | ".join("---" for _ in DTYPES) + " | --- | --- |"]
    for op, info in summary["ops"].items():
        cells = []
        for job in [f"{d} forward" for d in DTYPES] + ["float32 backward"]:
            c = info["jobs"].get(job)
            if not c:
                cells.append("")
                continue
            counted = sum(c.get(s, 0) for s in STATUSES)
            cells.append(f"{c.get('pass', 0)}/{counted}" if counted else "-")
        err = next((e[0] for e in info["errors"].values() if e), "")
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {err[:140].replace('|', '/')} |")
    (out_dir / "opinfo.md").write_text("\n".join(lines) + "\n")


def _job_order(job: str):
    dtype, _, direction = job.partition(" ")
    return (DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES), direction)


def summarize_sequence(raw: Path, *more: Path) -> dict:
    """Sequence-mode records: totals per job (dtype x buckets) and, per op and job, the samples' statuses in order."""
    samples, _ = load_raw(raw, *more)
    done = defaultdict(set)  # mode -> ops finished
    for one in (raw, *more):
        if one.exists():
            for line in one.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("kind") == "done" and rec.get("mode"):
                    done[rec["mode"]].add(rec["op"])
    per_op = {}
    totals = defaultdict(Counter)
    ops_totals = defaultdict(Counter)
    for op in sorted(samples):
        jobs = defaultdict(dict)
        for key, rec in samples[op].items():
            if key != "notes":
                jobs[f"{rec['dtype']} {rec['direction']}"][rec["index"]] = rec
        info = {"jobs": {}, "notes": [n["note"] for n in samples[op].get("notes", [])]}
        for job in sorted(jobs, key=_job_order):
            recs = [jobs[job][i] for i in sorted(jobs[job])]
            counts = Counter(r["status"] for r in recs)
            totals[job].update(counts)
            counted = sum(counts[s] for s in STATUSES)
            if counted:
                ops_totals[job]["ops"] += 1
                ops_totals[job]["all pass"] += counts["pass"] == counted
            first = next((r for r in recs if r["status"] not in ("pass", "eager-error", "no-grad")), None)
            info["jobs"][job] = {"counts": dict(counts), "statuses": [r["status"] for r in recs],
                                 "first_error": first and {"index": first["index"], "status": first["status"],
                                                           "error": first["error"]}}
        per_op[op] = info
    return {"ops": per_op, "totals": {job: dict(c) for job, c in totals.items()},
            "ops_totals": {job: dict(c) for job, c in ops_totals.items()},
            "ops_done": {mode: len(ops) for mode, ops in sorted(done.items())}}


def _single_sample_counts(path: Path) -> dict:
    """op -> job -> counts from a single-sample table (results/opinfo.json), to set sequence failures beside."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {op: info.get("jobs", {}) for op, info in data.get("ops", {}).items()}


def write_sequence_table(summary: dict, out_dir: Path, meta: dict, single: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "opinfo_sequence.json").write_text(
        json.dumps({"meta": meta, **summary}, indent=1, sort_keys=True) + "\n")
    done = ", ".join(f"{n} ({mode})" for mode, n in summary["ops_done"].items()) or "none"
    lines = ["# OpInfo coverage of the `neuron` backend: changing shapes and arguments", "",
             f"Generated by `benchmarks/opinfo_coverage.py --sequence` ({meta.get('note', '')}). "
             f"Ops finished: {done} of {meta.get('op_db', '?')} OpInfo entries. Per op and dtype, at most "
             f"{meta.get('max_samples')} samples (the first ones OpInfo generates) go in order through ONE "
             "compiled function `lambda inp, args, kwargs: op(inp, *args, **kwargs)`, with no "
             "`torch._dynamo.reset()` between them: changed sizes and Python ints become symbolic from the "
             "second sample on. Statuses as in `opinfo.md`; `buckets=off` is NEURON_COMPILE_BUCKETS=0. "
             "Samples whose eager run raises are left out.", "",
             "## Totals (samples)", "",
             "| job | pass rate | " + " | ".join(STATUSES[1:]) + " | ops all-pass |",
             "| --- | --- | " + " | ".join("---" for _ in STATUSES[1:]) + " | --- |"]
    for job in sorted(summary["totals"], key=_job_order):
        c = summary["totals"][job]
        o = summary["ops_totals"].get(job, {})
        lines.append(f"| {job} | {_rate(c)} | " + " | ".join(str(c.get(s, 0)) for s in STATUSES[1:])
                     + f" | {o.get('all pass', 0)}/{o.get('ops', 0)} |")
    lines += ["", "## Failing ops", "",
              "Every (op, job) with a sample that does not pass: the samples' statuses in order (p = pass, "
              "- = eager error), the same dtype's single-sample result from `opinfo.json` (each sample compiled "
              "alone; a failure only here is one of changing shapes), and the first failing sample's error.", "",
              "| op | job | pass/counted | samples | single-sample | first error |",
              "| --- | --- | --- | --- | --- | --- |"]
    abbrev = {"pass": "p", "eager-error": "-", "no-grad": "-", "mismatch": "M", "does-not-lower": "L",
              "xla-rejects": "X", "graph-break": "G", "crash": "C"}
    for op, info in summary["ops"].items():
        for job, j in info["jobs"].items():
            if not j["first_error"]:
                continue
            c = j["counts"]
            counted = sum(c.get(s, 0) for s in STATUSES)
            one = single.get(op, {}).get(f"{job.split()[0]} forward")
            one_cell = f"{one.get('pass', 0)}/{sum(one.get(s, 0) for s in STATUSES)}" if one else ""
            err = f"#{j['first_error']['index']} {j['first_error']['status']}: {j['first_error']['error']}"
            lines.append(f"| {op} | {job} | {c.get('pass', 0)}/{counted} | "
                         + "".join(abbrev.get(s, "?") for s in j["statuses"])
                         + f" | {one_cell} | {err[:160].replace('|', '/')} |")
    (out_dir / "opinfo_sequence.md").write_text("\n".join(lines) + "\n")


def write_passing(summary: dict, path: Path) -> None:
    """The ops whose every float32 forward sample passes, with whether backward does too (tests pin these)."""
    passing = {}
    for op, info in summary["ops"].items():
        fw = info["jobs"].get("float32 forward", {})
        counted = sum(fw.get(s, 0) for s in STATUSES)
        if counted and fw.get("pass", 0) == counted:
            bw = info["jobs"].get("float32 backward", {})
            bw_counted = sum(bw.get(s, 0) for s in STATUSES)
            passing[op] = {"backward": bool(bw_counted) and bw.get("pass", 0) == bw_counted}
    path.write_text(json.dumps(passing, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="", help="comma-separated op names or globs (default: all of op_db)")
    p.add_argument("--dtypes", default=None, help="default float32,bfloat16,int64,bool (--device: float32,int64)")
    p.add_argument("--max-samples", type=int, default=4)
    p.add_argument("--no-backward", dest="backward", action="store_false")
    p.add_argument("--chunk", default="", help="i/n: run the i-th of n equal slices of the op list")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per sample before the worker is killed")
    p.add_argument("--raw", default="", help=f"JSONL file of raw results (appended to; default {RAW}, "
                                             f"with --sequence {RAW_SEQUENCE}, with --device {RAW_DEVICE})")
    p.add_argument("--also", default="", help="more JSONL files to read into the tables (comma-separated)")
    p.add_argument("--resume", action="store_true", help="skip ops and samples already in --raw")
    p.add_argument("--table", action="store_true", help="only rebuild the tables from --raw")
    p.add_argument("--table-to", default=str(RESULTS),
                   help="folder for opinfo.md and opinfo.json (--sequence: opinfo_sequence.md and .json, "
                        "--device: opinfo_device.md and .json)")
    p.add_argument("--sequence", action="store_true",
                   help="each op's samples through one compiled function, no reset between them (forward only)")
    p.add_argument("--buckets", default=None,
                   help="NEURON_COMPILE_BUCKETS for the workers (0: bucketing off), recorded in --sequence's job "
                        "(single-sample graphs are static: bucketing has no effect on them)")
    p.add_argument("--device", action="store_true",
                   help="each sample eagerly on the neuron device against CPU eager, no torch.compile "
                        "(opinfo_device.py; table opinfo_device.md and .json)")
    p.add_argument("--ops-per-worker", type=int, default=40,
                   help="--device: ops per worker process before the next one starts (frees its executables)")
    p.add_argument("--write-passing", default="", help="write the ops whose float32 samples all pass (the CI pin)")
    p.add_argument("--note", default="", help="a sentence for the table's header (how the run was made)")
    p.add_argument("--incomplete", default="", help="--device: say in the table's header what did not finish")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip-file", default="", help=argparse.SUPPRESS)
    p.add_argument("--no-replay-file", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dtypes is None:
        args.dtypes = "float32,int64" if args.device else "float32,bfloat16,int64,bool"
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if args.device and args.sequence:
        p.error("--device and --sequence are separate modes")

    if args.worker and args.device:
        skip = set(Path(args.skip_file).read_text().split("\n")) if args.skip_file else set()
        _device_module().worker(args.ops.split(","), args.dtypes, args.max_samples, args.backward, skip,
                                args.ops_per_worker)
        return 0
    if args.worker:
        skip = set(Path(args.skip_file).read_text().split("\n")) if args.skip_file else set()
        no_replay = set(Path(args.no_replay_file).read_text().split("\n")) if args.no_replay_file else set()
        worker(args.ops.split(","), args.dtypes, args.max_samples, args.backward, skip, args.sequence, no_replay)
        return 0
    raw = Path(args.raw or (RAW_SEQUENCE if args.sequence else RAW_DEVICE if args.device else RAW))
    if not args.table:
        names = all_op_names()
        if args.ops:
            pats = args.ops.split(",")
            names = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in pats)]
        if args.chunk:
            i, n = (int(x) for x in args.chunk.split("/"))
            names = names[i - 1::n]
        start = time.time()
        supervise(names, args, raw)
        print(f"ran {len(names)} ops in {time.time() - start:.0f}s")
    import torch

    meta = {"torch": torch.__version__, "max_samples": args.max_samples, "op_db": len(all_op_names()),
            "note": "fullgraph=True, torch._dynamo.reset() per sample, float32 tolerance rtol=atol=1e-4"
                    + (f"; {args.note}" if args.note else "")}
    more = [Path(p) for p in args.also.split(",") if p]
    if args.device:
        meta["note"] = ("eager on the neuron device against CPU eager, no torch.compile, float32 tolerance "
                        "rtol=atol=1e-4" + (f"; {args.note}" if args.note else ""))
        if args.incomplete:
            meta["incomplete"] = args.incomplete
        _device_module().table(raw, more, Path(args.table_to), meta)
        return 0
    if args.sequence:
        meta["note"] = ("fullgraph=True, one compiled function per op and dtype, no reset between samples, "
                        "float32 tolerance rtol=atol=1e-4" + (f"; {args.note}" if args.note else ""))
        summary = summarize_sequence(raw, *more)
        write_sequence_table(summary, Path(args.table_to), meta, _single_sample_counts(RESULTS / "opinfo.json"))
        for job, counts in sorted(summary["totals"].items(), key=lambda kv: _job_order(kv[0])):
            print(f"{job}: {_rate(counts)}  " + " ".join(f"{s}={counts.get(s, 0)}" for s in STATUSES[1:]))
        return 0
    summary = summarize(raw, *more)
    write_table(summary, Path(args.table_to), meta)
    if args.write_passing:
        write_passing(summary, Path(args.write_passing))
    for job, counts in sorted(summary["totals"].items()):
        print(f"{job}: {_rate(counts)}  " + " ".join(f"{s}={counts.get(s, 0)}" for s in STATUSES[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
