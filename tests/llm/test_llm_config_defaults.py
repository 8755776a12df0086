"""config.json fields left out (or null) are read as transformers reads them: kiln's DecoderConfig
against transformers' own model built from the same dict (its modules, its RoPE frequencies), and
logits of tiny random models for the cases where kiln once used a different default."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kiln.errors import ConfigError
from kiln.llm.config import ModelSource, config_from_dict
from kiln.llm.hf_model import build_hf_model
from kiln.llm.rope import inv_frequencies
from kiln.llm.weights import empty_decoder, load_hf_state_dict

transformers = pytest.importorskip("transformers")

# 32 query heads: a multiple of every family's default key/value head count (8 or 32).
SIZE = {"vocab_size": 64, "hidden_size": 128, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 32}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

CASES = {
    "llama, everything optional left out": {"model_type": "llama"},
    "llama3 rope without original_max_position_embeddings": {
        "model_type": "llama", "max_position_embeddings": 512, "rope_theta": 500000.0, "rope_scaling": LLAMA3},
    "llama3 rope with original_max_position_embeddings": {
        "model_type": "llama", "rope_scaling": {**LLAMA3, "original_max_position_embeddings": 64}},
    "llama3 in transformers 5 rope_parameters": {
        "model_type": "llama", "rope_parameters": {**LLAMA3, "rope_theta": 50000.0}},
    "rope_scaling's own rope_theta wins over the top level": {
        "model_type": "llama", "rope_theta": 5.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0,
                                                                   "rope_theta": 700.0}},
    "llama, null head_dim and key/value heads": {"model_type": "llama", "head_dim": None,
                                                 "num_key_value_heads": None},
    "llama, attention and mlp biases": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "mistral without num_key_value_heads": {"model_type": "mistral"},
    "mistral, window off": {"model_type": "mistral", "sliding_window": None},
    "mistral ignores attention_bias": {"model_type": "mistral", "attention_bias": True},
    "qwen2, everything optional left out": {"model_type": "qwen2"},
    "qwen2 use_sliding_window without sliding_window": {"model_type": "qwen2", "use_sliding_window": True,
                                                        "max_window_layers": 1},
    "qwen2 layer_types": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                          "layer_types": ["sliding_attention", "full_attention"]},
    "qwen2 window without use_sliding_window": {"model_type": "qwen2", "sliding_window": 16, "max_window_layers": 0},
    "qwen3, everything optional left out": {"model_type": "qwen3"},
    "qwen3 use_sliding_window without sliding_window": {"model_type": "qwen3", "use_sliding_window": True,
                                                        "max_window_layers": 0, "attention_bias": True},
}


def hf_view(raw: dict) -> dict:
    """What transformers' model built from `raw` does, read off its modules."""
    model = build_hf_model(ModelSource("test", raw, None), device=torch.device("cpu"), dtype=torch.float32, seed=0)
    cfg = model.config
    attn = [layer.self_attn for layer in model.model.layers]
    eos = cfg.eos_token_id
    return {
        "n_kv_heads": attn[0].k_proj.out_features // attn[0].head_dim,
        "head_dim": attn[0].head_dim,
        "norm_eps": model.model.norm.variance_epsilon,
        "max_positions": cfg.max_position_embeddings,
        "tie_embeddings": model.lm_head.weight is model.model.embed_tokens.weight,
        "qkv_bias": attn[0].q_proj.bias is not None,
        "out_bias": attn[0].o_proj.bias is not None,
        "mlp_bias": model.model.layers[0].mlp.gate_proj.bias is not None,
        "windows": tuple(getattr(a, "sliding_window", None) or getattr(cfg, "sliding_window", None)
                         if cfg.model_type == "mistral" else getattr(a, "sliding_window", None) for a in attn),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        "inv_freq": model.model.rotary_emb.inv_freq,
    }


def kiln_view(raw: dict) -> dict:
    c = config_from_dict(raw)
    windows = c.windows or (None,) * c.n_layers
    return {"n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "norm_eps": c.norm_eps,
            "max_positions": c.max_positions, "tie_embeddings": c.tie_embeddings, "qkv_bias": c.qkv_bias,
            "out_bias": c.out_bias, "mlp_bias": c.mlp_bias, "windows": windows, "bos_token_id": c.bos_token_id,
            "eos_token_ids": c.eos_token_ids, "inv_freq": inv_frequencies(c.rope, c.head_dim)}


