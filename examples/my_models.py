"""Your own model in kiln: a factory function that returns `(model, example_inputs)`.

    kiln train model.name=examples/my_models.py:build model.kwargs.width=512
    kiln bench compile --model examples/my_models.py:build
    kiln explain examples/my_models.py:build
    kiln doctor examples/my_models.py:build

`example_inputs` is one batch forward accepts. kiln reads the input shape from it ([batch, 64]
features here) and the task from what the model returns on it ([batch, 10] logits: a 10-class
classifier), so synthetic data, benchmarks and diagnosis all know how to feed the model. Keyword
arguments of the factory are set with `model.kwargs.NAME=VALUE` (`--kwarg NAME=VALUE` for explain
and doctor). The layers come from the sibling module `my_blocks.py`: a model file may import
modules next to it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from my_blocks import ResidualMLPBlock


class TabularClassifier(nn.Module):
    def __init__(self, in_features: int, width: int, depth: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(ResidualMLPBlock(width) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build(width: int = 128, depth: int = 2, in_features: int = 64, num_classes: int = 10):
    """The model and one example batch of 8 rows."""
    model = TabularClassifier(in_features, width, depth, num_classes)
    return model, torch.randn(8, in_features)
