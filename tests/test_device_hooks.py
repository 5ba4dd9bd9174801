"""The private torch APIs the neuron device rests on (``neuron_compile.device._torch_hooks``).

Each test exercises one of them directly, so a torch upgrade that changes it
fails here, by name, before it fails somewhere deep in a model.
"""

from __future__ import annotations

import io

import pytest
import torch

from neuron_compile import dynamo_skips
from neuron_compile.device import _torch_hooks


def test_privateuse1_is_renamed_neuron_with_its_module():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.neuron.device_count() == 1
    assert hasattr(torch.Tensor, "is_neuron") and hasattr(torch.nn.Module, "neuron")


def test_create_empty_tensor_gives_a_plain_neuron_tensor_whose_storage_carries_attributes():
    t = _torch_hooks.empty_tensor((2, 3), torch.float32)
    assert type(t) is torch.Tensor and t.device == torch.device("neuron", 0) and t.stride() == (3, 1)
    t.untyped_storage()._probe = 7
    assert t.detach().untyped_storage()._probe == 7


def test_meta_redispatch_of_a_view_shares_the_storage():
    t = _torch_hooks.empty_tensor((4, 6), torch.float32)
    v = _torch_hooks.meta_redispatch(torch.ops.aten.as_strided.default, t, (3, 2), (1, 6), 5)
    assert v.device.type == "neuron" and v.untyped_storage()._cdata == t.untyped_storage()._cdata
    assert (v.shape, v.stride(), v.storage_offset()) == ((3, 2), (1, 6), 5)


def test_meta_redispatcher_calls_the_boxed_redispatch_of_the_op():
    t = torch.arange(12.0).to("neuron")
    view = _torch_hooks.meta_redispatcher(torch.ops.aten.as_strided.default)
    v = view(t, (3, 2), (1, 4), 3)
    assert v.untyped_storage()._cdata == t.untyped_storage()._cdata
    assert (v.shape, v.stride(), v.storage_offset()) == ((3, 2), (1, 4), 3)
    torch.testing.assert_close(v.cpu(), torch.arange(12.0).as_strided((3, 2), (1, 4), 3))


def test_op_overload_redispatch_and_exclude_guard_exist():
    assert callable(torch.ops.aten.add.Tensor.redispatch)
    with _torch_hooks.exclude_autocast():
        pass
    assert "AutocastPrivateUse1" in dir(torch._C.DispatchKey)


def test_reduce_ex_internal_is_ours_and_torch_still_routes_pickling_through_it():
    assert getattr(torch.Tensor._reduce_ex_internal, "_neuron", False)
    buffer = io.BytesIO()
    torch.save(torch.arange(3.0).to("neuron"), buffer)
    buffer.seek(0)
    assert torch.load(buffer, map_location="cpu", weights_only=True).tolist() == [0.0, 1.0, 2.0]


def test_data_assignment_across_cpu_and_neuron_asks_our_shallow_copy_kernel():
    """``Variable.set_data`` (``t.data = ...``) and ``Module._apply`` ask the dispatched op
    ``aten::_has_compatible_shallow_copy_type``; torch's own kernel refuses PrivateUse1, ours admits
    CPU <-> neuron (the dense rule of ``TensorImpl::has_compatible_shallow_copy_type``)."""
    cpu, neuron = torch.ones(2), torch.ones(2, device="neuron")
    assert torch._has_compatible_shallow_copy_type(cpu, neuron)
    assert torch._has_compatible_shallow_copy_type(neuron, cpu)
    assert not torch._has_compatible_shallow_copy_type(neuron, torch.ones(2).to_sparse())
    t = torch.zeros(2)
    t.data = neuron
    assert t.device.type == "neuron"
    t.data = cpu
    assert t.device.type == "cpu"


def test_module_to_keeps_parameter_objects_without_the_swap_path():
    layer = torch.nn.Linear(2, 2)
    weight = layer.weight
    layer.to("neuron")
    assert layer.weight is weight and weight.device.type == "neuron"
    assert not torch.__future__.get_swap_module_params_on_conversion()
    assert not getattr(torch.nn.Module.to, "_neuron", False)  # torch's own Module.to


