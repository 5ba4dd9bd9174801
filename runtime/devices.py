"""How many ``neuron`` devices this process has, and whether they queue their eager ops: cheap (no jax), read by
the device module at ``import torch`` and by the executor when it makes its PJRT client (one CPU PJRT device
per ``neuron`` index, dispatching asynchronously where ops are queued: ``queues_eager_ops``).

    NEURON_DEVICE_COUNT   set it (1 to 64)
    LOCAL_WORLD_SIZE      otherwise, under torchrun: one device per local rank, so each rank works on
                          neuron:<LOCAL_RANK>, as each uses its own GPU (its own PJRT client, in its process)
    otherwise             1
"""

from __future__ import annotations

import os

ENV = "NEURON_DEVICE_COUNT"
MAX_DEVICES = 64


def local_device_count() -> int:
    for name in (ENV, "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r}: the number of neuron devices must be an integer") from None
        if not 1 <= count <= MAX_DEVICES:
            raise ValueError(f"{name}={count}: the number of neuron devices must be between 1 and {MAX_DEVICES}")
        return count
    return 1


def env_flag(name: str, default: bool) -> bool:
    """An on/off environment variable: unset is ``default``; ``0``, ``false``, ``no``, ``off`` or empty is off."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() not in ("0", "false", "no", "off", "")


def queues_eager_ops() -> bool:
    """The device queues and fuses its eager ops (``device/op_queue.py``) unless ``NEURON_COMPILE_EAGER_FUSION=0``
    or ``NEURON_LAUNCH_BLOCKING=1`` (every op run when issued)."""
    return env_flag("NEURON_COMPILE_EAGER_FUSION", True) and not env_flag("NEURON_LAUNCH_BLOCKING", False)
