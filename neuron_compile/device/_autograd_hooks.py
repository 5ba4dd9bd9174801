"""The private autograd API the device reads: whether the autograd engine is running a backward.

``torch._C._current_graph_task_id()`` is -1 outside the engine and the running graph task's id inside
it (``torch.utils.checkpoint`` reads it so). ``tests/test_device_hooks.py`` checks both, so a torch upgrade
that changes it fails there, by name.
"""

from __future__ import annotations

import torch


def in_backward() -> bool:
    """Whether this thread runs inside the autograd engine (a backward: grad mode is off there too)."""
    return torch._C._current_graph_task_id() != -1