def test_printing_formats_from_one_cpu_copy_and_compiles_nothing():
    from neuron_compile.device import ops

    x = torch.randn(3, 3).to("neuron").requires_grad_(True) * 2
    compiles = ops.COUNTS["op_compiles"]
    text = repr(x)
    assert getattr(torch._tensor_str._tensor_str, "_neuron", False)
    assert "device='neuron:0'" in text and "grad_fn=<MulBackward0>" in text
    assert ops.COUNTS["op_compiles"] == compiles
    assert repr(x.detach().cpu()).split("]]")[0] == text.split("]]")[0]


def test_addressed_storages_tell_tensors_apart_and_views_share_them():
    a, b = torch.zeros(4, 4, device="neuron"), torch.zeros(4, 4, device="neuron")
    assert a.data_ptr() != 0 and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert a.untyped_storage().nbytes() == 64 and not a.untyped_storage().resizable()
    assert a[1:].data_ptr() - a.data_ptr() == 16 and a.view(16).untyped_storage().data_ptr() == a.data_ptr()
    a.resize_(8, 8)  # grows onto a larger storage of its own, keeping the elements it had
    assert a.untyped_storage().nbytes() == 256 and a.shape == (8, 8)
    torch.testing.assert_close(a.reshape(-1)[:16].cpu(), torch.zeros(16))


def test_torch_compile_with_no_backend_named_routes_neuron_graphs_to_ours(monkeypatch):
    import torch._inductor.compile_fx as compile_fx

    from neuron_compile import report

    assert getattr(torch._TorchCompileInductorWrapper.__call__, "_neuron", False)
    seen = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, inputs, **kw: seen.append(gm) or gm.forward)
    torch._dynamo.reset()
    lowerings = report.COUNTERS["lowerings"]
    fn = torch.compile(lambda x: torch.sin(x) * 2)
    x = torch.randn(3, 5)
    torch.testing.assert_close(fn(x.to("neuron")).cpu(), torch.sin(x) * 2)
    assert report.COUNTERS["lowerings"] > lowerings and not seen  # ours, not Inductor
    fn(x)  # a CPU graph still goes to Inductor
    assert len(seen) == 1


def test_dynamo_records_example_values_so_a_graph_building_on_neuron_from_no_input_routes_to_ours(monkeypatch):
    import torch._inductor.compile_fx as compile_fx

    def build():
        return torch.arange(4.0, device="neuron") * 2

    graphs = []
    torch.compile(build, backend=lambda gm, inputs: graphs.append(gm) or gm.forward)()
    (gm,) = graphs  # what the routing reads: Dynamo's fake value of each node, on its device
    assert {n.meta["example_value"].device.type for n in gm.graph.nodes if n.op == "call_function"} == {"neuron"}
    seen = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, inputs, **kw: seen.append(gm) or gm.forward)
    torch._dynamo.reset()
    out = torch.compile(build)()
    assert not seen and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) * 2)


def test_pin_memory_for_the_device_is_a_host_copy():
    """``DataLoader(pin_memory=True)`` pins for the current accelerator, ``neuron``: a plain host copy
    (pinning needs a C++ allocator; PJRT transfers from any host memory)."""
    x = torch.arange(6.0).reshape(2, 3).t()
    assert getattr(torch.Tensor.pin_memory, "_neuron", False)
    pinned = x.pin_memory()
    assert pinned.device.type == "cpu" and not pinned.is_pinned() and pinned.data_ptr() != x.data_ptr()
    assert pinned.stride() == x.stride()
    torch.testing.assert_close(pinned, x)
    batch = next(iter(torch.utils.data.DataLoader([{"a": torch.arange(3.0)}], pin_memory=True)))
    torch.testing.assert_close(batch["a"].to("neuron").cpu(), torch.arange(3.0)[None])


# --- torch.distributed (neuron_compile/device/collectives/process_group.py) ------------------------------------------

def test_the_neuron_process_group_backend_is_registered_for_neuron_and_cpu():
    import torch.distributed as dist

    assert "neuron" in dist.Backend.backend_list and dist.Backend.NEURON == "neuron"
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"  # init_process_group()
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # left alone
    assert sorted(dist.Backend.backend_capability["neuron"]) == ["cpu", "neuron"]
    assert dist.Backend._plugins["NEURON"].extended_api
    for kind in ("Allreduce", "Allgather", "ReduceScatter", "Broadcast", "AllToAll", "Barrier"):
        assert type(_torch_hooks.collective_options(kind)).__name__ == f"{kind}Options"


