"""One output head per dataset, chosen by the dataset's name; the training loop visits twelve datasets."""

from __future__ import annotations

import torch
import torch.nn as nn

DATASETS = tuple(f"set{i}" for i in range(12))


class DatasetHeads(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.trunk = nn.Linear(dim, dim)
        self.heads = nn.ModuleDict({name: nn.Linear(dim, 2) for name in DATASETS})

    def forward(self, x: torch.Tensor, dataset: str) -> torch.Tensor:
        return self.heads[dataset](torch.relu(self.trunk(x)))


def build():
    torch.manual_seed(0)
    return DatasetHeads(), (torch.randn(4, 16), DATASETS[0])


def calls():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    return [(x, name) for name in DATASETS]
