"""Lengths that grow: an eager op seen at a growing length compiles once per 128-bucket of it.

A sampling loop without a KV cache runs the model on a sequence one token longer each step, so every
op of the forward meets a new length each time. Exact shapes would compile each op once per length;
here the compiled path's shape bucketing (``capture.bucketing``) serves the eager op instead:

    sighting   every signature miss records, per op and shape-free signature (dtypes, ranks, storages,
               scalars), the sizes each dim of each tensor had. A dim is a growing length at size n
               when it had n - 1 and n - 2 before (``_growing``) and n is no size of the op's first
               sighting (widths, heads); a Parameter's dims never are. A view of a bucket's storage
               says itself which of its dims are lengths (``_padded_dims``: a length that grows to
               the head size, the head size beside it). Sizes that merely differ (layer widths, a
               last smaller batch) and the first lengths compile at exact shapes, as before
    family     the op traced once on fake tensors whose dynamic dims are size symbols, then the padding
               analysis (``bucketing.analyze``): which reductions, contractions, cats and indexing need
               masks or true sizes. An op it cannot prove exact keeps exact shapes (``refused``)
    kernel     per bucket of the symbols (and the inputs' strides and buffer shapes): the storages'
               views read at bucket sizes (``trace._padded_view``), the analysis' rewrites applied at
               the bucket (``BucketInterpreter``), the true sizes a small int64 input, compiled once
    results    each result's storage holds the bucket-shaped buffer; the tensor is its true-size part
               (``x[:, :t]`` of the bucket: the bucket's strides), so the next op of the loop reads it
               at the same bucket shape and compiles nothing new. Values past the true sizes are
               never read as values: every consumer is bucketed or reads the true view.

``torch.empty`` at a growing leading length (``contiguous()``'s, an ``out=``'s), ``arange(t, out=)``
(a position embedding's) and a filled factory (a causal mask's ``ones(t, t)``) give the true part of a
bucket as well (``grown``); in-place and ``out=`` ops writing such
a storage run bucketed. Only where no autograd graph is recorded and no backward runs, by default
(``active``: sampling loops and ``generate`` run under ``no_grad``): in training a bucketed tensor's
strides can reach a C++ ``view`` of autograd's that CPU's contiguous tensor allows (a Hugging Face XLNet
trained after a ``generate`` failed in its backward when every op was bucketed).
``NEURON_COMPILE_DEVICE_LENGTHS=1`` buckets everywhere, ``=0`` nowhere. Families and their kernels
go into the op index (``op_index``) like any kernel: a new process with the cache warm finds each
family's analysis and each bucket's kernel there, and traces and compiles nothing.

What differs from CPU: a bucketed result padded along an inner dim (attention scores ``(b, h, t, t)``)
has the bucket's strides, so it is not ``is_contiguous()``; a ``view`` its strides do not allow is
taken of a dense copy (``dense_copy``: no aliasing; a write to either while both live is an error
naming the op, ``check_write``, never a value the other misses). Its storage holds the bucket (``nbytes``,
``set_(storage)`` see the bucket's size).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref

import torch

from . import storage as _storage
from ._autograd_hooks import in_backward
from .opkernel import COUNTS, rebuild
from .trace import RUNTIME, _replace_tensors

log = logging.getLogger("neuron_compile")

MIN_SIZES = 3
OPS = None  # ``ops`` (which imports this module) sets itself here: the dispatcher this module calls back
COUNTS.setdefault("bucketed_ops", 0)  # kernels compiled at a bucket (each once per op, bucket, layout)
_OP_SIZES: dict = {}  # (op, tensor leaf, rank, dim) -> the sizes seen
_SEEN: dict = {}  # shape-free signature -> per tensor leaf, per dim: the sizes seen
_FAMILIES: dict = {}  # (shape-free signature, dynamic dims, floats) -> Family, or a refusal reason (str)
_STATE = threading.local()
SIGHTINGS = [_OP_SIZES, _SEEN, _FAMILIES]  # what ``forget`` clears (``grown`` adds its factories' sightings)
FACTORY_KERNELS: dict = {}  # op -> its kernel at a growing length, or None (``grown``: ``arange(out=)``)


def active() -> bool:
    """Whether an op may run bucketed: by default where no autograd graph is recorded and no backward runs
    (``torch.no_grad``, ``inference_mode``: sampling loops, ``generate``); ``NEURON_COMPILE_DEVICE_LENGTHS=1``
    everywhere, ``=0`` nowhere. In training a bucketed tensor can reach a C++ ``view`` of autograd's (a
    ``ViewBackward0``) that the bucket's strides refuse and CPU's contiguous tensor allows (a Hugging Face
    XLNet trained after a ``generate``: its backward's gradients were bucketed)."""
    if getattr(_STATE, "exact", 0):
        return False
    setting = os.environ.get("NEURON_COMPILE_DEVICE_LENGTHS", "")
    if setting:
        return setting == "1"
    return not torch.is_grad_enabled() and not in_backward()


@contextlib.contextmanager
def exact():
    """Ops dispatched inside give exact-shape results (a caller that reads the result's buffer itself)."""
    _STATE.exact = getattr(_STATE, "exact", 0) + 1
    try:
        yield
    finally:
        _STATE.exact -= 1


def forget() -> None:
    """Forget every sighting and bucketed kernel: sizes seen from now on start a new history (tensors
    already on a bucket's storage keep it)."""
    for table in SIGHTINGS:
        table.clear()


def refused() -> dict:
    """Ops kept at exact shapes though their sizes vary: op name -> the analysis' reason."""
    return {str(key[0][0]): value for key, value in _FAMILIES.items() if isinstance(value, str)}


def _written(op, args, kwargs, leaves):
    """The one leaf an in-place or ``out=`` op writes, when its storage is a bucket's (``_PADDED``: nothing
    real lies past the true sizes, so the op may write the whole bucket); None if it writes none; False
    where it cannot run bucketed."""
    if not OPS._writes(op):
        return None
    positions = OPS._written_positions(op, args, kwargs)
    if len(positions) != 1:
        return False
    tensor = leaves.tensors[positions[0]]
    data = getattr(tensor.untyped_storage(), "_neuron", None)
    if data is not None and (data in _PADDED and tensor.storage_offset() == 0 or _fresh(tensor, data)):
        return positions[0]
    return False


def _fresh(tensor, data) -> bool:
    """``tensor`` is a new ``empty``'s whole storage, held by nothing else (``clone``'s and
    ``contiguous()``'s result before its ``copy_``): it may move onto a bucket's storage."""
    return (data.buffer is None and tensor.storage_offset() == 0 and tensor.numel() == data.numel
            and tensor.is_contiguous() and torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) <= 2)