def test_a_python_process_group_from_the_creator_is_the_group_and_cpp_reaches_its_methods():
    """torch makes a creator's ``ProcessGroup`` subclass the whole group, and C++ (``_broadcast_coalesced``,
    DDP's reducer) calls its Python methods and its Python Work's ``wait`` through torch's trampolines."""
    import torch.distributed as dist

    from neuron_compile.device.collectives.process_group import NeuronProcessGroup, NeuronWork

    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        assert type(group) is NeuronProcessGroup and (group.rank(), group.size()) == (0, 1)
        assert group.group_name == "0" and group.name() == "neuron"
        calls = []
        original = NeuronProcessGroup.broadcast
        NeuronProcessGroup.broadcast = lambda self, *a: calls.append(a) or original(self, *a)
        try:
            tensors = [torch.ones(3), torch.arange(2.0)]
            dist._broadcast_coalesced(group, tensors, 1 << 20, 0)  # C++: flattens, broadcasts, unflattens
        finally:
            NeuronProcessGroup.broadcast = original
        assert len(calls) == 1 and tensors[1].tolist() == [0.0, 1.0]
        work = dist.all_reduce(torch.ones(2), async_op=True)
        assert isinstance(work, NeuronWork) and work.wait() and work.get_future().value()[0].tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_storage_resize_on_the_device_is_ours_and_cpu_storages_still_resize():
    assert getattr(torch.UntypedStorage.resize_, "_neuron", False)
    storage = torch.zeros(2).untyped_storage()
    storage.resize_(4 * 4)
    assert storage.nbytes() == 16


def test_plain_dispatch_lifts_an_exclude_set_a_subclass_dispatch_leaves():
    functionalize = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
    with torch._C._ExcludeDispatchKeyGuard(functionalize):
        assert torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Functionalize)
        with _torch_hooks.plain_dispatch():
            assert not torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Functionalize)
        assert torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Functionalize)


def test_dynamo_disable_and_skip_folders_keep_dynamo_out():
    import torch._dynamo.trace_rules as rules
    import torch_mlir.extras.fx_importer as fx_importer

    import neuron_compile.graph_keys as cache_key

    # a namespace package (its folder) and a module (its file), in one call
    dynamo_skips.skip_in_dynamo("torch_mlir", "neuron_compile.graph_keys")
    assert rules.check_file(fx_importer.__file__).skipped
    assert rules.check_file(cache_key.__file__).skipped
    fn = _torch_hooks.run_eagerly(lambda x: x + 1)
    assert getattr(fn, "_torchdynamo_disable", False)
    assert torch.compile(lambda x: fn(x) * 2, backend="eager")(torch.ones(1)).tolist() == [4.0]


def test_storages_of_the_device_are_made_by_ours_and_cpu_storages_by_torch():
    # torch.UntypedStorage(n, device=...) goes through the Python class's __new__ (ours, over
    # torch._C.StorageBase.__new__), clone/new/_byteswap through its methods: a torch that moves them to
    # C++ fails here, not with a segfault in a user's copy.deepcopy
    assert getattr(torch.UntypedStorage.__new__, "_neuron", False)
    made = torch.UntypedStorage(6, device="neuron")
    assert made.device.type == "neuron" and made.nbytes() == 6 and not made.resizable()
    assert made.clone().device.type == "neuron" and made.new().nbytes() == 0
    cpu = torch.UntypedStorage(6)
    assert type(cpu) is torch.UntypedStorage and cpu.device.type == "cpu" and cpu.resizable()
    assert torch.UntypedStorage([1, 2]).tolist() == [1, 2] and cpu.clone().nbytes() == 6
    # Tensor.__deepcopy__ still reaches the storage's clone (it copies a tensor with a storage that way)
    x = torch.arange(3.0).to("neuron")
    calls = []
    clone = torch.UntypedStorage.clone
    try:
        torch.UntypedStorage.clone = lambda self: calls.append(self) or clone(self)
        import copy

        copy.deepcopy(x)
    finally:
        torch.UntypedStorage.clone = clone
    assert len(calls) == 1


