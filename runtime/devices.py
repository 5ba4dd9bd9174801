"""How many ``neuron`` devices this process has: cheap (no jax), read by the device module at ``import torch``
and by the executor when it makes its PJRT client (one CPU PJRT device per ``neuron`` index).

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
