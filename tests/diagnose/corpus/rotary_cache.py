"""Rotary position angles cached per sequence length, the way many attention blocks memoise them."""

from __future__ import annotations

import torch
import torch.nn as nn


class RotaryAttention(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qk = nn.Linear(dim, dim)
        self.dim = dim
        self._angles: dict[int, torch.Tensor] = {}

    def angles(self, seq_len: int) -> torch.Tensor:
        if seq_len not in self._angles:
            inv = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
            self._angles[seq_len] = torch.outer(torch.arange(seq_len).float(), inv).repeat(1, 2)
        return self._angles[seq_len]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[1]
        theta = self.angles(seq_len)
        q = self.qk(x)
        return q * torch.cos(theta) + q.flip(-1) * torch.sin(theta)


def build():
    torch.manual_seed(0)
    return RotaryAttention(), torch.randn(2, 16, 16)
