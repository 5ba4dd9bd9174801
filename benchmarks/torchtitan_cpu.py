"""TorchTitan's trainer on CPU: the reference the ``neuron`` runs are compared with.

TorchTitan trains on ``torch.accelerator``'s device and falls back to "cuda" when there is none, so a
CPU run needs the device type named. This launcher (run with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, so
no ``neuron`` device is registered) makes ``torch._utils._get_available_device_type`` answer "cpu"
before TorchTitan is imported, and gives ``torch.cpu`` the few memory-statistics calls TorchTitan's
metrics make of a device module (and a current_device that is an index). Everything else is TorchTitan's own ``train.main`` with the
command line as given. The ``neuron`` runs need none of this: ``python -m torchtitan.train``.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python benchmarks/torchtitan_cpu.py --job.config_file ... [flags]
"""

from __future__ import annotations

import platform
import types

import torch
import torch._utils


def _cpu_device_module() -> None:
    cpu = torch.cpu
    props = types.SimpleNamespace(total_memory=1 << 40, name=platform.processor() or "cpu")
    defaults = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: props,
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {},
    }
    for name, fn in defaults.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)
    # torch.cpu.current_device() answers "cpu"; TorchTitan passes it to barrier(device_ids=[...]),
    # which takes ints (the index is ignored by gloo)
    cpu.current_device = lambda: 0


def main() -> None:
    torch._utils._get_available_device_type = lambda: "cpu"
    _cpu_device_module()
    from torchtitan.train import Trainer, main as train_main

    train_main(Trainer)


if __name__ == "__main__":
    main()
