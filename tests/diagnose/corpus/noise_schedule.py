"""A denoiser that takes its noise level from a schedule generator stored on the module."""

from __future__ import annotations

import torch
import torch.nn as nn


def cosine_decay(start: float = 1.0, factor: float = 0.9):
    level = start
    while True:
        yield level
        level *= factor


class Denoiser(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.noise_levels = cosine_decay()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sigma = next(self.noise_levels)
        return self.net(x + sigma * torch.randn_like(x))


def build():
    torch.manual_seed(0)
    return Denoiser(), torch.randn(4, 32)
