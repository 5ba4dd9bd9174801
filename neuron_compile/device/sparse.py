"""Sparse COO tensors on ``neuron``: their ops run on host copies, their indices and values stay on the device.

A sparse tensor on the device is torch's own ``SparseTensorImpl`` under the
``SparsePrivateUse1`` key, holding two dense ``neuron`` tensors (indices and
values); torch builds it with its device-generic kernel (the one it registers
for ``SparseMeta``). No op of it is compiled: the dispatcher's
``SparsePrivateUse1`` fallback (``handle``) copies every sparse and dense
``neuron`` argument to the host, runs the op there with CPU's kernels, copies
the results back (sparse ones rebuilt on the device) and writes back the
arguments the op mutates. ``_to_sparse`` of a dense ``neuron`` tensor goes the
same way. Enough for SparseAdam and for ``Embedding(sparse=True)``'s
gradients; nothing here is fast.
"""

from __future__ import annotations

import torch

_DK = torch._C.DispatchKey
_library = None


def _meta_impl(name: str, overload: str = "default"):
    """torch's device-generic kernel of a sparse op (``_indices_sparse``, ``new_with_dims_and_tensor_sparse``...)."""
    op = getattr(getattr(torch.ops.aten, name), overload)
    return lambda *args, **kwargs: op._op_dk(_DK.SparseMeta, *args, **kwargs)


_indices = _meta_impl("_indices")
_values = _meta_impl("_values")
_sparse_dim = _meta_impl("sparse_dim")
_dense_dim = _meta_impl("dense_dim")
_is_coalesced = _meta_impl("is_coalesced")
_with_dims_and_tensors = _meta_impl("_sparse_coo_tensor_with_dims_and_tensors")


def _on_device(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == torch._C._get_privateuse1_backend_name()


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of a ``neuron`` tensor, sparse or dense."""
    if tensor.layout != torch.sparse_coo:
        return tensor.cpu()
    return torch.sparse_coo_tensor(
        _indices(tensor).cpu(), _values(tensor).cpu(), tuple(tensor.shape), check_invariants=False,
        is_coalesced=bool(_is_coalesced(tensor)))


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor (sparse or dense) on ``device``."""
    if tensor.layout != torch.sparse_coo:
        return tensor.to(device)
    return _with_dims_and_tensors(
        tensor.sparse_dim(), tensor.dense_dim(), list(tensor.shape), tensor._indices().to(device),
        tensor._values().to(device), dtype=tensor.dtype, layout=torch.sparse_coo, device=device,
        pin_memory=None, is_coalesced=tensor.is_coalesced())


def _map(value, fn):
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


def _write_back(target: torch.Tensor, result: torch.Tensor) -> None:
    """An argument the op mutated on the host copy: the device tensor takes the host result."""
    if target.layout == torch.sparse_coo:
        moved = to_device(result, target.device)
        torch.ops.aten.copy_sparse_to_sparse_.default._op_dk(_DK.SparseMeta, target, moved)  # re-aliases
    else:
        with torch.no_grad():
            target.copy_(result.to(target.dtype))


def handle(op, *args, **kwargs):
    """The ``SparsePrivateUse1`` fallback: ``op`` on host copies; results and mutated arguments back."""
    device = None

    def host(value):
        nonlocal device
        if _on_device(value):
            device = device or value.device
            return to_host(value)
        if isinstance(value, torch.device) and value.type == torch._C._get_privateuse1_backend_name():
            device = device or value
            return torch.device("cpu")
        return value

    host_args, host_kwargs = _map(args, host), _map(kwargs, host)
    result = op(*host_args, **host_kwargs)
    arguments = op._schema.arguments
    for index, argument in enumerate(arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        original = args[index] if index < len(args) else kwargs.get(argument.name)
        mutated = host_args[index] if index < len(args) else host_kwargs.get(argument.name)
        if _on_device(original):
            _write_back(original, mutated)
    returns = op._schema.returns
    if len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write:
        # an in-place op returns its mutated argument: the device tensor itself
        for index, argument in enumerate(arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                return args[index] if index < len(args) else kwargs[argument.name]
    return _map(result, lambda t: to_device(t, device) if isinstance(t, torch.Tensor) and device else t)


def _to_sparse(tensor, *args, **kwargs):
    return to_device(torch.ops.aten._to_sparse.default(tensor.cpu(), *args, **kwargs), tensor.device)


def _to_sparse_dim(tensor, sparse_dim):
    return to_device(torch.ops.aten._to_sparse.sparse_dim(tensor.cpu(), sparse_dim), tensor.device)


# a sparse tensor's metadata: torch's device-generic kernels read it off the SparseTensorImpl
_METADATA = ("is_coalesced", "_indices", "_values", "indices", "values", "sparse_dim", "dense_dim", "_nnz")
# ops whose CompositeExplicitAutograd kernel would take the SparsePrivateUse1 key before the fallback, and is
# wrong for a sparse tensor (it allocates or copies as if dense): sent to the fallback by name
_PAST_COMPOSITE = ("copy_", "clone", "empty_like", "zeros_like", "sum", "sum.dim_IntList", "new_empty",
                   "resize_as_", "is_same_size")


def install() -> None:
    """The ``SparsePrivateUse1`` fallback and the dense ``neuron`` kernels that make sparse tensors (idempotent)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("_", "IMPL")  # noqa: TOR901 (a fallback needs the catch-all library)
    _library.fallback(lambda op, *a, **k: handle(op, *a, **k), "SparsePrivateUse1")
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    aten.impl("_to_sparse", _to_sparse, "PrivateUse1")
    aten.impl("_to_sparse.sparse_dim", _to_sparse_dim, "PrivateUse1")
    for name in _METADATA:
        aten.impl(name, _meta_impl(name), "SparsePrivateUse1")
    for qualified in _PAST_COMPOSITE:
        name, _, overload = qualified.partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        aten.impl(qualified, lambda *a, _op=op, **k: handle(_op, *a, **k), "SparsePrivateUse1")
    _library._aten = aten  # kept alive with the fallback
