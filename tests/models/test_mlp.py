"""The seed MLP: same layers and forward math as the seed article's OptimizedModel."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kiln.config import ConfigError, ModelConfig
from kiln.models import build_model
from kiln.models.mlp import MLPBlock


def _count(module: nn.Module, cls: type) -> int:
    return sum(isinstance(m, cls) for m in module.modules())


def _seed_mlp(hidden: int, layers: int, classes: int, dropout: float) -> nn.Module:
    """The seed's flat layout, rebuilt here to compare against."""
    backbone = []
    for _ in range(layers):
        backbone += [nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Dropout(dropout)]
    return nn.Sequential(
        nn.Sequential(*backbone),
        nn.Sequential(nn.Linear(hidden, hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, classes)),
    )


def test_default_mlp_builds_and_runs() -> None:
    built = build_model(ModelConfig())
    assert built.name == "mlp" and built.task == "classification"
    spec = built.input_spec
    assert spec is not None and spec.kind == "features" and spec.shape == (256,) and spec.num_classes == 10
    out = built.module(torch.randn(4, *spec.shape))
    assert out.shape == (4, 10)


def test_structure_matches_seed() -> None:
    built = build_model(ModelConfig(kwargs={"hidden_size": 32, "num_layers": 5, "num_classes": 7, "dropout": 0.2}))
    m = built.module
    assert _count(m, nn.Linear) == 5 + 2
    assert _count(m, nn.LayerNorm) == 5
    assert _count(m, nn.GELU) == 5
    assert _count(m, nn.Dropout) == 5
    assert _count(m, nn.ReLU) == 1
    assert all(d.p == 0.2 for d in m.modules() if isinstance(d, nn.Dropout))
    assert isinstance(m.input_proj, nn.Identity)
    assert len(built.blocks) == 5 and all(isinstance(b, MLPBlock) for b in built.blocks)
    seed = _seed_mlp(32, 5, 7, 0.2)
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in seed.parameters())


def test_forward_math_identical_to_seed() -> None:
    torch.manual_seed(0)
    built = build_model(ModelConfig(kwargs={"hidden_size": 16, "num_layers": 3, "num_classes": 5}))
    seed = _seed_mlp(16, 3, 5, 0.1)
    # Same parameter order (block by block, then head): copy ours into the seed layout.
    with torch.no_grad():
        for ours, theirs in zip(built.module.parameters(), seed.parameters(), strict=True):
            theirs.copy_(ours)
    built.module.eval()
    seed.eval()
    x = torch.randn(8, 16)
    torch.testing.assert_close(built.module(x), seed(x), rtol=0, atol=0)


def test_input_dim_adds_projection() -> None:
    built = build_model(ModelConfig(kwargs={"hidden_size": 32, "num_layers": 2, "input_dim": 12}))
    assert isinstance(built.module.input_proj, nn.Linear) and built.module.input_proj.in_features == 12
    assert built.input_spec.shape == (12,)
    assert built.module(torch.randn(2, 12)).shape == (2, 10)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num_layers": 0}, "model.kwargs.num_layers"),
        ({"dropout": 1.5}, "model.kwargs.dropout"),
        ({"hidden_size": "big"}, "model.kwargs.hidden_size"),
        ({"num_layers": 2.5}, "model.kwargs.num_layers"),
        ({"hidden_sise": 64}, "model.kwargs.hidden_sise"),
    ],
)
def test_bad_kwargs(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_model(ModelConfig(kwargs=kwargs))


def test_unknown_kwarg_lists_valid_and_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'hidden_size'") as info:
        build_model(ModelConfig(kwargs={"hidden_sise": 64}))
    assert info.value.key == "model.kwargs.hidden_sise"
    assert info.value.choices is not None and "num_layers" in info.value.choices


def test_int_accepted_for_float_kwarg() -> None:
    built = build_model(ModelConfig(kwargs={"hidden_size": 8, "num_layers": 1, "dropout": 0}))
    assert len(built.blocks) == 1 and built.blocks[0].drop.p == 0
