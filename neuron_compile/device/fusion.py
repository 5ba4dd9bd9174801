"""A fused run of eager ops: their kernels' StableHLO modules joined under one ``@main`` and compiled once.

``op_queue`` decides what a run is; this module builds its executable. Each
distinct kernel's module (the text it was compiled from, or decoded from its
artifact) is renamed with a prefix (``k3_main``...) and made private, as
``lowering.splice`` does for the pieces of one graph; a new ``@main`` takes the
run's outside parameters in order, calls each op's function on its operands
(an argument, or an earlier call's result), and returns the results the run's
signature says are still referenced. MLIR's inliner then flattens the module,
and XLA compiles it as one program: elementwise chains fuse into single loops,
intermediates nothing holds are never written to memory.

The module goes through the artifact cache like any graph (keyed by its text),
so a second process running the same loop loads it instead of compiling.
"""

from __future__ import annotations

import time

from ..lowering.splice import _renamed


class FusedRun:
    """One run's executable: the run's outside parameters in, its live results out. ``baked``: the outside
    parameters (views' offsets) built into the module as constants, (parameter, value) pairs; the rest are
    the executable's parameters (``kept``)."""

    __slots__ = ("xla", "_run", "count", "ops", "seconds", "baked", "kept", "rebuilds")

    def __init__(self, xla, count: int, ops: int, seconds: float, baked: dict | None = None, params: int = 0):
        self.xla = xla
        self._run = xla.loaded.execute_sharded
        self.count = count
        self.ops = ops
        self.seconds = seconds
        self.baked = tuple(sorted(baked.items())) if baked else ()
        self.kept = [i for i in range(params) if i not in baked] if baked else None
        self.rebuilds = 0  # builds of its run before this one (``op_queue``: an offset taken as a constant moved)

    def execute(self, params: list) -> list:
        if self.kept is not None:
            params = [params[i] for i in self.kept]
        if not self.count:
            self._run(params)
            return []
        return [r[0] for r in self._run(params).disassemble_prefix_into_single_device_arrays(self.count)]


def build(calls: tuple, live: tuple, baked: dict | None = None) -> FusedRun:
    """The fused executable of a run: ``calls`` is ((kernel, refs), ...) with each ref an int (the run's
    outside parameter of that number) or (call, output); ``live`` the (call, output) pairs it returns;
    ``baked`` the outside parameters (0-d int64: views' offsets) the module takes as constants, by number.

    With the artifact cache on, the run is found by a key made of its kernels' own keys (their FX keys,
    known without any StableHLO at hand), its wiring and its live results: a process that meets a run
    another process fused loads the executable and builds no module at all."""
    from ..options import Options
    from ..compiler import compile_cache
    from ..report import COUNTERS, CompileReport, record

    start = time.perf_counter()
    report = CompileReport(graph=f"eager.fused_run({len(calls)} ops)", kind="fused")
    report.nodes = len(calls)
    options = Options.resolve()
    cache = compile_cache(options)
    fronts = [kernel.executable.front for kernel, _ in calls]
    params = 1 + max((r for _, refs in calls for r in refs if r.__class__ is int), default=-1)
    if cache is None or any(front is None for front in fronts):
        with report.stage("fuse"):
            text = _text_of(calls, live, baked)
        with report.stage("xla-compile"):
            xla = _compile(text)
        COUNTERS["fused_run_compiles"] += 1
    else:
        from neuron_compile.runtime.cache_key import CacheKey

        front = CacheKey.build("fused-run", {"kernels": [f.digest for f in fronts],
                                             "wiring": [[list(r) if r.__class__ is tuple else r for r in refs]
                                                        for _, refs in calls],
                                             "live": [list(pair) for pair in live],
                                             **({"baked": sorted(baked.items())} if baked else {})})
        with report.remainder("cache-io"):
            result = cache.get(front, lambda: _PendingRun(calls, live, front, report, baked))
        xla = result.loaded.executable
        report.cache = result.source
    record(report)
    return FusedRun(xla, len(live), len(calls), time.perf_counter() - start, baked, params)


