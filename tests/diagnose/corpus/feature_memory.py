"""A retrieval encoder that keeps the mean embedding of every batch it has seen, for monitoring."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MemoryEncoder(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.batch_means: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.normalize(self.norm(self.proj(x)), dim=-1)
        self.batch_means.append(z.detach().mean(0))
        return z


def build():
    torch.manual_seed(0)
    return MemoryEncoder(), torch.randn(4, 32)
