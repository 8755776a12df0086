"""Checkpoints onto kiln's modules: sharded safetensors, and one-line errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kiln.config.errors import ConfigError
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