@pytest.mark.parametrize("case", CASES)
def test_fields_left_out_read_as_transformers_reads_them(case):
    raw = {**SIZE, **CASES[case]}
    hf, kiln = hf_view(dict(raw)), kiln_view(dict(raw))
    assert torch.allclose(kiln.pop("inv_freq"), hf.pop("inv_freq").float(), rtol=1e-6, atol=0)
    assert kiln == hf


def test_the_three_known_defaults():
    llama3 = config_from_dict({**SIZE, **CASES["llama3 rope without original_max_position_embeddings"]})
    assert llama3.rope.original_max_positions == 512  # max_position_embeddings, not 8192
    assert config_from_dict({**SIZE, "model_type": "mistral"}).n_kv_heads == 8
    qwen = config_from_dict({**SIZE, **CASES["qwen2 use_sliding_window without sliding_window"]})
    assert qwen.windows == (None, 4096)


@pytest.mark.parametrize(("change", "needle"), [
    ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "llama3 rope scaling without low_freq_factor, high_freq_factor"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "linear"}}, "linear rope scaling without factor"),
    ({"model_type": "qwen2", "num_attention_heads": 16}, "num_key_value_heads 32 (qwen2's default"),
    ({"model_type": "mistral", "num_attention_heads": 4}, "num_key_value_heads 8 (mistral's default"),
    ({"model_type": "qwen3", "head_dim": None}, "head_dim is null"),
])
def test_what_transformers_cannot_run_is_refused(change, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        config_from_dict({**SIZE, **change})
    if change["model_type"] == "llama":  # transformers refuses these too
        with pytest.raises(KeyError):
            hf_view({**SIZE, **change})


def _logits(raw: dict, tokens: torch.Tensor, *, drop_windows: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    source = ModelSource("test", raw, None)
    hf = build_hf_model(source, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    config = source.config
    if drop_windows:
        config = dataclasses.replace(config, windows=())
    kiln = load_hf_state_dict(empty_decoder(config, device="cpu", dtype=torch.float32), hf.state_dict())
    with torch.inference_mode():
        return kiln(tokens).float(), hf(tokens).logits.float()


SMALL = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 16}


@pytest.mark.parametrize("case", ["llama3 rope without original_max_position_embeddings",
                                  "mistral without num_key_value_heads"])
def test_logits_match_transformers(case):
    raw = {**SMALL, **CASES[case]}
    tokens = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(0))
    kiln, hf = _logits(raw, tokens)
    assert (kiln - hf).abs().max() <= 1e-4 * hf.abs().max()


def test_qwen2_default_window_matches_transformers_past_4096_tokens():
    raw = {**SMALL, "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 16,
           **CASES["qwen2 use_sliding_window without sliding_window"]}
    tokens = torch.randint(0, 64, (1, 4200), generator=torch.Generator().manual_seed(0))
    tokens[0, 120:] = 5  # one repeated token after a varied start: what the window drops stands out
    kiln, hf = _logits(raw, tokens)
    tail = slice(4100, None)
    assert (kiln[:, tail] - hf[:, tail]).abs().max() <= 1e-5 * hf.abs().max()
    unwindowed, _ = _logits(raw, tokens, drop_windows=True)  # the window really matters here
    assert (unwindowed[:, tail] - hf[:, tail]).abs().max() > 1e-3 * hf.abs().max()


def test_building_the_transformers_config_leaves_the_fields_it_was_given_as_they_were():
    """transformers fills defaults into nested dicts in place; kiln hands it copies, so a config.json
    (or a preset) read after a transformers model was built from it still lacks what it lacked."""
    import copy

    from kiln.llm.hf_config import make_config

    raw = {**SMALL, **CASES["llama3 rope without original_max_position_embeddings"]}
    before = copy.deepcopy(raw)
    make_config(raw, {}, "test")
    make_config(raw, {"num_hidden_layers": 1}, "test")
    assert raw == before
