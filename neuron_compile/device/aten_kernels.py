"""The neuron device's own kernels, and the dispatcher fallback that sends every other op to ``ops``.

Kernels of their own: factories (``empty``: no data until written), copies
across the host boundary (``copy_``, which also computes the values of torch's
lazy conjugate and negative views: ``x.conj()``, ``x.conj().imag``),
``_to_copy``, ``item``, view ops (their Meta kernels: metadata only, the
storage is shared), the in-place view ops (``torch.Tag.inplace_view``:
``resize_``, ``set_`` and ``as_strided_``, which ``t_``, ``transpose_``,
``squeeze_``... call; they change the tensor's size, stride and offset on its
storage, never traced as a graph), random
ops (drawn by CPU's generator, so ``torch.manual_seed`` gives CPU's numbers;
inside a DTensor random op on a neuron mesh, from the device's Philox stream:
``rng.py``), ``native_dropout`` (the noise CPU's dropout draws), and
advanced indexing (``index``, ``index_put_``: CPU index tensors are moved to
the device as ATen moves them; a boolean mask's selection runs on the host).
From the first op on, Dynamo never traces the eager ops' compile stack
(``neuron_compile.dynamo_skips``).
"""

from __future__ import annotations

import functools
import sys

import torch

from . import _torch_hooks, grown, lengths, op_tracking, ops, rng, transfers, whole_ops
from . import issuers as _issuers
from . import storage as _storage
from .storage import device_index, new_tensor

aten = torch.ops.aten

KERNELS: dict = {}
op_tracking.KERNELS = KERNELS  # names the ops it counts by id (it imports nothing of the device)


def kernel(*overloads):
    def register(fn):
        for overload in overloads:
            KERNELS[overload] = fn
            _BY_ID.pop(id(overload), None)
        return fn

    return register


_direct = None


def register_direct_kernels() -> None:
    """Give every op whose only kernel for us would be the structured ``empty`` + ``op.out`` composite
    (``CompositeExplicitAutogradNonFunctional``: add, mul, eq... 442 ops) a direct neuron kernel: one
    dispatch and one executable instead of three dispatches and an ``out=`` resize."""
    global _direct
    if _direct is not None:
        return
    _direct = torch.library.Library("aten", "IMPL")
    direct = [op for op in _registered_for("CompositeExplicitAutogradNonFunctional") if not _is_view(op)]
    # torch's foreach kernels for a backend without its own are loops of one op per tensor (an AdamW
    # step over GPT-2's 52 parameters ran 315 executables); one foreach call is one executable here
    direct += [op for op in _registered_for("CompositeExplicitAutograd")
               if op.__name__.startswith("_foreach_") and not op._overloadname.endswith("out")]
    # their CompositeExplicitAutograd kernels only raise "not implemented" for backends like ours
    # _to_copy's composite pins host memory for non_blocking copies to the CPU (a C++ allocator we lack)
    # native_layer_norm's and native_group_norm's composites (for backends with no kernel of their own)
    # run them as native_batch_norm in the input's dtype; CPU's kernels (and our table's decompositions)
    # compute in float32 and round once: in bfloat16, half of a layer norm's outputs were an ulp off
    # copy_'s composite sends a copy for our device to _copy_from, which torch's conjugate and negative
    # bit fallbacks do not pass through: they resolve the bit with clone, whose copy_ is _copy_from again
    # (x.conj().cpu() recursed until the stack overflowed); copy_ itself is theirs to pass through
    direct += [aten.convolution_overrideable.default, aten.convolution_backward_overrideable.default,
               aten._to_copy.default, aten.native_layer_norm.default, aten.native_group_norm.default,
               aten.copy_.default]
    # functional ops whose CompositeExplicitAutograd kernel is ``empty`` + a resize + the ``out=`` variant
    # (``x.abs()``: three dispatches and a resize, 4x an add's cost), or a loop of ops (``stack``: one view
    # per tensor and a cat): one dispatch and one executable each. Pure math, no factory, view or RNG
    direct += [getattr(getattr(aten, name), overload) for name, overload in _OUT_WRAPPED
               if hasattr(getattr(aten, name, None), overload)]
    for op in direct:
        _direct.impl(op, functools.partial(handle, op), _torch_hooks.PRIVATE_KEY)
    # nn.LSTM/GRU/RNN and scaled_dot_product_attention: one op forward and one backward, not their pieces
    whole_ops.register(_direct)
    from neuron_compile.runtime.executor import register_device_adapter

    from . import autocast

    autocast.register()  # only neuron tensors reach autocast kernels: none exists before this first op
    register_device_adapter(_torch_hooks.NAME, ops.ExecutorAdapter)
    # the thread of the first op (the script's) runs its backward passes itself, as for CPU tensors: the
    # autograd engine's worker thread for the device cost two thread hand-offs a backward (a two-node
    # backward took 160-220 us against 60-100), and ops it issues need no other thread's ordering
    _torch_hooks.backward_on_calling_thread()
    if "torch._dynamo" in sys.modules:  # not imported for an eager-only process (about a second)
        # inside a compiled function, a module Dynamo skips (nn.LSTM) runs its ops through our kernels;
        # a torch.compile that comes later hides them when it looks our backend up
        from ..dynamo_skips import hide_compile_stack_from_dynamo

        hide_compile_stack_from_dynamo()