def _eligible(op, leaves) -> bool:
    return not (op in OPS._HOST_OPS or leaves.mixed is not None or leaves.two_dtypes
                or torch.Tag.nondeterministic_seeded in op.tags or torch.Tag.dynamic_output_shape in op.tags
                or torch.Tag.data_dependent_output in op.tags)


def _shapeless(op, leaves):
    """(the signature without sizes, strides and buffer shapes; per tensor leaf its sizes), or None."""
    key, shapes = [op], []
    for part in leaves.parts:
        if isinstance(part, tuple) and part and isinstance(part[0], torch.dtype):
            key.append(("t", part[0], len(part[1]), part[-1] if len(part) == 3 else (part[3], part[4])))
            shapes.append(tuple(part[1]))
        elif isinstance(part, tuple) and part and part[0] == "host":
            key.append(part)
            shapes.append(())
        else:
            key.append(part)
    return tuple(key), shapes


def _growing(sizes: set, n: int) -> bool:
    """A dim at size ``n`` is a length that grows: it has had the ``MIN_SIZES - 1`` sizes just below
    (a sampling loop's one token at a time); sizes that merely differ (layer widths, a last smaller
    batch, shapes a test sweeps) stay exact."""
    return n > MIN_SIZES and all(n - k in sizes for k in range(1, MIN_SIZES))