class _PendingRun:
    """A fused run the cache does not hold yet: its module, keyed by its text, compiled on request
    (``runtime.compile_cache.Pending``)."""

    def __init__(self, calls: tuple, live: tuple, front, report, baked: dict | None = None):
        from ..graph_keys import stablehlo_cache_key

        self.front, self.report = front, report
        with report.stage("fuse"):
            self.text = _text_of(calls, live, baked)
        self.key = stablehlo_cache_key(self.text, [], "eager-fused-run")

    def compile(self):
        import datetime

        from neuron_compile.runtime.artifact import Artifact, portable_stablehlo
        from neuron_compile.runtime.cache_key import tool_versions

        from .._version import __version__
        from ..report import COUNTERS

        with self.report.stage("xla-compile"):
            xla = _compile(self.text)
        # apart from xla_compiles (graphs' and ops' executables): a fused run is built in the background,
        # from kernels already compiled, and "a second call compiled nothing" is about those
        COUNTERS["fused_run_compiles"] += 1
        with self.report.stage("serialize"):
            stablehlo, encoding = portable_stablehlo(self.text)
            executable = xla.serialize()
        manifest = {
            "format": "neuron_compile artifact", "format_version": 1,
            "key": self.key.digest, "key_parts": self.key.as_manifest(),
            "fx_key": self.front.digest, "fx_key_parts": self.front.as_manifest(),
            "graph": self.report.graph, "kind": "fused", "stablehlo": encoding, "replicas": 1,
            "versions": {"neuron_compile": __version__, **tool_versions()},
            "stages": {k: round(v, 6) for k, v in self.report.stages.items()},
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return Artifact(manifest, stablehlo, executable), xla


def _text_of(calls: tuple, live: tuple, baked: dict | None = None) -> str:
    return fused_text([kernel.executable.xla.stablehlo() for kernel, _ in calls], [refs for _, refs in calls], live,
                      baked)


def fused_text(modules: list, refs: list, live: tuple, baked: dict | None = None) -> str:
    """The module of a run: ``modules[c]`` is call ``c``'s kernel module (the same text for a kernel the
    run calls twice: one function), ``refs[c]`` its operands, ``live`` what ``@main`` returns. An outside
    parameter in ``baked`` (number -> integer) is a constant of ``@main``, not one of its parameters: a view
    read at that offset becomes a static slice, which XLA fuses into its reader (``dynamic_slice`` and the
    pad around it are ops of their own)."""
    from torch_mlir import ir

    from ..lowering.diagnostics import run_pipeline, shared_context

    ctx = shared_context()
    functions: list[str] = []
    signatures: dict[str, tuple] = {}  # module text -> (function, input types, result types)
    called = []
    for text in modules:
        known = signatures.get(text)
        if known is None:
            if text is None:
                raise RuntimeError("a kernel of the run has no StableHLO module to fuse")
            module = ir.Module.parse(text, ctx)
            prefix = f"k{len(signatures)}_"
            with ctx:
                main = next(op for op in module.body.operations
                            if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main")
                kind = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
                inputs = [str(t) for t in kind.inputs]
                results = [str(t) for t in kind.results]
            functions += _renamed(module, prefix)
            known = signatures[text] = (prefix + "main", inputs, results)
        called.append(known)

    args: dict[int, str] = {}
    baked = baked or {}
    names: list[str] = []
    body = []
    for c, ((function, inputs, results), operands) in enumerate(zip(called, refs)):
        values = []
        for position, ref in enumerate(operands):
            if ref.__class__ is int:
                if ref not in args:
                    args[ref] = inputs[position]
                values.append(f"%const{ref}" if ref in baked else f"%arg{ref}")
            else:
                values.append(_value(ref, called))
        count = f":{len(results)}" if len(results) > 1 else ""
        body.append(f"    %c{c}{count} = func.call @{function}({', '.join(values)}) : "
                    f"({', '.join(inputs)}) -> ({', '.join(results)})")
        names.append(f"%c{c}")
    if sorted(args) != list(range(len(args))):
        raise RuntimeError("a run's outside parameters are not numbered densely")
    returned = [_value(ref, called) for ref in live]
    types = [called[c][2][o] for c, o in live]
    constants = [f"    %const{i} = stablehlo.constant dense<{int(baked[i])}> : {args[i]}" for i in sorted(baked)]
    parameters = ', '.join(f'%arg{i}: {args[i]}' for i in range(len(args)) if i not in baked)
    main = (f"func.func @main({parameters}) -> ({', '.join(types)}) {{\n" + "\n".join(constants + body)
            + f"\n    return {', '.join(returned)}{' : ' if returned else ''}{', '.join(types)}\n}}\n")
    module = ir.Module.parse("module {\n" + main + "\n".join(functions) + "\n}", ctx)
    run_pipeline(module, "builtin.module(inline,symbol-dce)")
    return module.operation.get_asm(enable_debug_info=False)


def _value(ref: tuple, called: list) -> str:
    c, o = ref
    return f"%c{c}#{o}" if len(called[c][2]) > 1 else f"%c{c}"


def _compile(text: str):
    from neuron_compile.runtime.executor import XlaExecutable

    return XlaExecutable.compile(text)