_OUT_WRAPPED = (
    ("abs", "default"), ("logical_not", "default"), ("logical_and", "default"), ("logical_or", "default"),
    ("logical_xor", "default"), ("isinf", "default"), ("nan_to_num", "default"), ("deg2rad", "default"),
    ("rad2deg", "default"), ("sum", "default"), ("mean", "default"), ("logsumexp", "default"), ("mv", "default"),
    ("addr", "default"), ("copysign", "Scalar"), ("add", "Scalar"), ("sub", "Scalar"),
    ("mul", "Scalar"), ("div", "Scalar"), ("div", "Scalar_mode"), ("floor_divide", "Scalar"),
    ("binary_cross_entropy_with_logits", "default"), ("all", "dims"), ("any", "dims"), ("stack", "default"),
    ("constant_pad_nd", "default"), ("count_nonzero", "default"),
    ("celu", "default"))
# not dist, norm: their kernels gave wrong numbers for complex inputs where torch's composites raise a
# lowering error
# not clone: torch's conjugate and negative-bit fallbacks pass clone through (its composite resolves the
# bit in copy_), so a kernel of its own got z.conj() with the bit and copied z (test_device_copies)
# not zeros_like, ones_like, full_like: as empty + zero_/fill_ over a whole storage they take a constant
# buffer storages share and run no executable (test_device_semantics), which a kernel of their own would


def _registered_for(key: str) -> list:
    """The aten op overloads with a kernel registered for the dispatch key ``key``."""
    ops_ = []
    for name in torch._C._dispatch_get_registrations_for_dispatch_key(key):
        if not name.startswith("aten::"):
            continue
        packet, _, overload = name.removeprefix("aten::").partition(".")
        ops_.append(getattr(getattr(aten, packet), overload or "default"))
    return ops_


def handle(op, *args, **kwargs):
    """The PrivateUse1 fallback: every op without a kernel registered for ``neuron``."""
    if _direct is None:
        register_direct_kernels()
    if lengths._UNALIASED and transfers._writes(op):  # a view copied from a bucket lives: no write may miss it
        lengths.check_write(op, args, kwargs)
    ident = id(op)
    op_tracking.EXECUTED[ident] += 1  # torch.neuron.get_executed_ops()
    fn = _BY_ID.get(ident)
    if fn is None:
        fn = KERNELS.get(op)
        if fn is None:
            fn = KERNELS[op] = _view_for(op) if _is_view(op) else _random if _is_random(op) else _compiled_for(op)
        _BY_ID[ident] = fn  # KERNELS holds the op: its id names no other while it lives
    return fn(op, *args, **kwargs)


# KERNELS by the op's id (an OpOverload's hash is a Python method: three of them a call cost a microsecond)
_BY_ID: dict = {}
_issuers.HANDLE = handle.__code__  # where a queued op's issuer walk starts (issuers.issuer)


def _compiled(op, *args, **kwargs):
    return ops.dispatch(op, args, kwargs)


def _compiled_for(op):
    """``_compiled``, or for ops with Tensor arguments a kernel that first turns Python numbers in them
    back into tensors: torch hands a Python kernel a wrapped number (``remainder(x, 4)`` calls
    ``remainder.Tensor(x, wrapped 4)``) as the number itself."""
    positions = tuple(i for i, a in enumerate(op._schema.arguments)
                      if not a.kwarg_only and isinstance(a.type, torch.TensorType))
    if not positions:
        return _compiled

    wide = op._schema.name in ("aten::mul", "aten::mul_", "aten::div", "aten::div_") and \
        op._overloadname in ("Tensor", "out")

    def compiled(op, *args, **kwargs):
        for i in positions:
            if i < len(args) and type(args[i]) in (int, float, bool):
                args = _unwrap_number(args, i, wide)
        return ops.dispatch(op, args, kwargs)

    return compiled


