"""What a pass hands back to the pipeline.

A pass's ``apply(module)`` mutates the module in place and returns a
``PassResult``: how often it fired (rewrites made; 0 means "no match", the one
convention for "nothing to do") and free-form ``details`` for the compile
report (counts by kind, bytes saved, ...). Timing is the pipeline's job, not
the pass's, so every pass is timed the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassResult:
    fired: int = 0
    details: dict[str, Any] = field(default_factory=dict)
