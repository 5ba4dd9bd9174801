"""`python -m neuron_compile.passes --pipeline SPEC [--verify-each] [-o OUT] FILE.mlir`

Runs a pipeline on a StableHLO file and prints per-pass stats to stderr: the
command the pipeline's reproducer messages name.
"""
from __future__ import annotations

import argparse
import sys

from . import PipelineError, parse_pipeline


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neuron_compile.passes", description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--pipeline", default="default", help="pipeline string or profile name")
    ap.add_argument("--verify-each", action="store_true")
    ap.add_argument("-o", "--output", help="write the resulting IR here (default: stdout)")
    args = ap.parse_args(argv)
    try:
        pipeline = parse_pipeline(args.pipeline)
        with open(args.file) as f:
            text, stats = pipeline.run_on_text(f.read(), verify_each=args.verify_each)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for s in stats:
        print(f"{s.name}: fired {s.fired} in {s.seconds * 1e3:.1f} ms {s.details}", file=sys.stderr)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
