"""The seed article's (001) four-graph-break model, as a `kiln explain` target.

    kiln explain examples/seed_graph_breaks.py:build
    kiln explain examples/seed_graph_breaks.py:build --fullgraph-check

The article (torch 2.0) marks four lines of forward as graph breaks: an assert on a tensor,
`.item()`, a loop over a NumPy array and `print`. Newer torch traces some of them; the report says
which, and why, by comparing with KILN_SEED_EXPECTATIONS below. The model is the article's, only
made importable (the article builds it inside a function).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = "seed 001 (torch 2.0, torch._dynamo.explain)"
KILN_SEED_EXPECTATIONS = [
    {"construct": "assert on a tensor", "kind": "assert", "match": "assert torch.all(x >= 0)",
     "expected_break": True, "source": SEED},
    {"construct": ".item() into a Python dict", "kind": "item", "match": ".item()",
     "expected_break": True, "source": SEED},
    {"construct": "loop over np.arange", "kind": "numpy", "match": "for k in np.arange(1):",
     "expected_break": True, "source": SEED},
    {"construct": "print of a tensor", "kind": "print", "match": "print(x)",
     "expected_break": True, "source": SEED},
]


class DumbNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(1176, 10)
        self.fc2 = nn.Linear(10, 10)
        self.fc3 = nn.Linear(10, 10)
        self.fc4 = nn.Linear(10, 10)
        self.d: dict[str, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = torch.flatten(x, 1)
        assert torch.all(x >= 0)  # graph break (seed)
        x = self.fc1(x)
        self.d["fc1-out"] = x.sum().item()  # graph break (seed)
        x = self.fc2(x)
        for k in np.arange(1):  # graph break (seed)  # noqa: B007
            x = self.fc3(x)
        print(x)  # graph break (seed)
        x = self.fc4(x)
        return x


def build(batch_size: int = 4):
    """(model, example input): the article's 4x3x32x32 random image batch."""
    torch.manual_seed(0)
    return DumbNet(), torch.randn(batch_size, 3, 32, 32)
