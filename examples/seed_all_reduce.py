"""The seed article's (001) model with `torch.distributed.all_reduce` inside forward.

    kiln explain examples/seed_all_reduce.py:build
    kiln doctor examples/seed_all_reduce.py:build

In the article (torch 2.0) eager and the `eager`/`aot_eager` backends worked and inductor failed
("torch.classes.c10d.ProcessGroup does not have a field with name 'shape'"), found by trying the
backends by hand and then the minifier; it also says distributed code needs graph breaks, so
fullgraph=True cannot be used. kiln runs the model inside a 1-process gloo group when no process
group exists (the article creates a 1-process NCCL group), and reports what this torch does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = "seed 001 (torch 2.0)"
KILN_SEED_EXPECTATIONS = [
    {"construct": "all_reduce inside forward", "kind": "collective", "match": "torch.distributed.all_reduce(sum_vals)",
     "expected_break": True, "expected_failure": "inductor", "source": SEED},
]


class DumbNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(1176, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        with torch.no_grad():
            sum_vals = torch.sum(x, 0)
            # the problematic line of the article
            torch.distributed.all_reduce(sum_vals)
        # add noise
        x = x + 0.1 * sum_vals
        return x


def build(batch_size: int = 4):
    """(model, example input): the article's 4x3x32x32 random images."""
    torch.manual_seed(0)
    return DumbNet(), torch.randn(batch_size, 3, 32, 32)
