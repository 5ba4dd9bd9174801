"""``torch.profiler`` on the neuron device: our events beneath the ATen ops they serve, and op tracking.

Each event's place is checked the way a user reads a trace: its nearest ATen
ancestor in the profiler's tree (``FunctionEvent.cpu_parent``), its input
shapes under ``record_shapes=True``, and its arguments in the exported Chrome
trace (``neuron_compile/profiling.py`` lists the events).
"""

from __future__ import annotations

import json

import torch


def _aten_parent(event):
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("aten::"):
        parent = parent.cpu_parent
    return parent


def _ancestors(event) -> set:
    found, parent = set(), event.cpu_parent
    while parent is not None:
        found.add(parent)
        parent = parent.cpu_parent
    return found


def _named(events, prefix: str) -> list:
    return [e for e in events if e.name.startswith(prefix)]


def _eager_step(model, x, ids, labels):
    """One training step: embedding (an index check), a matmul, a loss read on the host, SGD."""
    hidden = model["embed"](ids) + x
    logits = model["head"](torch.relu(hidden))
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return loss.item()


def test_profiled_eager_step_has_execute_compile_and_transfer_events_under_their_aten_ops(fresh_cache, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(11, 13), "head": torch.nn.Linear(13, 7)})
    x, ids, labels = torch.randn(5, 13), torch.tensor([1, 4, 10, 0, 3]), torch.tensor([0, 6, 2, 2, 5])
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    expected = _eager_step(model, x, ids, labels)
    model.load_state_dict(ref)
    model.to("neuron")
    with torch.profiler.profile(record_shapes=True) as prof:
        xn = x.to("neuron")  # a host-to-device transfer beneath aten::_to_copy
        loss = _eager_step(model, xn, ids.to("neuron"), labels.to("neuron"))
    assert abs(loss - expected) < 1e-5

    events = prof.profiler.function_events
    executes = _named(events, "neuron::execute")
    assert executes
    # every device execute sits beneath an ATen op (the one it runs, or a composite calling it)
    assert all(_aten_parent(e) is not None for e in executes)
    mm = [e for e in executes if _aten_parent(e).name in ("aten::mm", "aten::addmm")]
    assert mm and mm[0].input_shapes[:2] in ([[5, 13], [13, 7]], [[7], [5, 13]], [[5, 13], [7, 13]])
    assert _aten_parent(mm[0]).input_shapes[:2] == mm[0].input_shapes[:2]

    compiles = _named(events, "neuron::compile")
    whole = [e for e in compiles if e.name == "neuron::compile"]
    assert whole and all(_aten_parent(e) is not None for e in whole)  # a first call compiles beneath its op
    stages = {e.name for e in compiles} - {"neuron::compile"}
    assert "neuron::compile.xla-compile" in stages or "neuron::compile.cache-io" in stages, stages
    assert all(e.cpu_parent is not None and e.cpu_parent.name.startswith("neuron::compile")
               for e in compiles if e.name != "neuron::compile")

    to_device = _named(events, "neuron::host_to_device")
    x_copy = [e for e in to_device if e.input_shapes == [[5, 13]]]
    assert x_copy and _aten_parent(x_copy[0]).name in ("aten::_to_copy", "aten::copy_")
    to_host = _named(events, "neuron::device_to_host")
    assert any(_aten_parent(e).name in ("aten::item", "aten::_local_scalar_dense") for e in to_host)

    checks = _named(events, "neuron::index_check")  # embedding's ids, cross_entropy's labels
    assert checks and {_aten_parent(e).name for e in checks} & {"aten::embedding", "aten::index_select",
                                                                "aten::nll_loss_forward", "aten::nll_loss"}

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in trace}
    assert {"neuron::execute", "neuron::compile", "neuron::host_to_device", "neuron::device_to_host"} <= names
    copy = next(e for e in trace if e["name"] == "neuron::host_to_device" and e["args"].get("Input Dims") == [[5, 13]])
    assert copy["args"]["bytes"] == 5 * 13 * 4
    assert any(e["name"] == "neuron::execute" and e["args"].get("op") == "aten.mm.default" for e in trace)
    table = prof.key_averages(group_by_input_shape=True).table(row_limit=200)
    assert "neuron::execute" in table and "neuron::host_to_device" in table


def test_host_fallback_event_and_op_tracking_count_a_host_op():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="neuron")
    torch.neuron.clear_op_tracking()
    with torch.profiler.profile(record_shapes=True) as prof:
        first = torch.nonzero(x)  # data-dependent output shape: runs on host copies
    second = torch.nonzero(x + 1)
    assert first.cpu().tolist() == torch.nonzero(x.cpu()).tolist()
    assert second.cpu().tolist() == torch.nonzero(x.cpu() + 1).tolist()

    fallback = torch.neuron.get_fallback_ops()
    executed = torch.neuron.get_executed_ops()
    assert fallback == {"aten.nonzero.default": 2}
    assert executed["aten.nonzero.default"] == 2 and executed["aten.add.Tensor"] == 1
    assert "aten.add.Tensor" not in fallback
    events = prof.profiler.function_events
    host = _named(events, "neuron::host_fallback")
    assert len(host) == 1 and _aten_parent(host[0]).name == "aten::nonzero" and host[0].input_shapes == [[2, 2]]
    assert _named(events, "neuron::device_to_host") and _named(events, "neuron::host_to_device")
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_executed_ops() == {} and torch.neuron.get_fallback_ops() == {}


def test_profiled_compiled_call_is_one_graph_event():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 6)
    expected = model(x)
    model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    xn = x.to("neuron")
    with torch.profiler.profile(record_shapes=True) as prof:
        with torch.no_grad():
            first = compiled(xn)
            second = compiled(xn)
    torch.testing.assert_close(first.cpu(), expected.detach())
    torch.testing.assert_close(second.cpu(), expected.detach())
    events = prof.profiler.function_events
    graphs = _named(events, "neuron::graph ")
    assert len(graphs) == 2 and len({e.name for e in graphs}) == 1
    name = graphs[0].name.removeprefix("neuron::graph ")
    assert name.startswith("g") and name.endswith(".inference")
    assert [6, 8] in graphs[0].input_shapes or [8, 6] in graphs[0].input_shapes  # the weight's shape
    # the first call compiled the graph: its compile event names it, with the stages beneath
    compiles = [e for e in _named(events, "neuron::compile") if e.name == "neuron::compile"]
    assert any(e.cpu_parent is not None for e in compiles)


def test_a_collective_of_the_neuron_group_is_a_collective_event():
    import torch.distributed as dist

    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(6.0).reshape(2, 3).to("neuron")
        with torch.profiler.profile(record_shapes=True) as prof:
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
        torch.testing.assert_close(t.cpu(), torch.arange(6.0).reshape(2, 3))
    finally:
        dist.destroy_process_group()
    events = _named(prof.profiler.function_events, "neuron::collective")
    assert len(events) == 2 and all([2, 3] in e.input_shapes for e in events)
    assert [e.name for e in events] == ["neuron::collective"] * 2
    # a group of one runs gloo on staged host copies: the staging's transfer sits beneath the collective
    staged = [e for e in _named(prof.profiler.function_events, "neuron::device_to_host")
              if e.cpu_parent is not None and _ancestors(e) & set(events)]
    assert staged
