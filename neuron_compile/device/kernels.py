"""The neuron device's own kernels, and the dispatcher fallback that sends every other op to ``ops``.

Kernels of their own: factories (``empty``: no data until written), copies
across the host boundary, ``_to_copy``, ``resize_`` and ``set_``, ``item``,
view ops and in-place view ops (their Meta kernels: metadata only, the storage is
shared), random
ops (drawn by the device's CPU generator, so ``torch.manual_seed`` gives
CPU's numbers), and ``native_dropout`` (the noise CPU's dropout draws).
From the first op on, Dynamo never traces the eager ops' compile stack
(``hide_from_dynamo``).
"""

from __future__ import annotations

import functools

import torch

from . import _torch_hooks, ops
from . import storage as _storage
from .storage import new_tensor

aten = torch.ops.aten

KERNELS: dict = {}


def kernel(*overloads):
    def register(fn):
        for overload in overloads:
            KERNELS[overload] = fn
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
    direct += [aten.convolution_overrideable.default, aten.convolution_backward_overrideable.default,
               aten._to_copy.default, aten.native_layer_norm.default, aten.native_group_norm.default]
    for op in direct:
        _direct.impl(op, functools.partial(handle, op), _torch_hooks.PRIVATE_KEY)
    from runtime.executor import register_device_adapter

    from . import autocast

    autocast.register()  # only neuron tensors reach autocast kernels: none exists before this first op
    register_device_adapter(_torch_hooks.NAME, ops.ExecutorAdapter)
    hide_from_dynamo()


# an eager op's way down to XLA (not neuron_compile.cli, whose built-in models are for compiling)
COMPILE_STACK = ("neuron_compile.device", "neuron_compile.capture", "neuron_compile.lowering",
                 "neuron_compile.decompositions", "neuron_compile.cache_key", "neuron_compile.compiler",
                 "neuron_compile.output_views", "runtime", "passes", "torch_mlir", "jax", "jaxlib")
_hidden = False


def hide_from_dynamo() -> None:
    """Dynamo never compiles a frame of the eager ops' compile stack. Inside a compiled function, C++ calls
    our kernels from stretches that run eagerly (a module Dynamo skips, as it does ``nn.LSTM``, or falls
    back from; DDP's reducer): Dynamo would compile each of their frames, to no graph, up to its
    recompile limit, and failed doing so. Dynamo is loaded by then (tracing an op imports it)."""
    global _hidden
    if _hidden:
        return
    for package in COMPILE_STACK:
        _torch_hooks.skip_in_dynamo(package)
    _hidden = True


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
    fn = KERNELS.get(op)
    if fn is None:
        fn = KERNELS[op] = (_view if _is_view(op) else _inplace_view if _is_inplace_view(op) else
                           _random if _is_random(op) else _compiled_for(op))
    return fn(op, *args, **kwargs)


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
    # the dtype eager computes a tensor-and-wrapped-number op in: a 0-d tensor of it behaves the same
    dtype = torch.result_type(reference, value) if reference is not None else torch.tensor(value).dtype
    if wide and position == 1 and type(value) is float and dtype in (torch.bfloat16, torch.float16) \
            and reference.dim() > 0:  # (a 0-d float32 one would make a 0-d tensor's product float32)
        dtype = torch.float32  # ATen multiplies a half tensor by the number in float32, unrounded
    return args[:position] + (torch.tensor(value, dtype=dtype),) + args[position + 1:]


@functools.lru_cache(maxsize=None)
def _is_view(op) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns) \
        and not op._schema.is_mutable


def _view(op, *args, **kwargs):
    return _torch_hooks.meta_redispatch(op, *args, **kwargs)


def _is_inplace_view(op) -> bool:
    return torch.Tag.inplace_view in op.tags


def _inplace_view(op, tensor, *args, **kwargs):
    """``as_strided_`` (what ``transpose_``, ``t_``, ``unsqueeze_``... run): the tensor's new size, stride and
    offset, from the op on a meta tensor over a storage as large as ours (the same bounds checks), set
    on its storage (``place``: the Meta ``as_strided_`` alone takes only an addressed storage)."""
    numel = _storage.data_of(tensor).numel
    meta = torch.empty(numel, dtype=tensor.dtype, device="meta").as_strided(
        tensor.shape, tensor.stride(), tensor.storage_offset())
    op(meta, *args, **kwargs)
    return _torch_hooks.place(tensor, tensor.untyped_storage(), meta.storage_offset(), meta.shape, meta.stride())


# --- factories -------------------------------------------------------------------------------

def _dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


def check_device(device) -> None:
    if device is not None:
        device = torch.device(device)
        if device.type == "neuron" and device.index not in (None, 0):
            raise RuntimeError(f"neuron device {device.index} is out of range: there is 1 neuron device (neuron:0)")


