"""The seed MLP: kiln's default model.

Same layers and forward math as the seed article's `OptimizedModel`
(num_layers x [Linear, LayerNorm, GELU, Dropout] + a Linear/ReLU/Linear head), with each repeated
group of four layers held by an `MLPBlock` so that regional compile, FSDP2 and activation
checkpointing have a unit to work on (the seed's flat Sequential has none).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from kiln.errors import ConfigError
from kiln.models.spec import InputSpec


class MLPBlock(nn.Module):
    """Linear(h, h) -> LayerNorm(h) -> GELU -> Dropout(p): one repeat of the seed backbone."""

    def __init__(self, hidden_size: int, dropout: float):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.act(self.norm(self.linear(x))))


class SeedMLP(nn.Module):
    """Backbone of `num_layers` MLPBlocks, then Linear(h, h//2) -> ReLU -> Linear(h//2, classes)."""

    def __init__(self, hidden_size: int, num_layers: int, num_classes: int, dropout: float, input_dim: int):
        super().__init__()
        # The seed feeds hidden_size features straight in; other widths need a projection first.
        self.input_proj: nn.Module = nn.Identity() if input_dim == hidden_size else nn.Linear(input_dim, hidden_size)
        self.backbone = nn.Sequential(*(MLPBlock(hidden_size, dropout) for _ in range(num_layers)))
        self.head = nn.Sequential(
            nn.Linear(hidden_size, hidden_size // 2),
            nn.ReLU(),
            nn.Linear(hidden_size // 2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(self.input_proj(x)))


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"model.kwargs.{name}", f"must be >= 1, got {value!r}")


def build_mlp(
    hidden_size: int = 256,
    num_layers: int = 4,
    num_classes: int = 10,
    dropout: float = 0.1,
    input_dim: int | None = None,
) -> SeedMLP:
    """The seed MLP; `input_dim` defaults to `hidden_size` (no input projection, as in the seed)."""
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers), ("num_classes", num_classes)):
        _positive(name, value)
    if hidden_size < 2:
        # The head halves the width; h=1 would give a zero-width layer.
        raise ConfigError(
            "model.kwargs.hidden_size", f"must be >= 2 (the head uses hidden_size // 2), got {hidden_size}"
        )
    if input_dim is not None:
        _positive("input_dim", input_dim)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError("model.kwargs.dropout", f"must be in [0, 1), got {dropout!r}")
    return SeedMLP(hidden_size, num_layers, num_classes, dropout, input_dim or hidden_size)


def mlp_input_spec(kwargs: dict) -> InputSpec:
    """InputSpec from the factory's resolved arguments (defaults filled in)."""
    dim = kwargs["input_dim"] or kwargs["hidden_size"]
    return InputSpec("features", (dim,), num_classes=kwargs["num_classes"])
