"""Input noise drawn from the module's own torch.Generator, for reproducible augmentation."""

from __future__ import annotations

import torch
import torch.nn as nn


class NoisyInput(nn.Module):
    def __init__(self, dim: int = 16, sigma: float = 0.1) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.sigma = sigma
        self.rng = torch.Generator().manual_seed(1234)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=self.rng) * self.sigma
        return self.fc(x + noise)


def build():
    torch.manual_seed(0)
    return NoisyInput(), torch.randn(4, 16)
