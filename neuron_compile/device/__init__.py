"""The ``neuron`` device: ``model.to("neuron")``, data in PJRT buffers, each eager op compiled and cached.

``register()`` runs at ``import torch`` (the ``torch.backends`` entry point;
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off). It only names things:
PrivateUse1 becomes ``neuron``, ``torch.neuron`` is this package's ``module``,
and the dispatcher's PrivateUse1 fallback points at ``aten_kernels.handle``. jax,
torch-mlir and the compiler load on the first op.

The way of an eager op, top down:

* ``aten_kernels``: the dispatcher's PrivateUse1 fallback (``handle``) and the device's own ATen
  kernels: factories, copies, views, ``resize_``/``set_``, random ops;
* ``ops``: every other op, one compiled executable per signature (``dispatch``); ``trace`` traces an
  op into a functional FX graph, ``opkernel`` holds a call's signature and its compiled kernel,
  ``op_index`` the persistent signature -> executable index (a new process skips tracing);
* ``op_queue`` and ``fusion``: adaptive eager execution, ops queued in stream order and runs of them
  that repeat fused into one executable;
* ``transfers``: copies to and from the host, ops run on host copies, ``retype``/``resize_``;
* ``storage``: one PJRT buffer per storage, the buffers' memory counters; ``memory``:
  ``torch.neuron.memory``;
* ``lengths`` and ``grown``: ops at growing lengths compiled once per 128-bucket;
* ``index_checks``: index bounds checked as CPU checks them; ``rng`` and ``philox``: the device's
  Philox (seed, offset) state; ``autocast``: ``torch.autocast("neuron")``;
* ``optim``: Adam's, AdamW's and SGD's steps as one executable each; ``lbfgs``: LBFGS's direction,
  gradient gather and update as one op each; ``whole_ops``: ``nn.LSTM``/``GRU``/
  ``RNN`` and ``scaled_dot_product_attention`` as one op forward and one backward;
* ``sparse``: sparse COO tensors (SparseAdam, sparse embedding gradients), their ops on host copies;
* ``collectives/``: the ``neuron`` process group and its collectives;
* ``module``: ``torch.neuron``; ``ordinals``: how many devices, which is current; ``op_tracking``:
  which ATen ops ran, and which on the host; ``post_import``: patches applied when a library loads;
* ``_torch_hooks``, ``_autograd_hooks``, ``_optim_hooks``, ``_device_constructor_hooks``,
  ``_accelerate_hooks``, ``_dtensor_rng_hooks``, ``_whole_op_hooks``: each private API of torch or of a library the
  device stands on, in one small module, with a test that fails when it changes (FlexAttention's:
  ``neuron_compile.decompositions.flex_attention``, which the compile path uses too).

``neuron_compile.dynamo_skips`` keeps Dynamo out of the kernels
and the compile path under them; the backend calls it when Dynamo first looks
it up.
"""

from __future__ import annotations

_registered = False
_library = None
_aten_impls = None  # our PrivateUse1 kernels of aten ops past their composite kernels (one aten IMPL library)

def register() -> None:
    """Make ``neuron`` a torch device (idempotent)."""
    global _registered, _library, _aten_impls
    if _registered:
        return
    import torch

    if _registered:  # the first `import torch` of the process ran our entry point, which registered
        return
    from .. import profiling
    from . import (_accelerate_hooks, _dtensor_rng_hooks, _device_constructor_hooks, _optim_hooks,
                   _torch_hooks, issuers, lbfgs, module, optim, post_import, sparse, storage)
    from .collectives import process_group

    if torch._C._get_privateuse1_backend_name() not in ("privateuseone", _torch_hooks.NAME):
        return  # another backend owns PrivateUse1 in this process: leave it alone
    _torch_hooks.setup_backend(module)
    _library = _torch_hooks.fallback_library(_fallback)
    issuers.FALLBACK = _fallback.__code__  # where a queued op's issuer walk starts (issuers.issuer)
    _torch_hooks.save_through_cpu()
    _torch_hooks.pin_memory_as_copy()
    _torch_hooks.load_onto_device()
    _aten_impls = _torch_hooks.data_moves_across_devices()
    _aten_impls.impl("_unsafe_view", _unsafe_view, "PrivateUse1")  # past CPU's composite kernel
    _torch_hooks.print_through_cpu()
    _torch_hooks.make_storages_with(storage.new_storage, storage.clone_storage, storage.byteswap_storage)
    process_group.register()  # init_process_group("neuron"): names the backend, connects nothing
    profiling.instrument_collectives(process_group.NeuronProcessGroup)  # neuron::collective profiler events
    _torch_hooks.route_default_compiler(_default_compiler)
    _torch_hooks.route_accelerator_to(module)
    _optim_hooks.multi_tensor_adam_through(optim.multi_tensor_adam)  # one executable a step
    _optim_hooks.sgd_through(optim.sgd_step)  # the same for SGD
    _optim_hooks.lbfgs_step_through(lbfgs.step)  # LBFGS: its direction one op, without host reads
    _optim_hooks.lbfgs_methods_through(lbfgs.gather_flat_grad, lbfgs.add_grad)  # one op each
    _accelerate_hooks.install()  # accelerate finds this device under torchrun (patched when it imports)
    _dtensor_rng_hooks.install()  # DTensor's RNG tracker draws shards of the device's Philox stream
    sparse.install()  # sparse COO tensors: their ops on host copies (SparseAdam, sparse embedding grads)
    post_import.patch_on_import({"torch.nn.attention.flex_attention": _flex_attention_on_device})
    if _several_devices():
        _device_constructor_hooks.index_less_moves_follow_current()  # x.to("neuron") lands on the current device
    _registered = True


def _several_devices() -> bool:
    """Whether this process has several devices (``runtime/devices.py``) (a bad value is an error at first use)."""
    from neuron_compile.runtime.devices import local_device_count

    try:
        return local_device_count() > 1
    except ValueError:
        return False


def _flex_attention_on_device(flex_module) -> None:
    """flex_attention takes neuron tensors (``decompositions.flex_attention``; imported when torch's is)."""
    from ..decompositions.flex_attention import accept_device

    accept_device(flex_module)


def _unsafe_view(tensor, size):
    from .aten_kernels import unsafe_view

    return unsafe_view(tensor, size)


def _fallback(op, *args, **kwargs):
    # aten_kernels (and what it imports) loads on the first op, not at ``import torch``; then it is held
    # here (an import statement per op cost a microsecond)
    if _handle is None:
        _load_handle()
    return _handle(op, *args, **kwargs)


_handle = None


def _load_handle() -> None:
    global _handle
    from .aten_kernels import handle

    _handle = handle


def _default_compiler(gm, example_inputs, inductor_config):
    """What ``torch.compile(model)`` with no backend named runs for a graph on neuron tensors."""
    import logging

    from ..capture.backend import neuron_backend

    if inductor_config:
        logging.getLogger("neuron_compile").info(
            "torch.compile on neuron tensors uses the neuron backend; Inductor options ignored: %s",
            sorted(inductor_config))
    return neuron_backend(gm, example_inputs)