def test_torch_accelerator_still_calls_the_bindings_we_route():
    import inspect

    import torch.accelerator
    import torch.accelerator.memory

    source = inspect.getsource(torch.accelerator) + inspect.getsource(torch.accelerator.memory)
    for binding in _torch_hooks.ACCELERATOR_BINDINGS:
        assert f"torch._C.{binding}(" in source, f"torch.accelerator no longer calls torch._C.{binding}"
        assert getattr(getattr(torch._C, binding), "_neuron", False), binding
    # the C++ behind them still refuses a Python backend (if torch learns to ask the device module, the
    # routing can go)
    original = getattr(torch._C, "_accelerator_synchronizeDevice").args[0]
    with pytest.raises(RuntimeError, match="synchroniz"):
        original(0)


def test_has_cpu_kernel_tells_a_cuda_only_op_from_one_the_cpu_runs():
    assert _torch_hooks.has_cpu_kernel(torch.ops.aten.add.Tensor)
    assert _torch_hooks.has_cpu_kernel(torch.ops.aten.lstm.input)  # a composite serves the CPU
    assert not _torch_hooks.has_cpu_kernel(torch.ops.aten._thnn_fused_lstm_cell.default)


def test_dlpack_ext_dev_makes_a_tensor_on_any_neuron_index_and_set_keeps_it():
    """``neuron:1`` tensors start from one DLPack import (torch maps ``kDLExtDev`` to PrivateUse1, with
    the index); a Meta ``alias`` of it, ``set_`` onto a ``neuron:1`` storage, is a fresh tensor there."""
    threading = torch._C._is_multithreading_enabled()
    seed = _torch_hooks._seed(1, torch.int64)
    assert seed.device == torch.device("neuron", 1) and seed.dtype == torch.int64 and seed.numel() == 0
    t = _torch_hooks.addressed_tensor((2, 3), (3, 1), 0, 48, torch.int64, index=1)
    assert t.device == torch.device("neuron", 1) and t.shape == (2, 3)
    assert t.untyped_storage().device == torch.device("neuron", 1) and t.untyped_storage().nbytes() == 48
    # the autograd engine's device workers: one per index the Python guard reports (fixed at 1)
    assert torch._C._is_multithreading_enabled() is False  # _seed turned it off for this thread
    torch._C._set_multithreading_enabled(threading)


def test_device_context_constructors_are_torchs_set_of_functions():
    """``_index_less`` evaluates ``torch.utils._device._device_constructors()`` before it wraps ``torch.tensor``,
    so that ``with torch.device("meta")`` still gives the originals its device (transformers asks
    ``torch.tensor([]).device`` to learn the context's device)."""
    from torch.utils._device import DeviceContext, _device_constructors

    constructors = _device_constructors()
    assert isinstance(constructors, set) and {torch.empty, torch.zeros}.issubset(constructors)
    assert "__torch_function__" in vars(DeviceContext)
    with torch.device("meta"):
        assert torch.tensor([]).device.type == "meta"


# torch 2.13's _multi_tensor_adam; optim.foreach_adam_ issues its foreach ops, in its order
MULTI_TENSOR_ADAM_SHA256 = "696b2335467744a4"


def test_adams_foreach_step_is_ours_and_the_function_it_mirrors_is_unchanged():
    """``torch.optim.adam.adam`` looks ``_multi_tensor_adam`` up in its module at each step: ours is there,
    and torch's own (which ``optim.foreach_adam_`` mirrors op for op) is the source it was written against."""
    import hashlib
    import inspect

    import torch.optim.adam as adam

    routed = adam._multi_tensor_adam
    assert getattr(routed, "_neuron", False)
    assert "func = _multi_tensor_adam" in inspect.getsource(adam.adam)
    original = routed.__wrapped__
    digest = hashlib.sha256(inspect.getsource(original).encode()).hexdigest()[:16]
    assert digest == MULTI_TENSOR_ADAM_SHA256, (
        "torch changed torch.optim.adam._multi_tensor_adam: check that neuron_compile.device.optim.foreach_adam_ "
        "still issues its non-capturable branch's foreach ops in its order, then update the digest")