@kernel(aten.empty.memory_format)
def _empty(op, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    check_device(device)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
        return new_tensor(size, _dtype(dtype), stride=stride, addressed=True)
    return new_tensor(size, _dtype(dtype), addressed=True)


@kernel(aten.empty_strided.default)
def _empty_strided(op, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    check_device(device)
    return new_tensor(tuple(size), _dtype(dtype), stride=tuple(stride), addressed=True)


# --- moving data -----------------------------------------------------------------------------

@kernel(aten.copy_.default)
def _copy(op, dst, src, non_blocking=False):
    dst_neuron, src_neuron = dst.device.type == "neuron", src.device.type == "neuron"
    if dst_neuron and src_neuron:
        if dst.numel() == 0:
            return dst
        data, source = _storage.data_of(dst), _storage.data_of(src)
        # buffers are immutable: a whole-storage copy of an equal tensor shares the buffer
        buffer = _storage.own_buffer(src, source)
        if buffer is not None and src.dtype == dst.dtype and src.shape == dst.shape and ops.whole(dst, data):
            data.set(buffer)
            return dst
        return ops.dispatch(op, (dst, src), {})
    if dst_neuron:
        ops.copy_into(dst, src)
        return dst
    dst.copy_(ops.to_host(src))
    return dst


@kernel(aten._copy_from.default)
def _copy_from(op, src, dst, non_blocking=False):
    return _copy(aten.copy_.default, dst, src, non_blocking)


@kernel(aten._copy_from_and_resize.default)
def _copy_from_and_resize(op, src, dst):
    if dst.shape != src.shape:
        if dst.device.type == "neuron":
            ops.resize_(dst, src.shape)
        else:
            dst.resize_(src.shape)
    return _copy(aten.copy_.default, dst, src)


@kernel(aten._to_copy.default)
def _to_copy(op, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    check_device(device)
    target = torch.device(device) if device is not None else x.device
    if target.type == "cpu":
        return aten._to_copy.default(ops.to_host(x), dtype=dtype, memory_format=memory_format)
    if target.type != "neuron":
        raise RuntimeError(f"neuron tensors move to cpu or neuron, not {target}")
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    result = ops.dispatch(op, (x,), kwargs)
    # model.half() on the device makes its new parameters here: they need storages of their own
    moved = new_tensor(result.shape, result.dtype, stride=result.stride(), offset=result.storage_offset(),
                       addressed=True)
    moved.untyped_storage()._neuron = _storage.data_of(result)
    return moved


@kernel(aten._local_scalar_dense.default)
def _item(op, x):
    return ops.to_host(x).item()


# --- storage surgery -------------------------------------------------------------------------

@kernel(aten.resize_.default)
def _resize(op, tensor, size, memory_format=None):
    return ops.resize_(tensor, size, memory_format)


@kernel(aten.set_.source_Tensor, aten.set_.source_Storage, aten.set_.source_Storage_storage_offset)
def _set(op, tensor, source, *args, **kwargs):
    source_storage = source if isinstance(source, torch.UntypedStorage) else source.untyped_storage()
    if not hasattr(source_storage, "_neuron"):
        raise RuntimeError("set_ onto a storage that is not a neuron storage")
    if source_storage.resizable():
        return _torch_hooks.meta_redispatch(op, tensor, source, *args, **kwargs)
    # an addressed storage (``_torch_hooks.addressed_tensor``): ``place`` takes any of them
    if op is aten.set_.source_Tensor:
        where = (source.storage_offset(), source.shape, source.stride())
    elif op is aten.set_.source_Storage:
        where = (0, (source_storage.nbytes() // tensor.dtype.itemsize,), (1,))
    else:
        where = _offset_size_stride(*args, **kwargs)
    return _torch_hooks.place(tensor, source_storage, *where)


def _offset_size_stride(storage_offset, size, stride=()):
    """``set_.source_Storage_storage_offset``'s arguments; the dispatcher leaves out a stride equal to its
    default ``[]``, which means contiguous (``torch.load`` rebuilds a 0-d tensor with ``stride=()``)."""
    return storage_offset, tuple(size), tuple(stride) or _storage.contiguous_strides(size)


@kernel(aten.set_.default)
def _set_empty(op, tensor):
    _torch_hooks.meta_redispatch(op, tensor)
    tensor.untyped_storage()._neuron = _storage.Data(tensor.dtype, 0)
    return tensor


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


@kernel(aten._index_put_impl_.default, aten.index_put_.default, aten.index_put.default)
def _index_put(op, x, indices, values, *args, **kwargs):
    # x[mask] = values with one value per selected element: how many there are depends on the mask's
    # data, so the host writes them; a value broadcast over the mask is a select, compiled as one
    masks = [i for i in indices if i is not None and i.dtype in (torch.bool, torch.uint8)]
    if masks and (len(indices) != 1 or values.dim() > x.dim() - masks[0].dim()):
        return ops.run_on_host(op, (x, indices, values) + args, kwargs)
    return ops.dispatch(op, (x, indices, values) + args, kwargs)


@kernel(aten._conj.default, aten._neg_view.default)
def _lazy_bit_view(op, x):
    # CPU marks a conj/neg bit on a view; their Meta kernels crash on our tensors: the value instead
    # (its own storage: a write through it does not reach x)
    physical = aten.conj_physical.default if op is aten._conj.default else aten.neg.default
    return ops.dispatch(physical, (x,), {})


@kernel(aten.view.dtype)
def _view_dtype(op, x, dtype):
    # a bitcast: its own storage (writes through it do not reach x)
    if dtype == x.dtype:
        return _view(aten.alias.default, x)
    return ops.from_host(ops.to_host(x).view(dtype))


# --- random ops ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _is_random(op) -> bool:
    return any(a.name == "generator" for a in op._schema.arguments) or op in (aten.native_dropout.default,)


def generator() -> torch.Generator:
    """The device draws from CPU's default generator: a script that seeds and draws in the same order
    gets on neuron the very numbers CPU eager gets (dropout masks included)."""
    return torch.default_generator


def _random(op, *args, **kwargs):
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
        rest = [ops.to_host(a) for a in args[1:]]
        op(host, *rest, **kwargs)
        ops.copy_into(target, host)
        return target
    return ops.run_on_host(op, args, kwargs)


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
    out = aten.mul.Tensor(x, ops.from_host(scaled))
    return out, ops.from_host(mask)
