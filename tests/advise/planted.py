"""Planted models for the advise tests. Each factory returns (module, input spec dict): what
`kiln advise`, `kiln explain` and `kiln train` all take as a TARGET."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES = {"kind": "features", "shape": [100], "num_classes": 10}


def misaligned():
    """100 input features, 30 hidden, 10 classes: K=100, N=30, K=30 and N=10 are not multiples of 8."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 30), nn.GELU(), nn.Linear(30, 10)), FEATURES


def aligned():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)), {
        "kind": "features", "shape": [64], "num_classes": 16}


class EagerOnly(nn.Module):
    """Breaks torch.compile's graph twice per call: a data-dependent branch and a host read."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        h = self.fc1(x)
        if h.mean() > 0:  # planted: branch
            h = h * 2
        scale = h.abs().max().item()  # planted: item
        return self.fc2(h / (scale + 1))


def eager_only():
    torch.manual_seed(0)
    return EagerOnly(), {"kind": "features", "shape": [64], "num_classes": 16}


def convnet():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 8))
    return model, {"kind": "images", "shape": [3, 16, 16], "num_classes": 8}


class SlowDataset(Dataset):
    """Features for `aligned`, each sample costing 4 ms of host time to read (a slow disk or decoder)."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int):
        time.sleep(0.004)  # planted: slow loader (the work a real loader does, not a synchronisation)
        gen = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=gen), index % 16


def slow_data():
    return SlowDataset()