def _padded_dims(tensor) -> dict:
    """For a view of a bucket's storage: its dims that lie along one of the storage's dims (the same
    stride), each True where that storage dim is a length (``_LENGTHS``: padded past the true size) and
    False where it is not (a width, the head size). Sizes alone cannot tell a head size from a length that
    grew to it, at call sites one signature serves (``q @ k.T`` and ``attn @ v``); the storage can."""
    data = getattr(tensor.untyped_storage(), "_neuron", None)
    lengths = _LENGTHS.get(data) if data is not None else None
    if lengths is None:
        return {}
    shape = _PADDED[data]
    by_stride = {st: e for e, st in enumerate(_storage.contiguous_strides(shape)) if shape[e] > 1}
    out = {}
    for d, (n, st) in enumerate(zip(tensor.shape, tensor.stride())):
        e = by_stride.get(st) if n > 1 else None
        if e is not None and n <= shape[e]:
            out[d] = e in lengths
    return out


def kernel_for(op, args, kwargs, leaves):
    """Called on a signature miss: the op's bucketed kernel family when some dim of it varies, else None
    (the op compiles at exact shapes)."""
    factory = FACTORY_KERNELS.get(op)
    if factory is not None:
        return factory(op, args, kwargs, leaves)
    if not _eligible(op, leaves) or not _buckets():
        return None
    written = _written(op, args, kwargs, leaves)
    if written is False:
        return None
    key, shapes = _shapeless(op, leaves)
    seen = _SEEN.get(key)
    if seen is None:  # the sizes of a first sighting stay exact (widths, heads) wherever they recur
        _SEEN[key] = ({n for shape in shapes for n in shape}, [[{n} for n in shape] for shape in shapes])
        return None
    first, per_leaf = seen
    dynamic, family_shapes = [], []
    for position, (per_dim, shape) in enumerate(zip(per_leaf, shapes)):
        dims = []
        parameter = isinstance(leaves.tensors[position], torch.nn.Parameter)
        padded = _padded_dims(leaves.tensors[position]) if not parameter else {}
        for d, n in enumerate(shape):
            sizes = per_dim[d]
            sizes.add(n)
            # the op's sizes at this argument and dim, whatever storages and layouts held the tensor
            across = _OP_SIZES.setdefault((op, position, len(shape), d), set())
            across.add(n)
            # a dim along a bucket's length is a length (a size of the first sighting too: a length
            # reaching the head size); one along a dim of the bucket that is not, never
            if not parameter and _growing(across, n) and padded.get(d, n not in first):
                dims.append(d)
        dynamic.append(tuple(dims))
        family_shapes.append(tuple(None if d in dims else n for d, n in enumerate(shape)))
    if not any(dynamic):
        return None
    family_key = (key, tuple(family_shapes), tuple(map(repr, leaves.floats)))
    family = _FAMILIES.get(family_key)
    if family is None:
        family = _FAMILIES[family_key] = _family(op, args, kwargs, leaves, dynamic, written, family_key)
    if isinstance(family, str):
        return None
    return family if family.fits(leaves) else None


def _family(op, args, kwargs, leaves, dynamic, written, family_key):
    """The op's Family (or the reason it keeps exact shapes) from the op index, where a process before this
    one analysed it: no symbolic trace; else analysed here and stored there."""
    from ..options import Options
    from . import op_index

    options = Options.resolve()
    name = op_index.entry_name(op, ("bucketed family", family_key, tuple(dynamic), written, repr(options.buckets)))
    entry = op_index.load(options, name)
    if entry is not None and entry.get("kind") == "refused":
        return entry["reason"]
    if entry is not None and entry.get("kind") == "family":
        COUNTS["index_hits"] += 1
        return Family.from_entry(op, entry, options, name, dynamic)
    family = _analyze(op, args, kwargs, leaves, dynamic, written)
    if isinstance(family, str):
        op_index.store(options, name, {"kind": "refused", "reason": family})
    else:
        family.name, family.dynamic = name, tuple(dynamic)
        op_index.store(options, name, family.entry())
    return family


