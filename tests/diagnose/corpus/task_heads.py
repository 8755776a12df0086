"""A multi-task model called the way its training loop calls it: a tensor, a task name, a dict of
extra features and a dataclass of options (none of them a tensor except the batch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class HeadOptions:
    scale: float = 2.0
    use_bias: bool = True


class TaskHeads(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.trunk = nn.Linear(dim, dim)
        self.heads = nn.ModuleDict({"classify": nn.Linear(dim, 4), "regress": nn.Linear(dim, 1)})

    def forward(self, x: torch.Tensor, task: str, extra: dict, options: HeadOptions) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        if options.use_bias:
            h = h + extra["bias"]
        out = self.heads[task](h)
        return out * options.scale


def _batch():
    torch.manual_seed(0)
    return torch.randn(4, 16), {"bias": torch.zeros(16)}


def build():
    x, extra = _batch()
    return TaskHeads(), (x, "classify", extra, HeadOptions())


def calls():
    """`--inputs-from task_heads.py:calls`: the loop alternates the tasks."""
    x, extra = _batch()
    return [(x, "classify", extra, HeadOptions()), (x, "regress", extra, HeadOptions())]
