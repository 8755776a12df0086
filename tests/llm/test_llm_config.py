"""config.json -> DecoderConfig: presets, both transformers spellings, per-family defaults, refusals."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.errors import ConfigError
from kiln.llm.config import config_from_dict, resolve_model
from kiln.llm.model import Decoder
from kiln.llm.presets import PRESETS
from kiln.llm.weights import decode_weight_bytes, empty_decoder


@pytest.mark.parametrize(("name", "params", "tied"), [
    ("llama-3.2-1b", 1_235_814_400, True),
    ("llama-3.2-3b", 3_212_749_824, True),
    ("llama-3.1-8b", 8_030_261_248, False),
])
def test_presets_have_the_public_parameter_counts(name, params, tied):
    config = resolve_model(name).config
    with torch.device("meta"):
        model = Decoder(config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert config.tie_embeddings is tied and config.rope.kind == "llama3"
    assert (model.lm_head.weight is model.embed.weight) is tied


def test_decode_weight_bytes_counts_the_output_head_once():
    tied = empty_decoder(resolve_model("llama-3.2-3b").config, device="meta", dtype=torch.bfloat16)
    assert decode_weight_bytes(tied) == 2 * 3_212_749_824  # 6.43 GB: BASELINES' roofline figure
    untied = empty_decoder(resolve_model("llama-3.1-8b").config, device="meta", dtype=torch.bfloat16)
    assert decode_weight_bytes(untied) == 2 * (8_030_261_248 - 128256 * 4096)  # input rows are looked up, not read


def test_transformers_4_and_5_spellings_agree():
    v4 = dict(PRESETS["llama-3.2-3b"])
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": v4["rope_theta"], **v4["rope_scaling"]}
    assert config_from_dict(v4) == config_from_dict(v5)
    legacy = dict(v4, rope_scaling={**v4["rope_scaling"], "type": "llama3"})
    del legacy["rope_scaling"]["rope_type"]
    assert config_from_dict(legacy).rope == config_from_dict(v4).rope


def test_family_defaults():
    base = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 4}
    qwen3 = config_from_dict({**base, "model_type": "qwen3"})
    assert qwen3.head_dim == 128 and qwen3.qk_norm and not qwen3.qkv_bias and qwen3.windows == ()
    qwen2 = config_from_dict({**base, "model_type": "qwen2", "attention_bias": False})
    assert qwen2.qkv_bias and not qwen2.out_bias  # Qwen2 always has q/k/v biases
    sliding = config_from_dict({**base, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
                                "max_window_layers": 2})
    assert sliding.windows == (None, None, 8, 8)
    mistral = config_from_dict({**base, "model_type": "mistral"})
    assert mistral.windows == (4096,) * 4 and mistral.max_positions == 4096 * 32  # MistralConfig's defaults
    assert config_from_dict({**base, "model_type": "mistral", "sliding_window": None}).windows == ()
    llama = config_from_dict({**base, "model_type": "llama", "num_key_value_heads": 2, "eos_token_id": [5, 6]})
    assert llama.n_groups == 2 and llama.head_dim == 16 and llama.eos_token_ids == (5, 6)


@pytest.mark.parametrize(("change", "needle"), [
    ({"model_type": "gpt2"}, "model_type 'gpt2'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "llama3"),
    ({"num_key_value_heads": 5}, "multiple"),
    ({"hidden_size": "big"}, "hidden_size"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_configs_are_refused_naming_the_field(change, needle):
    with pytest.raises(ConfigError) as info:
        config_from_dict({**PRESETS["llama-3.2-1b"], **change})
    assert needle in str(info.value) and info.value.key == "--model"


def test_resolve_model_forms_and_errors(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(PRESETS["llama-3.2-1b"]))
    assert resolve_model(str(cfg)).directory is None
    assert resolve_model(str(tmp_path)).directory == tmp_path
    assert resolve_model("hf:llama-3.2-3b").config.n_layers == 28
    with pytest.raises(ConfigError, match="did you mean 'llama-3.2-3b'"):
        resolve_model("llama-3.2-3")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model(str(empty))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_model(str(tmp_path / "bad.json"))
