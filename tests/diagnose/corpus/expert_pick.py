"""Mixture-of-experts style picks written with Python built-ins over tensors."""

from __future__ import annotations

import torch
import torch.nn as nn


class SortedExperts(nn.Module):
    """Applies experts in order of their mean activation."""

    def __init__(self, dim: int = 16, experts: int = 3) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [e(x) for e in self.experts]
        ranked = sorted(outs, key=lambda t: t.mean())
        return ranked[0] + 0.5 * ranked[-1]


class BestExpert(nn.Module):
    """Keeps the expert output with the largest norm."""

    def __init__(self, dim: int = 16, experts: int = 3) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [e(x) for e in self.experts]
        best = max(outs, key=lambda t: t.norm())
        return best.relu()


def ranked():
    torch.manual_seed(0)
    return SortedExperts(), torch.randn(4, 16)


def best():
    torch.manual_seed(0)
    return BestExpert(), torch.randn(4, 16)
