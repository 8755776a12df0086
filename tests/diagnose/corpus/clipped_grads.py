"""A block whose custom autograd.Function normalises the gradient in backward, as gradient-clipping
layers do; the problem exists only when autograd runs (forward with autograd off never sees it)."""

from __future__ import annotations

import torch
import torch.nn as nn


class NormalizeGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        peak = grad.abs().max().item()
        return grad / max(peak, 1.0)


class ClippedBlock(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NormalizeGrad.apply(self.fc(x)).relu()


class TracedBlock(nn.Module):
    """Prints gradient norms from a hook it registers in forward (a debugging aid left in)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.requires_grad:
            h.register_hook(lambda g: print("grad norm", g.norm()))
        return h.relu()


def build():
    torch.manual_seed(0)
    return ClippedBlock(), torch.randn(4, 16)


def build_eval():
    torch.manual_seed(0)
    return ClippedBlock().eval(), torch.randn(4, 16)


def hooked():
    torch.manual_seed(0)
    return TracedBlock(), torch.randn(4, 16)