def _unwrap_number(args: tuple, position: int, wide: bool = False) -> tuple:
    value = args[position]
    reference = next((a for a in args if isinstance(a, torch.Tensor)), None)
    # the same number beside a tensor of the same dtype and rank-zero-ness is the same 0-d tensor: kept
    # (a loop's ``x * 0.5`` made one per call: a third of the op's cost). Only read: a wrapped number is
    # an input, never written (an in-place op's self and ``out=`` are tensors)
    key = (type(value), repr(value), position, wide,
           None if reference is None else (reference.dtype, reference.dim() == 0))
    number = _NUMBERS.get(key)
    if number is None:
        if len(_NUMBERS) > 1024:
            _NUMBERS.clear()
        number = _NUMBERS[key] = _number_tensor(value, reference, position, wide)
    return args[:position] + (number,) + args[position + 1:]


_NUMBERS: dict = {}


def _number_tensor(value, reference, position: int, wide: bool) -> torch.Tensor:
    # the dtype eager computes a tensor-and-wrapped-number op in: a 0-d tensor of it behaves the same
    dtype = torch.result_type(reference, value) if reference is not None else torch.tensor(value).dtype
    if wide and position == 1 and type(value) is float and dtype in (torch.bfloat16, torch.float16) \
            and reference.dim() > 0:  # (a 0-d float32 one would make a 0-d tensor's product float32)
        dtype = torch.float32  # ATen multiplies a half tensor by the number in float32, unrounded
    return torch.tensor(value, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _is_view(op) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns) \
        and not op._schema.is_mutable


def _view_for(op):
    """The kernel of a view op: its Meta kernel on the neuron tensors (a view of the same storage), called
    through the boxed redispatch (``OpOverload.redispatch`` is two Python frames over it)."""
    meta = _torch_hooks.meta_redispatcher(op)

    def view(op, *args, **kwargs):
        try:
            return meta(*args, **kwargs)
        except RuntimeError:
            # a bucketed result padded along an inner dim has the bucket's strides, which a view CPU's
            # contiguous result allows may not: that view of a dense copy (lengths.dense_copy)
            dense = lengths.dense_copy(args[0]) if args and isinstance(args[0], torch.Tensor) else None
            if dense is None:
                raise
            return meta(dense, *args[1:], **kwargs)

    return view


_view = _view_for(aten.view.default)


def unsafe_view(tensor, size):
    """``aten::_unsafe_view`` of a neuron tensor: ``view`` (``_view``: of a dense copy where a bucketed
    tensor's strides refuse it). CPU's composite kernel computes the strides itself, past the device's
    ``view``: C++ ``reshape`` clones a tensor it cannot view and ``_unsafe_view``s the clone, which a growing
    length leaves on a bucket's storage (an embedding of a batch of growing ids failed so)."""
    return _view(aten.view.default, tensor, size)


# --- factories -------------------------------------------------------------------------------

def _dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


