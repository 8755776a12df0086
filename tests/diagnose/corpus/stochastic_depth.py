"""A residual block with stochastic depth (the branch is skipped at random while training)."""

from __future__ import annotations

import random

import torch
import torch.nn as nn


class DropPathBlock(nn.Module):
    def __init__(self, dim: int = 32, drop_prob: float = 0.2) -> None:
        super().__init__()
        self.branch = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if random.random() < self.drop_prob:
            return x
        return x + self.branch(x)


def build():
    torch.manual_seed(0)
    random.seed(0)
    return DropPathBlock(), torch.randn(4, 32)
