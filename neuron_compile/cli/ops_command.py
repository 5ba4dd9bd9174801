"""``neuron-compile ops SCRIPT [ARGS...]``: which ATen ops a script ran on the neuron device, and which on the host.

Runs the script in this process (``runpy``, as ``python SCRIPT ARGS`` would,
``sys.argv`` set), with the device's op tracking cleared first, then prints
``torch.neuron.get_executed_ops()`` and ``get_fallback_ops()``: every op that
reached the device with its call count, and those that ran on host copies
(data-dependent output shapes, ``fallback="eager"`` ops that do not lower...).
A script that fails still reports what ran before the failure (exit 1).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

from .common import UsageError


def cmd_ops(args) -> int:
    import torch

    from ..device.op_tracking import format_ops

    if not os.path.isfile(args.script):
        raise UsageError(f"no script {args.script!r}")
    torch.neuron.clear_op_tracking()
    saved_argv, code = sys.argv, 0
    sys.argv = [args.script, *args.script_args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - the script's own failure: report what ran, then fail
        traceback.print_exc(file=sys.stderr)
        code = 1
    finally:
        sys.argv = saved_argv
    executed, fallback = torch.neuron.get_executed_ops(), torch.neuron.get_fallback_ops()
    if args.json:
        print(json.dumps({"script": args.script, "exit": code, "executed": executed, "fallback": fallback},
                         indent=1), file=args.stdout)
    else:
        print(f"ops of {args.script} on the neuron device ({sum(executed.values())} calls, "
              f"{len(executed)} ops):", file=args.stdout)
        print(format_ops(executed, fallback, args.limit), file=args.stdout)
    return code


def add_ops_parser(sub, command) -> None:
    p = command(sub, "ops", "run a script; list the ATen ops it ran on the neuron device and those run on the host",
                "neuron-compile ops train.py --epochs 1",
                """\
                Run SCRIPT (with ARGS) in this process, then print every ATen op that reached
                the neuron device with its call count, and the ops that ran on host copies of
                their tensors (torch.neuron.get_executed_ops() and get_fallback_ops(), TorchNeuron's
                op tracking). Exits with the script's status.""")
    p.add_argument("script", help="a Python script using the neuron device")
    p.add_argument("script_args", nargs="...", help="arguments passed to the script")
    p.add_argument("--limit", type=int, default=None, help="print at most this many ops (most called first)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(run=cmd_ops)