def _analyze(op, args, kwargs, leaves, dynamic, written=None):
    """A Family for ``op`` with ``dynamic`` dims symbolic, or the reason it keeps exact shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from ..bucketing.analysis import analyze
    from ..options import Options
    from ..decompositions import decomposition_table
    from ._torch_hooks import plain_dispatch

    options = Options.resolve()
    try:
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        fakes = []
        for tensor, dims in zip(leaves.tensors, dynamic):
            context = StatelessSymbolicContext(dynamic_sizes=[
                DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(tensor.dim())])
            fakes.append(mode.from_tensor(torch.empty(tensor.shape, dtype=tensor.dtype), symbolic_context=context))

        def run(*tensors):
            if written is not None:  # the new contents of the written tensor, functionally
                tensors = list(tensors)
                tensors[written] = tensors[written].clone()
            new_args, new_kwargs = _replace_tensors(args, kwargs, lambda i: tensors[i])
            result = op(*new_args, **new_kwargs)
            return result if written is None else tensors[written]

        with plain_dispatch(), mode:
            fn = run if written is None else torch.func.functionalize(run, remove="mutations_and_views")
            gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="real")(*fakes)
        analysis = analyze(gm, buckets=options.buckets)
    except Exception as exc:  # noqa: BLE001 - a trace that fails keeps exact shapes, never the call
        return _refuse(op, f"the symbolic trace failed ({type(exc).__name__}: {str(exc)[:200]})")
    if not analysis.ok:
        return _refuse(op, analysis.reason)
    if analysis.position_inputs or analysis.position_outputs or analysis.value_symbols:
        return _refuse(op, "the analysis needs checks at each call")
    if any(dim is None for _, dim in analysis.bindings.values()):
        return _refuse(op, "a size symbol no tensor dim gives")
    for layout in analysis.output_layouts:
        if not isinstance(layout, tuple) or any(len(atoms) > 1 for atoms in layout):
            return _refuse(op, f"an output layout it cannot keep as a view ({layout})")
    sym_dims = [(size.node.expr, leaf, d) for leaf, fake in enumerate(fakes) for d, size in enumerate(fake.shape)
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol]
    log.debug("neuron: %s runs bucketed from now on (symbols %s)", op, analysis.symbols)
    family = Family(op, gm, analysis, options, [g.expr for g in shape_env.guards], sym_dims)
    family.written = written
    return family


def _refuse(op, reason: str) -> str:
    log.debug("neuron: %s keeps exact shapes: %s", op, reason)
    return reason


class Family:
    """One op's bucketed kernels: a kernel per bucket (and per the inputs' strides and buffer shapes)."""

    __slots__ = ("op", "gm", "analysis", "options", "guards", "sym_dims", "bind", "kernels", "exact", "_holds",
                 "written", "name", "dynamic")
    # what a Family keeps of the analysis to run its kernels (the op index stores these; the graph it
    # traced is needed again only to trace a kernel at a bucket the index does not have)
    _KEPT = ("symbols", "bindings", "input_layouts", "output_layouts", "checks", "admits", "multiples")

    def __init__(self, op, gm, analysis, options, guards, sym_dims):
        self.op, self.gm, self.analysis, self.options, self.guards = op, gm, analysis, options, guards
        self.sym_dims = sym_dims  # (symbol, leaf, dim) of every symbolic size of the trace
        self.written = None  # the leaf an in-place op writes (its storage a bucket's), or None
        self.bind = [analysis.bindings[s] for s in analysis.symbols]  # symbol -> (leaf, dim)
        self.kernels: dict = {}
        self.exact: dict = {}  # signature -> kernel, for calls the family does not fit
        self._holds: dict = {}
        self.name = None  # its op index entry's name; its kernels' entries are named after it
        self.dynamic = ()  # per tensor leaf, its symbolic dims

    def entry(self) -> dict:
        """The op index entry of this family: what runs its kernels, without the traced graph."""
        return {"kind": "family", "analysis": {k: getattr(self.analysis, k) for k in self._KEPT},
                "guards": self.guards, "sym_dims": self.sym_dims, "written": self.written}

    @classmethod
    def from_entry(cls, op, entry: dict, options, name: str, dynamic) -> "Family":
        from ..bucketing.analysis import BucketAnalysis

        family = cls(op, None, BucketAnalysis(ok=True, **entry["analysis"]), options, entry["guards"],
                     entry["sym_dims"])
        family.written, family.name, family.dynamic = entry["written"], name, tuple(dynamic)
        return family

    def _envs(self, leaves):
        from ..bucketing.sizes import buckets_within

        analysis = self.analysis
        true = tuple(leaves.tensors[leaf].shape[dim] for leaf, dim in self.bind)
        true_env = dict(zip(analysis.symbols, true))
        bucket_env = buckets_within(true_env, analysis.symbols, self.options.buckets, analysis.admits,
                                    analysis.multiples)
        return true, true_env, bucket_env

    def fits(self, leaves) -> bool:
        """The graph traced for the family holds at these sizes and at their bucket (its guards)."""
        sizes = tuple(leaves.tensors[leaf].shape[d] for _, leaf, d in self.sym_dims)
        ok = self._holds.get(sizes)
        if ok is None:
            true, true_env, bucket_env = self._envs(leaves)
            from ..bucketing.sizes import sym_to_value

            try:
                from ..bucketing.sizes import round_up

                # every symbol of the trace at its size here (one size per symbol), and at its bucket
                full: dict = {}
                ok = True
                for symbol, leaf, d in self.sym_dims:
                    n = leaves.tensors[leaf].shape[d]
                    ok = ok and full.setdefault(symbol, n) == n
                by_size = {true_env[x]: bucket_env[x] for x in self.analysis.symbols}
                full_bucket = {x: by_size.get(n, round_up(n, self.options.buckets)) for x, n in full.items()}
                # a guard on a symbol the trace replaced (Eq(s0, s1) unifying two sizes) is in the sizes
                ok = ok and all(bool(sym_to_value(g, env)) for g in self.guards if g.free_symbols <= full.keys()
                                for env in (full, full_bucket))
                if ok and self.analysis.checks:
                    from ..bucketing.padding import check_sizes

                    check_sizes(self.analysis.checks, true_env, bucket_env)  # raises where one fails
            except Exception:  # noqa: BLE001 - a guard we cannot evaluate: exact shapes
                ok = False
            self._holds[sizes] = ok
        return ok

    def _adopt(self, leaves) -> bool:
        """Move a fresh written tensor onto a bucket's storage (its true part, the bucket's strides)."""
        from ..bucketing.padding import padded_size
        from . import _torch_hooks

        tensor = leaves.tensors[self.written]
        data = tensor.untyped_storage()._neuron
        if data in _PADDED or not _fresh(tensor, data):
            return False
        _, _, bucket_env = self._envs(leaves)
        shape = tuple(padded_size(a, bucket_env) for a in self.analysis.input_layouts[self.written])
        if shape == tuple(tensor.shape):
            return False
        bucket = _padded_tensor(tensor.shape, shape, tensor.dtype, None, leaves.index or 0, addressed=True)
        _torch_hooks.place(tensor, bucket.untyped_storage(), 0, tensor.shape, bucket.stride())
        return True

    def _writable(self, leaves) -> bool:
        """The written tensor (if any) at its bucket shape is its storage's whole buffer."""
        if self.written is None:
            return True
        from ..bucketing.padding import padded_size

        tensor = leaves.tensors[self.written]
        data = tensor.untyped_storage()._neuron
        if data not in _PADDED:
            return False
        _, _, bucket_env = self._envs(leaves)
        shape = tuple(padded_size(a, bucket_env) for a in self.analysis.input_layouts[self.written])
        numel = 1
        for n in shape:
            numel *= n
        return (numel == data.numel and tensor.storage_offset() == 0 and all(
            n == 1 or st == want for n, st, want in zip(tensor.shape, tensor.stride(),
                                                        _storage.contiguous_strides(shape))))

    def __call__(self, op, args, kwargs, leaves):
        from ..bucketing.padding import padded_size

        if self.written is not None and active() and self.fits(leaves) and self._adopt(leaves):
            return OPS.dispatch(op, args, kwargs)  # its written tensor is now a bucket's: a new signature
        if not active() or not self.fits(leaves) or not self._writable(leaves):  # exact shapes here
            key = tuple(leaves.parts)
            kernel = self.exact.get(key)
            if kernel is None:
                with OPS._LOCK:
                    kernel = self.exact[key] = OPS._build(op, args, kwargs, leaves)
            if kernel is None:
                return OPS.run_on_host(op, args, kwargs)
            return kernel(leaves) if kernel.__class__.__name__ == "OpKernel" else kernel(op, args, kwargs, leaves)
        true, true_env, bucket_env = self._envs(leaves)
        layouts = self.analysis.input_layouts
        shapes = tuple(tuple(padded_size(a, bucket_env) for a in layouts[p]) if p in layouts else None
                       for p in range(len(leaves.tensors)))
        # a whole buffer's part is its buffer's shape; a view's, without its sizes, its strides and buffer
        key = (shapes, tuple(p if len(p) == 3 else p[:1] + p[2:] for p in leaves.parts
                             if isinstance(p, tuple) and p and isinstance(p[0], torch.dtype)))
        kernel = self.kernels.get(key)
        if kernel is None:
            with OPS._LOCK:
                kernel = self.kernels.get(key)
                if kernel is None:
                    kernel = self.kernels[key] = self._kernel(op, args, kwargs, leaves, shapes, bucket_env, key)
        index = leaves.index or 0
        leaves.sizes = _sizes_buffer(true, index)
        results = kernel._slow(leaves)
        fresh = []
        for (shape, dtype, _), layout, buffer in zip(kernel.fresh, self.analysis.output_layouts, results):
            real = tuple(int(padded_size(a, true_env)) for a in layout)
            fresh.append(_padded_tensor(real, shape, dtype, buffer, index))
        for slot, buffer in zip(kernel.written, results[len(kernel.fresh):]):
            if buffer is not None:
                leaves.datas[slot].set(buffer)
        return rebuild(kernel.returns, fresh, leaves.tensors)

    def _kernel(self, op, args, kwargs, leaves, shapes, bucket_env, key):
        """The kernel at this bucket: from the op index (a process before this one compiled it: nothing
        traced), else traced and compiled, and stored there."""
        from . import op_index

        name = op_index.entry_name(op, ("bucketed kernel", self.name, key)) if self.name else None
        entry = op_index.load(self.options, name) if name else None
        if entry is not None and entry.get("kind") == "kernel":
            kernel = OPS.kernel_from_entry(op, entry, self.options,
                                           lambda: self._trace(op, args, kwargs, leaves, shapes, bucket_env).gm)
            if kernel is not OPS._MISSING:
                return kernel
        kernel = OPS._compile(op, self._trace(op, args, kwargs, leaves, shapes, bucket_env), self.options, name)
        if kernel is None:
            raise NotImplementedError(f"{op}: its bucketed graph does not lower")
        COUNTS["bucketed_ops"] += 1
        return kernel

    def _trace(self, op, args, kwargs, leaves, shapes, bucket_env):
        from torch.fx.experimental.proxy_tensor import make_fx  # noqa: F401 - trace_op's

        from ..bucketing.padding import BucketInterpreter
        from .trace import trace_op

        if self.gm is None:  # a family from the op index: its graph, traced again (the same analysis)
            fresh = _analyze(op, args, kwargs, leaves, self.dynamic, self.written)
            if isinstance(fresh, str):
                raise NotImplementedError(f"{op}: its bucketed family no longer traces ({fresh})")
            self.gm, self.analysis = fresh.gm, fresh.analysis
        interpreter = BucketInterpreter(self.gm, self.analysis, bucket_env)

        written = self.written

        def body(views, sizes):
            out = interpreter.run_with_true_sizes(sizes, *views)
            if written is not None:  # the written tensor's new contents, into its storage
                views[written].copy_(out[0] if isinstance(out, (tuple, list)) else out)
                return views[written]
            return tuple(out) if isinstance(out, (tuple, list)) else out

        body.symbols = self.analysis.symbols
        padded = {p: shape for p, shape in enumerate(shapes) if shape is not None and shape != tuple(leaves.tensors[p].shape)}
        traced = trace_op(op, args, kwargs, leaves, [] if written is None else [written], padded=padded, body=body)
        if any(kind != "fresh" for kind in _kinds(traced.returns)) and written is None:
            raise NotImplementedError(f"{op}: a bucketed op that returns an argument")
        return traced


