"""A classifier that can also return its embeddings (for retrieval), chosen per call."""

from __future__ import annotations

import torch
import torch.nn as nn


class DualHead(nn.Module):
    def __init__(self, dim: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, return_embeddings: bool = False) -> torch.Tensor:
        h = self.encoder(x)
        if return_embeddings:
            return h
        return self.head(h)


def build():
    torch.manual_seed(0)
    return DualHead(), (torch.randn(4, 32), False)