# torch 2.13's _single_tensor_sgd and _multi_tensor_sgd; optim.foreach_sgd_ issues the foreach ops of the second,
# the per-tensor ops of the first in the same order
SGD_SHA256 = {"_single_tensor_sgd": "e6431c7daa0fbfae", "_multi_tensor_sgd": "c96f003b79477a10"}


@pytest.mark.parametrize("name", sorted(SGD_SHA256))
def test_sgds_step_functions_are_ours_and_the_functions_they_mirror_are_unchanged(name):
    """``torch.optim.sgd.sgd`` looks its step function up in its module at each step: ours is there, and
    torch's own (which ``optim.foreach_sgd_`` mirrors) is the source it was written against."""
    import hashlib
    import inspect

    import torch.optim.sgd as sgd

    routed = getattr(sgd, name)
    assert getattr(routed, "_neuron", False)
    assert f"func = {name}" in inspect.getsource(sgd.sgd)
    digest = hashlib.sha256(inspect.getsource(routed.__wrapped__).encode()).hexdigest()[:16]
    assert digest == SGD_SHA256[name], (
        f"torch changed torch.optim.sgd.{name}: check that neuron_compile.device.optim.foreach_sgd_ still "
        f"computes what it computes, in its order (and the cases sgd_step leaves to torch), then update the digest")


# torch 2.13's LBFGS.step; lbfgs.fixed_step mirrors it without a line search (its reads gathered)
LBFGS_STEP_SHA256 = "7d1dd4afcf631b9a"


def test_lbfgs_step_is_routed_and_the_step_fixed_step_mirrors_is_unchanged():
    """``torch.optim.LBFGS.step`` is routed, and torch's own (whose fixed-step iteration ``lbfgs.fixed_step``
    mirrors test for test, state entry for state entry) is the source it was written against."""
    import hashlib
    import inspect

    from neuron_compile.device import _optim_hooks

    assert getattr(torch.optim.LBFGS.step, "_neuron", False)
    digest = hashlib.sha256(inspect.getsource(inspect.unwrap(_optim_hooks.LBFGS_STEP)).encode()).hexdigest()[:16]
    assert digest == LBFGS_STEP_SHA256, (
        "torch changed torch.optim.LBFGS.step: check that neuron_compile.device.lbfgs.fixed_step still takes its "
        "iterations (its tests, their order, its state entries) without a line search, then update the digest")


def test_the_autograd_engine_says_when_it_runs_a_backward():
    """``_autograd_hooks.in_backward`` (growing lengths stay exact inside a backward, where grad mode is off
    too) reads ``torch._C._current_graph_task_id()``: -1 outside the engine, a task id inside it."""
    from neuron_compile.device._autograd_hooks import in_backward

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append((in_backward(), torch.is_grad_enabled()))
            return grad * 2

    x = torch.ones(2, requires_grad=True)
    assert not in_backward()
    Probe.apply(x).sum().backward()
    with torch.no_grad():
        assert not in_backward()
    assert seen == [(True, False)]


# --- DTensor's random-number tracker (``_dtensor_rng_hooks``) ---------------------------------------

TRACKER_SHA256 = {"_distribute_region": "f73875ec9c8885ac", "_compute_rng_offsets": "bc9c775bdafef4e4"}


def test_dtensors_rng_tracker_region_is_ours_for_neuron_and_torchs_is_the_one_we_mirror():
    """``OffsetBasedRNGTracker._distribute_region`` (private, torch 2.13) is replaced for neuron meshes by
    ``_dtensor_rng_hooks`` as the module imports; ours keeps its offset bookkeeping (the end increment from
    ``_compute_rng_offsets``), so a change to either of torch's fails here."""
    import hashlib
    import inspect

    from torch.distributed.tensor import _random

    region = _random.OffsetBasedRNGTracker._distribute_region
    assert getattr(region, "_neuron", False)
    assert list(inspect.signature(region.__wrapped__).parameters) == ["self", "spec", "generator"]
    for name, fn in (("_distribute_region", region.__wrapped__),
                     ("_compute_rng_offsets", _random.OffsetBasedRNGTracker._compute_rng_offsets)):
        digest = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
        assert digest == TRACKER_SHA256[name], (
            f"torch changed OffsetBasedRNGTracker.{name}: check neuron_compile/device/_dtensor_rng_hooks.py "
            "(the region for neuron meshes) against it, then update the digest")


