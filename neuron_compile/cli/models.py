"""Small built-in models in plain torch, so the CLI and the demo need no download.

* ``TinyGPT``: a GPT-2-style decoder (token and position embeddings, pre-norm
  blocks of causal self-attention and a GELU MLP, tied LM head) whose forward
  returns the causal-LM loss when given ``labels``; ``n_layer`` sets its depth
  (the compile-time ladder in ``benchmarks/`` grows it).
* ``MLP``: two linear layers with a ReLU.
* ``SmallCNN``: conv2d, BatchNorm, ReLU, max-pool, then a linear classifier.

Weights are random (seeded by the caller); nothing here imports transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.n_positions, cfg.n_positions, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.n_positions, cfg.n_positions), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, head_dim)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.n_head)
        scores = scores.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.out = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


def _gpt2_init(module: nn.Module) -> None:
    # GPT-2's initialisation: N(0, 0.02) weights, zero biases (logits start small, loss near ln(vocab))
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class TinyGPT(nn.Module):
    """GPT-2-style decoder. ``forward(input_ids, labels=None)`` -> logits, or the loss when labels are given."""

    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.apply(_gpt2_init)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        if labels is None:
            return logits
        # causal-LM loss: position i predicts token i+1
        shift_logits = logits[:, :-1, :].reshape(-1, self.cfg.vocab_size)
        return F.cross_entropy(shift_logits, labels[:, 1:].reshape(-1))


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(channels * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.head(x.flatten(1))
