"""Checkpoints onto kiln's modules: sharded safetensors, and one-line errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kiln.errors import ConfigError
from kiln.llm import build_decoder, resolve_model
from kiln.llm.rope import inv_frequencies
from kiln.llm.weights import random_decoder

from .conftest import transformers


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _tensors(directory):
    return load_file(str(directory / "model.safetensors"))


def test_sharded_checkpoint_loads_like_the_single_file(checkpoints, tmp_path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["qwen3"])
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    one = build_decoder(resolve_model(str(checkpoints["qwen3"])), device="cpu", dtype=torch.float32)
    many = build_decoder(resolve_model(str(tmp_path / "sharded")), device="cpu", dtype=torch.float32)
    for (name, a), b in zip(one.state_dict().items(), many.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_without_a_tensor_is_refused(checkpoints, tmp_path):
    d = _copy(checkpoints["llama-untied"], tmp_path / "m")
    tensors = _tensors(d)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"lacks 1 tensors.*up_proj"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_checkpoint_of_another_shape_is_refused(checkpoints, tmp_path):
    d = _copy(checkpoints["llama-untied"], tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    config["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"gate_proj.*shape.*ffn.w_gate_up"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_checkpoint_of_another_architecture_is_refused(checkpoints, tmp_path):
    d = _copy(checkpoints["qwen3"], tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "llama"  # Qwen3's q/k norms are then tensors kiln's llama does not use
    config["architectures"] = ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="does not use.*q_norm"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_pickle_checkpoints_are_refused(checkpoints, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(checkpoints["qwen2"] / "config.json", d)
    torch.save({}, d / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="safetensors only"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_a_directory_without_weights_gets_random_ones(checkpoints, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(checkpoints["qwen2"] / "config.json", d)
    a = build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32, seed=3)
    b = random_decoder(a.config, device="cpu", dtype=torch.float32, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert bool((a.layers[0].attn_norm.weight == 1).all()) and bool((a.layers[0].attn.wqkv.weight != 0).any())


def test_casting_the_model_keeps_rotary_frequencies_fp32(checkpoints):
    model = build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)
    model = model.to(torch.bfloat16)
    rotary = model.rotary
    assert rotary.inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, inv_frequencies(rotary.rope, rotary.head_dim))
    assert model.lm_head.weight is model.embed.weight and model.embed.weight.dtype == torch.bfloat16


def test_a_projection_of_the_wrong_shape_is_named_not_a_torch_error(checkpoints, tmp_path):
    d = _copy(checkpoints["llama-untied"], tmp_path / "m")
    tensors = _tensors(d)
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:, :16].clone()
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"k_proj.weight \(32, 16\).*cannot be fused"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_an_integer_weight_is_refused_not_cast(checkpoints, tmp_path):
    d = _copy(checkpoints["llama-untied"], tmp_path / "m")
    tensors = _tensors(d)
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.ones_like(tensors["model.layers.0.self_attn.q_proj.weight"],
                                                                         dtype=torch.int8)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"q_proj.weight is torch.int8, not a floating-point weight"):
        build_decoder(resolve_model(str(d)), device="cpu", dtype=torch.float32)


def test_a_directory_with_pickled_weights_only_never_gets_random_weights(checkpoints, tmp_path):
    d = _copy(checkpoints["llama-untied"], tmp_path / "m")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="pytorch_model\\*.bin weights only: kiln loads safetensors only"):
        resolve_model(f"llama:{d}", key="model.name")


@pytest.mark.parametrize("field, value, message", [
    ("num_hidden_layers", 10**9, "more than the 1024 kiln accepts"),
    ("hidden_size", 10**12, "more than the"),
    ("rms_norm_eps", "1e-5", "'rms_norm_eps' must be a positive number below 1.0"),
    ("rms_norm_eps", -1e-5, "'rms_norm_eps' must be a positive number"),
    ("rope_theta", "10000", "'rope_theta' must be a positive number"),
    ("rope_theta", -1.0, "'rope_theta' must be a positive number"),
    ("sliding_window", -6, "'sliding_window' must be a positive integer"),
    ("sliding_window", "6", "'sliding_window' must be a positive integer"),
])
def test_config_json_values_are_validated(checkpoints, tmp_path, field, value, message):
    d = _copy(checkpoints["mistral"], tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    config[field] = value
    for spelling in ("rope_scaling", "rope_parameters"):  # transformers 4.x / 5.x: theta may sit inside
        if isinstance(config.get(spelling), dict) and field in config[spelling]:
            config[spelling][field] = value
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        resolve_model(str(d))
