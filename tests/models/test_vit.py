"""kiln's ViT: timm vit_base_patch16_224 shapes at the defaults."""

from __future__ import annotations

import pytest
import torch

from kiln.config import ConfigError, ModelConfig
from kiln.models import build_model
from kiln.models.vit import ViTBlock

SMALL = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 4, "num_classes": 5}


def test_default_param_count_equals_timm_vit_base() -> None:
    with torch.device("meta"):  # shapes only, no 350 MB of fp32 weights
        built = build_model(ModelConfig(name="vit"))
    assert sum(p.numel() for p in built.module.parameters()) == 86_567_656
    assert built.module.pos_embed.shape == (1, 197, 768)
    assert len(built.blocks) == 12 and all(isinstance(b, ViTBlock) for b in built.blocks)
    assert built.input_spec.kind == "images" and built.input_spec.shape == (3, 224, 224)
    assert built.input_spec.num_classes == 1000
    assert built.task == "classification"


def test_small_vit_forward_and_backward() -> None:
    torch.manual_seed(0)
    built = build_model(ModelConfig(name="vit", kwargs=SMALL))
    spec = built.input_spec
    assert spec.shape == (3, 32, 32)
    x = torch.randn(2, *spec.shape)
    out = built.module(x)
    assert out.shape == (2, 5)
    out.sum().backward()
    assert built.module.cls_token.grad is not None
    assert len(built.blocks) == 3


def test_init_biases_zero_and_small_weights() -> None:
    torch.manual_seed(0)
    m = build_model(ModelConfig(name="vit", kwargs=SMALL)).module
    assert torch.count_nonzero(m.blocks[0].attn.qkv.bias) == 0
    # trunc_normal_(std=.02) as timm (its cut-offs a=-2, b=2 are absolute, so ~normal(0, .02)).
    assert 0.018 < m.blocks[0].attn.qkv.weight.std().item() < 0.022
    assert 0.018 < m.pos_embed.std().item() < 0.022


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({**SMALL, "patch_size": 5}, "model.kwargs.patch_size"),
        ({**SMALL, "num_heads": 5}, "model.kwargs.num_heads"),
        ({**SMALL, "qkv_bias": "yes"}, "model.kwargs.qkv_bias"),
        ({**SMALL, "heads": 4}, "model.kwargs.heads"),
    ],
)
def test_bad_kwargs(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_model(ModelConfig(name="vit", kwargs=kwargs))
