"""Custom ops as a user writes them with torch.library: a gated activation whose fake implementation
declares the wrong layout, a clamp op registered without any fake implementation, and a pooling op
whose fake implementation declares the wrong shape."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.library.custom_op("kiln_corpus::gated_gelu", mutates_args=())
def gated_gelu(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.gelu(x) * torch.sigmoid(gate)).contiguous()


@gated_gelu.register_fake
def _(x, gate):
    # Meant to save a copy in the backward pass: claims a column-major output.
    return torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype, device=x.device)


@torch.library.custom_op("kiln_corpus::soft_clamp", mutates_args=())
def soft_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
    return limit * torch.tanh(x / limit)


class GatedMLP(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.value = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = gated_gelu(self.value(x), self.gate(x))
        return self.out(h.relu())


class ClampedHead(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return soft_clamp(self.fc(x), 3.0)


def gated():
    torch.manual_seed(0)
    return GatedMLP(), torch.randn(4, 16)


def clamped():
    torch.manual_seed(0)
    return ClampedHead(), torch.randn(4, 16)


@torch.library.custom_op("kiln_corpus::pool_pairs", mutates_args=())
def pool_pairs(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] // 2, 2, x.shape[1]).mean(1)


@pool_pairs.register_fake
def _(x):
    # Copied from an elementwise op: the real kernel halves the rows.
    return torch.empty_like(x)


class PairPool(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = pool_pairs(self.fc(x))
        return h.relu()


def pooled():
    torch.manual_seed(0)
    return PairPool(), torch.randn(4, 16)