@kernel(aten.empty.memory_format)
def _empty(op, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    index = device_index(device)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
        return new_tensor(size, _dtype(dtype), stride=stride, addressed=True, index=index)
    padded = grown.empty_padded(size, _dtype(dtype), index)  # at a length that keeps changing: its bucket
    return padded if padded is not None else new_tensor(size, _dtype(dtype), addressed=True, index=index)


@kernel(aten.empty_strided.default)
def _empty_strided(op, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return new_tensor(tuple(size), _dtype(dtype), stride=tuple(stride), addressed=True, index=device_index(device))


@kernel(aten._efficientzerotensor.default)
def _zero_tensor(op, size, dtype=None, layout=None, device=None, pin_memory=None):
    # autograd's zero gradients (gradgradcheck's): CPU's is a ZeroTensor, which has no data to copy over;
    # plain zeros here (the ZeroTensor is an optimization: its values are the same)
    return torch.zeros(size, dtype=_dtype(dtype), device=torch.device("neuron", device_index(device)))


@kernel(aten.zero_.default, aten.fill_.Scalar)
def _fill_(op, tensor, value=0):
    # a tensor over its whole storage (torch.zeros, ones, full, autograd's zero gradients of unused outputs)
    # takes a constant buffer storages share (storage.shared_constant), at its shape: no executable, no
    # allocation, and an op reads it as the storage's own buffer (so may take it in place: donation)
    data = _storage.data_of(tensor)
    buffer = None
    if type(value) in (int, float, bool):
        if transfers.whole(tensor, data):
            buffer = _storage.shared_constant(data.numel, data.dtype, value, tensor.device.index or 0, tensor.shape)
        elif grown.fill_bucket(tensor, value):  # a factory at a growing length: its whole bucket
            return tensor
    if buffer is None:
        return ops.dispatch(op, (tensor,) if op is aten.zero_.default else (tensor, value), {})
    data.set(buffer)
    return tensor


# --- moving data -----------------------------------------------------------------------------

@kernel(aten.copy_.default)
def _copy(op, dst, src, non_blocking=False):
    if dst.is_conj() or dst.is_neg() or src.is_conj() or src.is_neg():
        return _copy_math_bits(dst, src, non_blocking)
    dst_neuron, src_neuron = dst.device.type == "neuron", src.device.type == "neuron"
    if dst_neuron and src_neuron and dst.device.index != src.device.index:
        # between neuron devices (neuron:0 -> neuron:1): through the host, as the transfer API goes
        transfers.copy_into(dst, transfers.to_host(src))
        return dst
    if dst_neuron and src_neuron:
        if dst.numel() == 0:
            return dst
        data, source = _storage.data_of(dst), _storage.data_of(src)
        # buffers are immutable: a whole-storage copy of an equal tensor shares the buffer (a queued op's
        # pending result too: both storages then hold it, op_queue)
        buffer = source._buffer
        if (_storage.is_whole_buffer(src, source, buffer) and src.dtype == dst.dtype and src.shape == dst.shape
                and transfers.whole(dst, data)):
            data.set(buffer)
            return dst
        return ops.dispatch(op, (dst, src), {})
    if dst_neuron:
        transfers.copy_into(dst, src)
        return dst
    dst.copy_(transfers.to_host(transfers.alone(src)))
    return dst


def _copy_math_bits(dst, src, non_blocking=False):
    """``copy_`` where a side is a view with torch's lazy conjugate or negative bit (``x.conj()``,
    ``x.conj().imag``): the values are computed on bit-free views, as CPU's copy kernel does. Every op
    that reads such a view gets it materialized by torch's fallback for the bit, through ``clone``, so
    through this copy. A write through a bit stores the value seen through the bit (each is its own
    inverse): an in-place op on ``x.conj()`` reaches ``x`` conjugated, as on CPU."""
    target = dst
    if dst.is_conj():
        target, src = target.conj(), src.conj()  # .conj() and ._neg_view() flip the bit: a view of the same data
    if dst.is_neg():
        target, src = target._neg_view(), src._neg_view()
    if src.is_neg():
        src = aten.neg.default(src._neg_view())
    if src.is_conj():
        src = aten.conj_physical.default(src.conj())
    _copy(aten.copy_.default, target, src, non_blocking)
    return dst


@kernel(aten._copy_from.default)
def _copy_from(op, src, dst, non_blocking=False):
    return _copy(aten.copy_.default, dst, src, non_blocking)


@kernel(aten._copy_from_and_resize.default)
def _copy_from_and_resize(op, src, dst):
    if dst.shape != src.shape:
        if dst.device.type == "neuron":
            transfers.resize_(dst, src.shape)
        else:
            dst.resize_(src.shape)
    return _copy(aten.copy_.default, dst, src)


@kernel(aten._to_copy.default)
def _to_copy(op, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if type(x) not in (torch.Tensor, torch.nn.Parameter):
        # a subclass's Python attributes may not be a tensor's (a lazy module's UninitializedParameter
        # raises on ``.shape``): copy the plain tensor C++ kernels see (its empty data, for a lazy one)
        with torch._C.DisableTorchFunctionSubclass():
            x = torch.Tensor.as_subclass(x, torch.Tensor)
    target = torch.device(device) if device is not None else x.device
    if target.type == "cpu":
        return aten._to_copy.default(transfers.to_host(transfers.alone(x)), dtype=dtype, memory_format=memory_format)
    if target.type != "neuron":
        raise RuntimeError(f"neuron tensors move to cpu or neuron, not {target}")
    index = device_index(target)
    if x.device.type == "neuron" and index != x.device.index:  # to another neuron device: a copy there
        out = new_tensor(x.shape, dtype or x.dtype, addressed=True, index=index)
        return _copy(aten.copy_.default, out, x)
    if x.device.type == "cpu" and x.layout == torch.strided and not (x.is_quantized or x.is_conj() or x.is_neg()):
        # a host tensor onto the device (``.to("neuron")``, ``torch.tensor(data, device=...)``: a transformers
        # cache makes two a layer each forward): one transfer, no host copy first unless a dtype or a
        # memory format asks for one
        if (dtype is not None and dtype != x.dtype) or memory_format not in (None, torch.preserve_format):
            x = aten._to_copy.default(x, dtype=dtype, memory_format=memory_format)
        return transfers.from_host(x, index, addressed=True)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    if x.device.type != "neuron" and index:
        kwargs["device"] = target  # a host tensor: made on the host, then moved to neuron:index
    result = ops.dispatch(op, (x,), kwargs)
    # model.half() on the device makes its new parameters here: they need storages of their own
    moved = new_tensor(result.shape, result.dtype, stride=result.stride(), offset=result.storage_offset(),
                       addressed=True, index=index)
    moved.untyped_storage()._neuron = _storage.data_of(result)
    return moved


@kernel(aten._local_scalar_dense.default)
def _item(op, x):
    data = _storage.data_of(x)
    if data.numel == 1 and data.dtype is x.dtype and data._buffer is not None:  # a loss, a norm, a count
        value = _storage.buffer_number(data.buffer, x.dtype)
        if value is not None:
            transfers.COUNTS["host_copies"] += 1
            return value
    return transfers.to_host(transfers.alone(x)).item()


# --- storage surgery -------------------------------------------------------------------------

@kernel(aten.resize_.default)
def _resize(op, tensor, size, memory_format=None):
    return transfers.resize_(tensor, size, memory_format)


@kernel(aten.as_strided_.default)
def _as_strided_(op, tensor, size, stride, storage_offset=None):
    # what t_, transpose_, squeeze_... come to. The Meta as_strided_ checks the bounds against the
    # storage's byte size, which only an addressed storage has (an op result's is 0 bytes): it runs on a
    # meta tensor over a storage as large as the data (CPU's checks and messages), then ``place`` sets
    # the metadata on ours
    data = _storage.data_of(tensor)
    meta = torch.empty(data.numel * data.dtype.itemsize // tensor.dtype.itemsize, dtype=tensor.dtype,
                       device="meta").as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    op(meta, size, stride, storage_offset)
    return _torch_hooks.place(tensor, tensor.untyped_storage(), meta.storage_offset(), meta.shape, meta.stride())


@kernel(aten.set_.source_Tensor, aten.set_.source_Storage, aten.set_.source_Storage_storage_offset)
def _set(op, tensor, source, storage_offset=0, size=None, stride=()):
    storage = source if isinstance(source, torch.UntypedStorage) else source.untyped_storage()
    if storage.device.type != "neuron":
        raise RuntimeError(f"{op}: the source is not a neuron storage (move it with .to('neuron') first)")
    data = _storage.storage_data(storage)  # raises for a storage without data (a slice of a neuron storage)
    if op is aten.set_.source_Tensor:
        storage_offset, size, stride = source.storage_offset(), source.shape, source.stride()
    elif op is aten.set_.source_Storage:
        # the data's size: only an addressed storage object has a byte size; an op result's has 0
        size, stride = (data.numel * data.dtype.itemsize // tensor.dtype.itemsize,), (1,)
    elif not stride:
        stride = _storage.contiguous_strides(size)
    return _torch_hooks.place(tensor, storage, storage_offset, size, stride)


@kernel(aten.set_.default)
def _set_empty(op, tensor):
    # a storage of its own, empty (the Meta set_() would set_ a Meta storage)
    return _torch_hooks.place(tensor, new_tensor((0,), tensor.dtype, index=tensor.device.index).untyped_storage(),
                              0, (0,), (1,))


# --- convolution: PyTorch sends an unknown backend's convolutions to the *_overrideable ops ---

@kernel(aten.convolution_overrideable.default)
def _convolution(op, *args):
    return ops.dispatch(aten.convolution.default, args, {})


@kernel(aten.convolution_backward_overrideable.default)
def _convolution_backward(op, grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return ops.dispatch(aten.convolution_backward.default,
                        (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask), {})


# --- advanced indexing: x[index], x[index] = v ------------------------------------------------

def _masks(indices) -> list:
    return [i for i in indices if i is not None and i.dtype in (torch.bool, torch.uint8)]


def _indices_on_device(indices) -> list:
    """Index tensors on the host copied to the device, as ATen's advanced indexing does (``make_info`` in
    ``TensorAdvancedIndexing.cpp`` moves every index to ``self``'s device): ``x[cpu_index]`` works on
    CUDA, and so here. Only ``index`` and the ``index_put`` family do this: ``index_select``, ``gather``,
    ``masked_fill``... with a CPU index raise, as on CUDA."""
    return [transfers.from_host(i) if i is not None and i.device.type == "cpu" else i for i in indices]


@kernel(aten.index.Tensor)
def _index(op, x, indices):
    # x[mask]: how many elements it selects depends on the mask's data, so the host answers; with no index
    # at all, CPU's own check does (an IndexError, where the meta kernel's is a RuntimeError)
    if not indices or _masks(indices):
        return transfers.run_on_host(op, (x, indices), {})
    return ops.dispatch(op, (x, _indices_on_device(indices)), {})


@kernel(aten._index_put_impl_.default, aten.index_put_.default, aten.index_put.default)
def _index_put(op, x, indices, values, *args, **kwargs):
    # x[mask] = values with one value per selected element: how many there are depends on the mask's
    # data, so the host writes them; a value broadcast over the mask is a select, compiled as one
    # no index at all (``x.index_put([], v)``): CPU's checks judge it (the meta kernel's do not, and Torch-MLIR's
    # lowering of the graph it traced crashed the process: PyTorch's test_index_put_accumulate_empty)
    masks = _masks(indices)
    if not indices or masks and (len(indices) != 1 or values.dim() > x.dim() - masks[0].dim()):
        return transfers.run_on_host(op, (x, indices, values) + args, kwargs)
    return ops.dispatch(op, (x, _indices_on_device(indices), values) + args, kwargs)


@kernel(aten.index_fill.int_Scalar, aten.index_fill_.int_Scalar)
def _index_fill(op, x, dim, index, value):
    # CPU's check, which the meta kernel a trace runs lacks: an integer tensor was filled with the complex
    # value's real part, silently, and a float one failed to lower (PyTorch's test_index_fill)
    if isinstance(value, complex) and not x.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    return ops.dispatch(op, (x, dim, index, value), {})


# --- random ops ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _is_random(op) -> bool:
    return any(a.name == "generator" for a in op._schema.arguments) or op in (aten.native_dropout.default,)


def generator() -> torch.Generator:
    """Plain random ops on the device draw from CPU's default generator: a script that seeds and draws in
    the same order gets on neuron the very numbers CPU eager gets (dropout masks included). DTensor's draw
    from the device's Philox state (``rng.py``)."""
    return torch.default_generator


def _random(op, *args, **kwargs):
    if rng.drawing():  # a DTensor random op on a neuron mesh: its shard of the device's Philox stream
        return rng.draw(op, args, kwargs)
    if op is aten.native_dropout.default:
        return _native_dropout(*args, **kwargs)
    if kwargs.get("generator") is None:
        kwargs["generator"] = generator()
    schema = op._schema
    first = schema.arguments[0] if schema.arguments else None
    if first is not None and first.alias_info is not None and first.alias_info.is_write and args and \
            schema.name.endswith("_") and op not in (aten.bernoulli_.Tensor,):
        # in-place fills (normal_, uniform_, random_...): the old contents are not read
        target = args[0]
        host = torch.empty(target.shape, dtype=target.dtype)
        rest = [transfers.to_host(a) for a in args[1:]]
        op(host, *rest, **kwargs)
        transfers.copy_into(target, host)
        return target
    return transfers.run_on_host(op, args, kwargs)


def _native_dropout(x, p, train):
    if not train or p == 0 or x.numel() == 0:
        return aten.clone.default(x), aten.ones_like.default(x, dtype=torch.bool)
    # what CPU's dropout draws: noise = empty_like(x).bernoulli_(1 - p); noise /= 1 - p; x * noise
    noise = torch.empty(x.shape, dtype=x.dtype).bernoulli_(1 - p, generator=generator())
    mask = noise.bool()
    if p == 1:
        scaled = noise.mul_(0)
    else:
        scaled = noise.div_(1 - p)
    out = aten.mul.Tensor(x, transfers.from_host(scaled, x.device.index))
    return out, transfers.from_host(mask, x.device.index)