def _kinds(returns):
    kind, value = returns
    if kind in ("tuple", "list"):
        for r in value:
            yield from _kinds(r)
    elif kind != "const":
        yield kind


def _buckets():
    from ..options import Options

    return Options.resolve().buckets


_SIZES: dict = {}


def _sizes_buffer(true: tuple, index: int):
    key = (true, index)
    buffer = _SIZES.get(key)
    if buffer is None:
        if len(_SIZES) > 512:
            _SIZES.clear()
        buffer = _SIZES[key] = _storage.host_to_buffer(torch.tensor(true, dtype=torch.int64), index)
    return buffer


_PADDED = weakref.WeakKeyDictionary()  # storages (Data) holding a bucket: -> the bucket's shape
_LENGTHS = weakref.WeakKeyDictionary()  # such a storage -> its dims padded past the true size (lengths)


def _padded_tensor(real, shape, dtype, buffer, index: int, addressed: bool = False) -> torch.Tensor:
    """A neuron tensor of sizes ``real``: the leading part of a storage holding ``buffer`` of ``shape``
    (a factory's result is ``addressed``)."""
    from . import _torch_hooks

    real, shape = tuple(real), tuple(shape)
    if real == shape:
        return _storage.new_tensor(shape, dtype, buffer, index=index, addressed=addressed)
    stride = _storage.contiguous_strides(shape)
    numel = 1
    for n in shape:
        numel *= n
    if index or addressed:
        tensor = _torch_hooks.addressed_tensor(real, stride, 0, numel * dtype.itemsize, dtype, index)
    else:
        tensor = _torch_hooks.empty_tensor((numel,), dtype)
        _torch_hooks.meta_redispatch(torch.ops.aten.set_.source_Storage_storage_offset, tensor,
                                     tensor.untyped_storage(), 0, real, stride)
    data = tensor.untyped_storage()._neuron = _storage.Data(dtype, numel, buffer)
    _PADDED[data] = shape
    _LENGTHS[data] = frozenset(d for d, (r, b) in enumerate(zip(real, shape)) if r != b)
    return tensor


