"""An encoder that logs the norm of its hidden state (standard library logging in forward)."""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

logger = logging.getLogger(__name__)


class LoggedEncoder(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        logger.info("hidden norm %.3f", h.norm())
        return torch.tanh(h)


def build():
    torch.manual_seed(0)
    return LoggedEncoder(), torch.randn(4, 32)
