"""``neuron-compile``'s entry point: the argument parser, ``main`` and ``run``.

``build_parser`` declares every command with its help and example (``bench``'s
come from ``bench.add_bench_parsers``); ``main`` parses and ``run`` calls the
command, mapping ``UsageError``/``SpecError`` to exit 2, ``CompileFailure``
and compile errors to 1, each printed as one paragraph.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap

from .cache_commands import cmd_cache, cmd_inspect, cmd_repro
from .commands import cmd_compile, cmd_demo, cmd_dump, cmd_explain
from .common import PROG, CompileFailure, UsageError, _print_err, _unwrap
from .ops_command import add_ops_parser

# ---- argument parsing --------------------------------------------------------------------------

def _command(sub, name: str, help: str, example: str, description: str | None = None):
    parser = sub.add_parser(
        name, help=help,
        description=textwrap.dedent(description or help),
        epilog="example:\n  " + example.strip().replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Offline tools for the neuron torch.compile backend: stage dumps, ahead-of-time compiles, "
                    "cache care, compile-time benchmarks.",
        epilog="example:\n  neuron-compile demo\n  neuron-compile dump mlp --out /tmp/dump\n\n"
               "exit codes: 0 success, 1 compile failure, 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(sub, "demo", "train a small GPT-2-style transformer through the neuron backend beside eager",
                 "neuron-compile demo --steps 5",
                 """\
                 Build a small GPT-2-style transformer (random weights, no download), run
                 inference and a few AdamW training steps through torch.compile(backend="neuron")
                 beside eager, print the losses side by side and the per-stage compile report.
                 Exits 1 when neuron and eager disagree beyond --tol.""")
    p.add_argument("--steps", type=int, default=5, help="AdamW steps (default 5)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--tol", type=float, default=1e-3, help="largest allowed |neuron - eager| (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "neuron"), default="cpu",
                   help="cpu: torch.compile(backend='neuron') on CPU tensors (default); neuron: the model on the "
                        "neuron device, eager, compiled and greedy generation, each against CPU eager")
    p.add_argument("--new-tokens", type=int, default=8, help="tokens generated with --device neuron (default 8)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=cmd_demo)

    spec_help = "model: a built-in name, path/to/file.py:factory or package.module:factory (see `neuron-compile specs`)"
    passes_help = "pass pipeline or profile (none, default, neuron), e.g. 'canonicalize,fuse'"

    p = _command(sub, "specs", "list the built-in model specs and the spec syntax", "neuron-compile specs")
    p.set_defaults(run=cmd_specs)

    p = _command(sub, "dump", "write every stage of every graph to a folder and print its index",
                 "neuron-compile dump mlp --out /tmp/dump --passes canonicalize",
                 """\
                 Compile a model with the neuron backend (a fresh cache, so every stage runs) and
                 write, per graph and in order: the FX graph, the Torch-MLIR module, the StableHLO
                 before passes and after each pass, the final StableHLO, the artifact manifest and
                 the compile report, under OUT/pid<process>/<graph>/. The same files are written for
                 any torch.compile(..., backend="neuron") run when NEURON_COMPILE_DUMP_DIR is set.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--out", required=True, help="dump folder")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--train", action="store_true", help="forward + backward (training graphs)")
    p.add_argument("--json", action="store_true", help="print the index as JSON")
    p.set_defaults(run=cmd_dump)

    p = _command(sub, "compile", "compile ahead of time into the cache, reporting hits and new compiles",
                 "neuron-compile compile demo --train --buckets 16,32 --bucket-dim 1 --jobs 2",
                 """\
                 Compile a model's graphs ahead of time into the artifact cache (NEURON_COMPILE_CACHE_DIR)
                 with a progress bar, and report how many graphs were cache hits and how many were
                 compiled. --buckets: dimension --bucket-dim of every input is made symbolic and each
                 listed size becomes a bucket (the backend's buckets option), compiled once; a run
                 with the same buckets then finds every bucket in the cache. A graph the bucketing
                 analysis cannot prove exact is compiled at each listed size exactly.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--buckets", help="comma-separated bucket sizes for dimension --bucket-dim, e.g. 128,256,512")
    p.add_argument("--bucket-dim", type=int, default=0, help="the input dimension --buckets sets (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="compile in N worker processes sharing the cache")
    p.add_argument("--train", action="store_true", help="also compile the training graphs (forward + backward)")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=cmd_compile)

    from .bench import add_bench_parsers

    add_bench_parsers(sub, _command, spec_help, passes_help)

    p = _command(sub, "cache", "show, check and trim the artifact cache",
                 "neuron-compile cache stats\nneuron-compile cache prune --max-bytes 500M",
                 """\
                 stats: size and cumulative counters; ls: one line per artifact; verify: check every
                 artifact's checksum and key (exit 1 if any is broken); clear: remove everything;
                 prune: drop broken entries and evict least recently used artifacts down to --max-bytes.""")
    p.add_argument("action", choices=["stats", "ls", "verify", "clear", "prune"])
    p.add_argument("--cache-dir", help="cache folder (default: NEURON_COMPILE_CACHE_DIR or ~/.cache/neuron_compile)")
    p.add_argument("--max-bytes", help="prune down to this size (500M, 2G...; default: the cache's cap)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_cache)

    p = _command(sub, "inspect", "print an artifact's manifest (or its StableHLO)",
                 "neuron-compile inspect ~/.cache/neuron_compile/artifacts/ab/ab12....ncart\n"
                 "neuron-compile inspect ab12 --stablehlo   # a key prefix from `cache ls`")
    p.add_argument("artifact", help="an artifact file, or a cache key (prefix)")
    p.add_argument("--cache-dir", help="cache folder to look keys up in")
    p.add_argument("--stablehlo", action="store_true", help="print the artifact's StableHLO module")
    p.add_argument("--json", action="store_true", help="print the manifest and sizes as JSON")
    p.set_defaults(run=cmd_inspect)

    p = _command(sub, "explain", "graph breaks, recompiles, ops that don't lower, dims, cache misses",
                 "neuron-compile explain mlp --sizes 4,16",
                 """\
                 Run a model through Dynamo's explain (graph breaks and their causes), then through the
                 neuron backend graph by graph (a graph that does not lower is reported, with its op,
                 source line and reproducer, and run eagerly so the rest is still looked at). --sizes
                 calls again with other sizes of dimension --dim to show recompiles and their causes.
                 Exits 1 when a graph does not lower.""")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--sizes", help="also call with these sizes of dimension --dim, e.g. 4,16")
    p.add_argument("--dim", type=int, default=0, help="the input dimension --sizes sets (default 0)")
    p.add_argument("--train", action="store_true", help="forward + backward")
    p.add_argument("--passes", help=passes_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_explain)

    p = _command(sub, "repro", "re-run a saved failing lowering pipeline",
                 "neuron-compile repro /tmp/neuron_compile_repro/g0.forward-abc123",
                 """\
                 Re-run the pipeline saved by a LoweringError (the folder its message names) and print the
                 diagnostics. Exits 1 when the failure reproduces, 0 when the pipeline now succeeds.""")
    p.add_argument("dir", help="the reproducer folder (holds input.mlir and pipeline.txt)")
    p.set_defaults(run=cmd_repro)

    add_ops_parser(sub, _command)
    return parser


def cmd_specs(args) -> int:
    from .specs import builtin_help

    print("built-in model specs:\n" + builtin_help())
    print("\nyour own: path/to/file.py:factory or package.module:factory, where factory() returns\n"
          "(model, example_inputs), example_inputs a tuple of tensors or a dict of keyword tensors.")
    return 0


def _version() -> str:
    try:
        from .._version import __version__

        return __version__
    except Exception:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code or 0)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    return run(args)


def run(args) -> int:
    from .specs import SpecError

    args.stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr) if getattr(args, "json", False) else contextlib.nullcontext():
            return args.run(args)
    except (UsageError, SpecError) as exc:
        _print_err(str(exc))
        return 2
    except CompileFailure as exc:
        _print_err(str(exc))
        return 1
    except KeyboardInterrupt:
        _print_err("interrupted.")
        return 130
    except Exception as exc:  # a compile failure somewhere in torch.compile
        if os.environ.get("NEURON_COMPILE_TRACEBACK"):
            raise
        inner = _unwrap(exc)
        from ..lowering import LoweringError

        if isinstance(inner, LoweringError):
            _print_err(str(inner))
        else:
            _print_err(f"compile failed with {type(inner).__name__}: {inner}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