_UNALIASED = weakref.WeakKeyDictionary()  # a bucket's storage and its dense copies: Data -> WeakSet of the others


def dense_copy(tensor: torch.Tensor):
    """A contiguous copy at the true sizes of a tensor whose storage is a bucket's, or None: a view CPU's
    contiguous result allows and the bucket's strides do not (a dim padded inside another) is taken of
    it. Unlike CPU's view it does not alias the tensor, so while both live a write to either is an
    error (``check_write``), never a value the other silently misses."""
    data = getattr(tensor.untyped_storage(), "_neuron", None) if tensor.device.type == "neuron" else None
    if data is None or data not in _PADDED:
        return None
    with exact():
        copy = OPS.dispatch(torch.ops.aten.clone.default, (tensor,), {"memory_format": torch.contiguous_format})
    copied = copy.untyped_storage()._neuron
    _UNALIASED.setdefault(data, weakref.WeakSet()).add(copied)
    _UNALIASED.setdefault(copied, weakref.WeakSet()).add(data)
    return copy


def check_write(op, args, kwargs) -> None:
    """Raise where ``op`` writes a storage that has a live dense copy (``dense_copy``), or is one: on CPU
    the two would alias, so the other would see the write; here it would not."""
    tensors = OPS._flat_tensors(args, kwargs)
    for position in OPS._written_positions(op, args, kwargs):
        data = getattr(tensors[position].untyped_storage(), "_neuron", None)
        if data is not None and len(_UNALIASED.get(data, ())):
            raise RuntimeError(
                f"neuron: {op} writes a tensor that CPU would alias with a view of a bucketed tensor, and "
                f"here it does not: the view (a .view() the bucket's strides do not allow) was taken of a "
                f"copy, so the write would not reach the other. Called at {OPS.user_line()}. A bucketed "
                f"tensor holds a length that kept growing (neuron_compile/device/lengths.py); take the "
                f"view of .contiguous() or use .reshape(), or set NEURON_COMPILE_DEVICE_LENGTHS=0.")