def test_dtensors_philox_state_reads_the_devices_state_as_seed_and_offset():
    """The tracker reads ``torch.neuron.get_rng_state()`` through ``_PhiloxState``: CUDA's 16 bytes."""
    from torch.distributed.tensor._random import _PhiloxState

    torch.neuron.manual_seed(2 ** 40 + 5)
    state = _PhiloxState(torch.neuron.get_rng_state())
    assert int(state.seed) == 2 ** 40 + 5 and int(state.offset) == 0
    state.offset = torch.tensor([12])
    torch.neuron.set_rng_state(state.state)
    assert int(_PhiloxState(torch.neuron.get_rng_state()).offset) == 12


def test_dtensors_shard_arithmetic_gives_the_elements_distribute_tensor_places():
    """``_dtensor_rng_hooks.shard_positions`` takes a shard's global indices from
    ``torch.distributed.tensor._utils._get_shard_size_and_offsets``: they must be the elements DTensor's own
    split (``Placement._split_tensor``) gives each rank, even and uneven, ``Shard`` and ``_StridedShard``."""
    from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    for placement in (Shard(0), _StridedShard(0, split_factor=2)):
        for n, chunks in ((8, 2), (7, 2), (7, 3), (2, 4)):
            split, _ = placement._split_tensor(torch.arange(n), chunks, with_padding=False)
            for rank in range(chunks):
                size, offsets = _get_shard_size_and_offsets(n, chunks, rank, placement, None, n, False)
                want = split[rank] if rank < len(split) else torch.arange(0)
                assert size == want.numel() and offsets[:size].tolist() == want.tolist(), (placement, n, rank)


def test_dtensors_dispatcher_runs_these_random_ops_in_the_trackers_region():
    """The ops DTensor's dispatcher runs inside ``_distribute_region`` (for every device but CUDA without a
    generator): ``rng.draw`` draws each (``test_device_rng``); a new one there fails here first."""
    import inspect

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dispatch import OpDispatcher

    aten = torch.ops.aten
    assert DTensor._op_dispatcher._random_ops == {
        aten.native_dropout.default, aten.normal_.default, aten.rand.default, aten.rand_like.default,
        aten.randn.default, aten.randn_like.default, aten.randint_like.default, aten.randint_like.low_dtype,
        aten.randint_like.low_dtype_out, aten.uniform_.default, aten.bernoulli.default, aten.bernoulli_.float}
    source = inspect.getsource(OpDispatcher._dispatch_get_local_results_slow_path)
    assert 'first_local_arg.device.type != "cuda"' in source and "random._rng_tracker._distribute_region(" in source


def test_whole_ops_private_apis_call_composites_skip_autograd_see_tracers_and_split_joint_graphs():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.device import _whole_op_hooks as hooks

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(2, 4)
    out = hooks.composite(torch.ops.aten.linear.default, x, w)  # its pieces, recorded by autograd
    torch.testing.assert_close(out, x @ w.t())
    assert out.grad_fn is not None and "Linear" not in type(out.grad_fn).__name__
    assert not hooks.saved_tensor_hooks()
    with torch.autograd.graph.save_on_cpu():
        assert hooks.saved_tensor_hooks()
        with hooks.saved_tensor_hooks_off():
            y = x.sin()  # saved without the hook: its backward reads the tensor itself
        y.sum().backward()
    assert not hooks.traced()
    with FakeTensorMode():
        assert hooks.traced()
    assert not hooks.wrapped(x)
    seen = []
    torch.func.vmap(lambda t: seen.append(hooks.wrapped(t)) or t)(torch.randn(2, 3))
    assert seen == [True]

    def joint(primals, tangents):
        (a,) = primals
        y = a.sin() * 2
        return [y, *torch.autograd.grad([y], [a], tangents)]

    a = torch.randn(5, requires_grad=True)
    gm = make_fx(joint)([a], [torch.ones(5)])
    forward, backward = hooks.partition(gm, ([a], [torch.ones(5)]), num_fwd_outputs=1)
    outs = forward(a.detach())
    torch.testing.assert_close(outs[0], a.detach().sin() * 2)
    (grad,) = backward(*outs[1:], torch.ones(5))
    torch.testing.assert_close(grad, a.detach().cos() * 2)
