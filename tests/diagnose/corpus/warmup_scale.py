"""A residual scale warmed up over the first steps with a Python counter kept on the module."""

from __future__ import annotations

import torch
import torch.nn as nn


class WarmupResidual(nn.Module):
    def __init__(self, dim: int = 16, warmup: int = 100) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.warmup = warmup
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        ramp = min(1.0, self.calls / self.warmup)
        return x + ramp * self.fc(x)


def build():
    torch.manual_seed(0)
    return WarmupResidual(), torch.randn(4, 16)
