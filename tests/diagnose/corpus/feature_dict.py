"""A fusion model that sums the embeddings of whichever modalities a batch has (a dict input)."""

from __future__ import annotations

import torch
import torch.nn as nn


class LateFusion(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.ModuleDict({name: nn.Linear(dim, dim) for name in ("audio", "text", "video")})

    def forward(self, features: dict) -> torch.Tensor:
        total = 0
        for name in features:
            total = total + self.embed[name](features[name])
        return total


def build():
    torch.manual_seed(0)
    return LateFusion(), ({"audio": torch.randn(4, 16)},)


def calls():
    x = torch.randn(4, 16)
    return [({"audio": x},), ({"audio": x, "text": x},), ({"text": x, "video": x},)]
