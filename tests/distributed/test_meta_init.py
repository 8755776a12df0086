"""FSDP2 runs of kiln's decoder are built on the meta device, sharded, then each rank fills its own
shards: the initial weights equal a one-process build's bit for bit at 1 and 2 ranks (tied and untied
head; fp32 and bf16-true), and the loop's FLOP count (on fake tensors) equals the one-process count."""

from __future__ import annotations

import json
from pathlib import Path

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


SHARDED = {  # case -> (ranks, overrides beyond BASE)
    "tied-2": (2, ["model.kwargs.tie_word_embeddings=true"]),
    "untied-bf16-true-2": (2, ["model.kwargs.tie_word_embeddings=false", "precision.policy=bf16-true",
                               "model.kwargs.vocab_size=301"]),
    "untied-1": (1, ["model.kwargs.tie_word_embeddings=false"]),
}


def _hf_dir(root: Path) -> Path | None:
    """A tiny Llama checkpoint directory (biases, an untied head), or None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, attention_bias=True)
    torch.manual_seed(3)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / "hf")
    return root / "hf"


@pytest.fixture(scope="module")
def meta_builds(run_ranks, tmp_path_factory) -> dict[str, tuple[dict, Path, list[str]]]:
    """case -> (its report, its gathered weights file, its overrides). The cases of one world size are
    built one after the other in one launch (each its own trainer, run dir and seeding): a launch
    of gloo ranks costs seconds of start-up, a build a fraction of one."""
    root = tmp_path_factory.mktemp("meta_init")
    cases = {case: (nproc, [*BASE, *extra]) for case, (nproc, extra) in SHARDED.items()}
    hf = _hf_dir(root)
    if hf is not None:
        cases["hf-dir-2"] = (2, [*BASE, f"model.name=llama:{hf}"])
    out: dict[str, tuple[dict, Path, list[str]]] = {}
    for nproc in sorted({n for n, _ in cases.values()}):
        mine = {case: overrides for case, (n, overrides) in cases.items() if n == nproc}
        report_file = root / f"ranks{nproc}" / "report.json"
        report_file.parent.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("META_INIT_OVERRIDES", json.dumps(mine))
            reports = run_ranks("meta_init_worker.py", report_file, nproc=nproc)
        out.update({case: (reports[case], report_file.parent / f"{case}.pt", mine[case]) for case in mine})
    return out


def _assert_one_process_weights(weights_file: Path, overrides: list[str]) -> None:
    sharded = {plain_name(k): v for k, v in torch.load(weights_file).items()}
    reference = _one_process([o for o in overrides if not o.startswith("distributed.")])
    assert sharded.keys() == reference.keys()
    for name, value in reference.items():
        assert sharded[name].dtype == value.dtype and torch.equal(sharded[name], value), name


@pytest.mark.parametrize("case", SHARDED)
def test_sharded_meta_build_has_the_one_process_weights(meta_builds, case):
    report, weights_file, overrides = meta_builds[case]
    nproc = SHARDED[case][0]
    assert report["meta_build"] is True and report["strategy"] == "fsdp" and report["world_size"] == nproc
    _assert_one_process_weights(weights_file, overrides)
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


def test_a_checkpoint_directory_loads_into_the_shards(meta_builds):
    """`llama:<hf dir>` under FSDP2: the safetensors are read one fused parameter at a time into each
    rank's shards, the same weights a one-process load holds (biases and an untied head included)."""
    pytest.importorskip("transformers")
    report, weights_file, overrides = meta_builds["hf-dir-2"]
    assert report["meta_build"] is True
    _assert_one_process_weights(weights_file, overrides)
