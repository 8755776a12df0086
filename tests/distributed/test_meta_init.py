"""FSDP2 runs of kiln's decoder are built on the meta device, sharded, then each rank fills its own
shards: the initial weights equal a one-process build's bit for bit at 1 and 2 ranks (tied and untied
head; fp32 and bf16-true), and the loop's FLOP count (on fake tensors) equals the one-process count."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.config import load_config
from kiln.distributed.materialise import plain_name
from kiln.models import build_model
from kiln.precision import apply_precision, resolve_precision
from kiln.runtime import seed_everything

BASE = ["model.name=llama:llama-tiny", "data.seq_len=32", "data.batch_size=2", "data.synthetic_samples=16",
        "training.device=cpu", "training.steps=1", "metrics.console=false", "metrics.tensorboard=false",
        "distributed.strategy=fsdp", "distributed.fsdp_unit_blocks=1", "training.seed=7"]


def _one_process(overrides: list[str]) -> dict[str, torch.Tensor]:
    cfg = load_config(None, overrides)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model, device=torch.device("cpu"))
    model = apply_precision(built.module, resolve_precision(cfg.precision.policy, torch.device("cpu")))
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize(("nproc", "extra"), [
    (2, ["model.kwargs.tie_word_embeddings=true"]),
    (2, ["model.kwargs.tie_word_embeddings=false", "precision.policy=bf16-true", "model.kwargs.vocab_size=301"]),
    (1, ["model.kwargs.tie_word_embeddings=false"]),
])
def test_sharded_meta_build_has_the_one_process_weights(run_ranks, tmp_path, monkeypatch, nproc, extra):
    overrides = [*BASE, *extra]
    monkeypatch.setenv("META_INIT_OVERRIDES", json.dumps(overrides))
    report = run_ranks("meta_init_worker.py", tmp_path / "report.json", nproc=nproc)
    assert report["meta_build"] is True and report["strategy"] == "fsdp" and report["world_size"] == nproc
    sharded = {plain_name(k): v for k, v in torch.load(tmp_path / "report.pt").items()}
    reference = _one_process([o for o in overrides if not o.startswith("distributed.")])
    assert sharded.keys() == reference.keys()
    for name, value in reference.items():
        assert sharded[name].dtype == value.dtype and torch.equal(sharded[name], value), name
    assert report["flops"] > 0


def test_flops_on_fake_tensors_equal_the_real_count():
    from kiln.train.loop import count_flops
    from kiln.train.memory_plan import meta_model

    cfg = load_config(None, [*BASE[:-3], "training.ce_kernel=plain"])
    device = torch.device("cpu")
    policy = resolve_precision(cfg.precision.policy, device)
    built = build_model(cfg.model, device=device)
    tokens = torch.randint(0, 100, (3, 32))
    how = {"task": "causal_lm", "ce_kernel": "plain", "policy": policy, "device": device, "accum": 2}
    real = count_flops(built.module, (tokens, tokens), **how)
    fake = count_flops(built.module, (tokens, tokens), **how, spare=meta_model(cfg).module)
    assert fake == real > 0
    assert all(p.grad is None for p in built.module.parameters())  # the fake count touched nothing real


def test_a_checkpoint_directory_loads_into_the_shards(run_ranks, tmp_path, monkeypatch):
    """`llama:<hf dir>` under FSDP2: the safetensors are read one fused parameter at a time into each
    rank's shards, the same weights a one-process load holds (biases and an untied head included)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, attention_bias=True)
    torch.manual_seed(3)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    overrides = [*BASE, f"model.name=llama:{tmp_path / 'hf'}"]
    monkeypatch.setenv("META_INIT_OVERRIDES", json.dumps(overrides))
    report = run_ranks("meta_init_worker.py", tmp_path / "report.json", nproc=2)
    assert report["meta_build"] is True
    sharded = {plain_name(k): v for k, v in torch.load(tmp_path / "report.pt").items()}
    reference = _one_process([o for o in overrides if not o.startswith("distributed.")])
    assert sharded.keys() == reference.keys() and all(torch.equal(sharded[k], v) for k, v in reference.items())
