"""An energy model that returns forces, the gradient of the energy with respect to positions."""

from __future__ import annotations

import torch
import torch.nn as nn


class EnergyForces(nn.Module):
    def __init__(self, dim: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        positions = positions.detach().requires_grad_(True)
        energy = self.net(positions).sum()
        (grad,) = torch.autograd.grad(energy, positions, create_graph=True)
        return -grad


def build():
    torch.manual_seed(0)
    return EnergyForces(), torch.randn(8, 3)
