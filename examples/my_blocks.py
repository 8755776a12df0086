"""Building blocks for `my_models.py` (imported from it as a sibling module)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResidualMLPBlock(nn.Module):
    """Pre-norm residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, width: int, expansion: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, width * expansion)
        self.down = nn.Linear(width * expansion, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))
