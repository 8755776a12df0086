"""A residual block that verifies its activations with a helper kept out of compilation."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.compiler.disable
def activation_scale(h: torch.Tensor) -> torch.Tensor:
    return h.abs().amax(dim=-1, keepdim=True).clamp_min(1e-6)


class CheckedBlock(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = h / activation_scale(h)
        return x + self.fc2(h)


def build():
    torch.manual_seed(0)
    return CheckedBlock(), torch.randn(4, 32)
