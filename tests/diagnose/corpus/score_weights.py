"""Two ways of reading numbers out of tensors in forward: mixing weights as a float list (no config
flag removes that break) and a count from a sum (capture_scalar_outputs does)."""

from __future__ import annotations

import torch
import torch.nn as nn


class MixedHeads(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))
        self.register_buffer("mix", torch.tensor([0.5, 0.25, 0.25]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.mix.tolist()
        return sum(w * head(x) for w, head in zip(weights, self.heads))


class TruncatedHead(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = int((x > 0).sum().item()) % 4 + 1
        return self.fc(x)[:, :keep].sum(1)


def mixed():
    torch.manual_seed(0)
    return MixedHeads(), torch.randn(4, 16)


def truncated():
    torch.manual_seed(0)
    return TruncatedHead(), torch.randn(4, 16)
