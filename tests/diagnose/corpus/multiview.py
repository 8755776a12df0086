"""A multi-view encoder: forward takes any number of augmented views of the same batch."""

from __future__ import annotations

import torch
import torch.nn as nn


class MultiViewEncoder(nn.Module):
    def __init__(self, dim: int = 32, out: int = 16) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, out))

    def forward(self, *views: torch.Tensor) -> torch.Tensor:
        embeddings = [self.backbone(v) for v in views]
        return torch.stack(embeddings).mean(0)


def build():
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    return MultiViewEncoder(), (x, x + 0.1)
