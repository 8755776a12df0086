"""hf:<spec>: presets, config.json files and local directories, never downloading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kiln.config import ConfigError, ModelConfig
from kiln.models import build_model

pytest.importorskip("transformers")


@pytest.mark.parametrize(("preset", "layer_class"), [("llama-tiny", "LlamaDecoderLayer"), ("gpt2-tiny", "GPT2Block")])
def test_tiny_presets_forward(preset: str, layer_class: str) -> None:
    torch.manual_seed(0)
    built = build_model(ModelConfig(name=f"hf:{preset}"))
    assert built.task == "causal_lm" and built.name == f"hf:{preset}"
    spec = built.input_spec
    assert spec.kind == "tokens" and spec.shape == (256,) and spec.vocab_size == 512
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    logits = built.module(tokens).logits
    assert logits.shape == (2, 16, 512)
    assert len(built.blocks) == 2 and all(type(b).__name__ == layer_class for b in built.blocks)
    assert built.module.config._attn_implementation == "sdpa"


def test_llama_3b_preset_shapes() -> None:
    with torch.device("meta"):
        built = build_model(ModelConfig(name="hf:llama-3.2-3b"))
    cfg = built.module.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (3072, 8192, 28)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (24, 8, 128256)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 131072
    assert sum(p.numel() for p in built.module.parameters()) == 3_212_749_824
    assert len(built.blocks) == 28
    assert built.input_spec.shape == (1024,) and built.input_spec.vocab_size == 128256


def test_kwargs_override_fields() -> None:
    built = build_model(ModelConfig(name="hf:llama-tiny", kwargs={"num_hidden_layers": 3, "hidden_size": 128}))
    assert len(built.blocks) == 3
    # head_dim follows the overridden width (kwargs are applied before the config is built).
    assert built.module.config.head_dim == 32
    out = built.module(torch.randint(0, 512, (1, 8))).logits
    assert out.shape == (1, 8, 512)


def test_unknown_field_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model\.kwargs\.num_hiden_layers.*num_hidden_layers"):
        build_model(ModelConfig(name="hf:llama-tiny", kwargs={"num_hiden_layers": 3}))


def test_from_config_json(tmp_path: Path) -> None:
    fields = {
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    built = build_model(ModelConfig(name=f"hf:{path}"))
    assert built.input_spec.shape == (128,) and built.input_spec.vocab_size == 300
    assert len(built.blocks) == 3
    assert built.module(torch.randint(0, 300, (1, 5))).logits.shape == (1, 5, 300)


def test_from_saved_dir_reloads_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    original = build_model(ModelConfig(name="hf:llama-tiny")).module
    original.save_pretrained(tmp_path / "ckpt")
    reloaded = build_model(ModelConfig(name=f"hf:{tmp_path / 'ckpt'}")).module
    theirs = reloaded.state_dict()
    for key, value in original.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    tokens = torch.randint(0, 512, (1, 6))
    original.eval()
    reloaded.eval()
    torch.testing.assert_close(original(tokens).logits, reloaded(tokens).logits, rtol=0, atol=0)


def test_dir_without_weights_builds_from_config(tmp_path: Path) -> None:
    build_model(ModelConfig(name="hf:gpt2-tiny")).module.config.save_pretrained(tmp_path)
    built = build_model(ModelConfig(name=f"hf:{tmp_path}"))
    assert type(built.module).__name__ == "GPT2LMHeadModel" and len(built.blocks) == 2


def test_dir_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*no config\.json"):
        build_model(ModelConfig(name=f"hf:{tmp_path}"))


def test_unknown_preset_lists_forms() -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*llama-tinyy.*did you mean 'hf:llama-tiny'") as info:
        build_model(ModelConfig(name="hf:llama-tinyy"))
    assert "hf:llama-3.2-3b" in info.value.choices


def test_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"model\.name.*cannot read HF config"):
        build_model(ModelConfig(name=f"hf:{path}"))


def test_transformers_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ConfigError, match=r"model\.name.*transformers.*kiln\[llm\]"):
        build_model(ModelConfig(name="hf:llama-tiny"))
