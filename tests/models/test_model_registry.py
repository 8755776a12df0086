"""Name resolution, error messages and find_repeated_blocks."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn as nn

from kiln.config import ConfigError, ModelConfig
from kiln.models import build_model, find_repeated_blocks, known_models


def test_known_models() -> None:
    names = known_models()
    assert {"mlp", "vit", "hf:llama-3.2-3b", "hf:llama-tiny", "hf:gpt2-tiny"} <= set(names)


def test_unknown_name_lists_known_and_forms() -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*unknown model 'vitt'.*did you mean 'vit'") as info:
        build_model(ModelConfig(name="vitt"))
    assert "mlp" in info.value.choices and "timm:<name>" in info.value.choices
    assert "package.module:function" in info.value.choices


def test_bad_task() -> None:
    with pytest.raises(ConfigError, match=r"model\.task"):
        build_model(ModelConfig(task="regression"))


def test_task_override_builtin() -> None:
    assert build_model(ModelConfig(kwargs={"hidden_size": 8, "num_layers": 1}, task="custom")).task == "custom"


def test_timm_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # timm is not installable here; force the path
    import torch

    # A CPU build of torch (this test machine's) is told to take torchvision's CPU wheel, not the
    # extra whose PyPI torchvision breaks it; a CUDA build is told the extra.
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ConfigError, match=r"model\.name.*timm.*download\.pytorch\.org/whl/cpu.*pip install timm"):
        build_model(ModelConfig(name="timm:vit_base_patch16_224"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(ConfigError, match=r"model\.name.*timm.*pip install 'kiln\[vision\]'$"):
        build_model(ModelConfig(name="timm:vit_base_patch16_224"))


class _Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        # A nested repeat inside each layer: smaller, so the outer list must win.
        self.sub = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.small = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.layers = nn.ModuleList(_Layer(16) for _ in range(3))


def test_find_repeated_blocks_picks_largest_share() -> None:
    model = _Model()
    blocks = find_repeated_blocks(model)
    assert blocks == list(model.layers)
    assert find_repeated_blocks(model, min_repeats=4) == []
    assert find_repeated_blocks(nn.Linear(2, 2)) == []
    assert find_repeated_blocks(nn.Sequential(nn.ReLU(), nn.ReLU())) == []  # nothing to wrap


def test_find_repeated_blocks_on_builtins() -> None:
    mlp = build_model(ModelConfig(kwargs={"hidden_size": 8, "num_layers": 6})).module
    assert find_repeated_blocks(mlp) == list(mlp.backbone)
    with torch.device("meta"):
        vit = build_model(ModelConfig(name="vit", kwargs={"depth": 4})).module
    assert find_repeated_blocks(vit) == list(vit.blocks)


def test_find_repeated_blocks_on_llama() -> None:
    pytest.importorskip("transformers")
    model = build_model(ModelConfig(name="hf:llama-tiny", kwargs={"num_hidden_layers": 3})).module
    blocks = find_repeated_blocks(model)
    assert len(blocks) == 3 and all(type(b).__name__ == "LlamaDecoderLayer" for b in blocks)


def _fake_timm() -> types.ModuleType:
    """Just enough of timm 1.x's API (is_model, list_models, create_model) to run kiln's adapter."""

    class TinyTimmNet(nn.Module):
        def __init__(self, num_classes: int = 1000, img_size: int = 224):
            super().__init__()
            self.num_classes = num_classes
            self.pretrained_cfg = {"input_size": (3, 224, 224), "num_classes": 1000}
            self.blocks = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))

    fake = types.ModuleType("timm")
    fake.list_models = lambda: ["tiny_net", "tiny_net2"]
    fake.is_model = lambda name: name in fake.list_models()
    fake.create_model = lambda name, pretrained=False, **kw: TinyTimmNet(**kw)
    return fake


def test_timm_adapter_with_fake_timm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", _fake_timm())
    built = build_model(ModelConfig(name="timm:tiny_net", kwargs={"num_classes": 7, "img_size": 96}))
    assert built.task == "classification" and len(built.blocks) == 3
    assert built.input_spec.shape == (3, 96, 96) and built.input_spec.num_classes == 7
    with pytest.raises(ConfigError, match=r"model\.name.*no model 'tiny_nett'") as info:
        build_model(ModelConfig(name="timm:tiny_nett"))
    assert "timm:tiny_net" in info.value.choices
    with pytest.raises(ConfigError, match=r"model\.kwargs.*rejected"):
        build_model(ModelConfig(name="timm:tiny_net", kwargs={"depth": 3}))


def test_vit_attention_backend_is_a_choice():
    import torch

    from kiln.errors import ConfigError
    from kiln.models.vit import build_vit

    small = dict(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=5)
    torch.manual_seed(0)
    auto = build_vit(**small)
    pinned = build_vit(**small, attn_backend="math")
    pinned.load_state_dict(auto.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(auto(x), pinned(x), atol=1e-5)
    with pytest.raises(ConfigError, match="model.kwargs.attn_backend"):
        build_vit(**small, attn_backend="fast")
