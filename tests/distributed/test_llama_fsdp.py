"""kiln's decoder (llama:) under FSDP2 (and DDP) on 2 gloo ranks through `kiln train --nproc-per-node`: per-block
units, the fused cross-entropy reading the root's (tied) output weight outside the blocks, selective
activation checkpointing; the same loss trajectory as one process, and an export of the gathered
shards that transformers loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.train.trainer import train

BASE = [
    "model.name=llama:llama-tiny", "model.kwargs.tie_word_embeddings=true", "data.seq_len=32",
    "data.synthetic_samples=128", "training.steps=6", "training.log_interval=2", "training.device=cpu",
    "training.deterministic=true", "metrics.console=false", "metrics.tensorboard=false", "optim.lr=3e-3",
]


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _two_ranks(run_dir, *extra):
    cmd = [sys.executable, "-m", "kiln", "train", "--nproc-per-node", "2", "--run-dir", str(run_dir), *BASE,
           "data.batch_size=4", "training.ce_kernel=chunked", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["features"]["ce_kernel"] == "chunked"
    return summary


def test_fsdp2_two_ranks_match_one_process_and_export(tmp_path):
    single = tmp_path / "single"
    train(load_config(None, [*BASE, "data.batch_size=8", "training.ce_kernel=plain"]), single)
    run_dir = tmp_path / "fsdp"
    summary = _two_ranks(run_dir, "distributed.strategy=fsdp", "distributed.fsdp_unit_blocks=1",
                         "distributed.fsdp_reshard_after_forward=true", "training.activation_checkpointing=selective")
    assert summary["strategy"] == "fsdp"
    assert summary["fsdp_layout"]["unit_blocks"] == [1, 1]  # one unit per decoder block
    assert _losses(run_dir) == pytest.approx(_losses(single), rel=2e-4, abs=1e-5)

    transformers = pytest.importorskip("transformers")
    import torch

    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied again
    assert main(["export", str(single), "--out", str(tmp_path / "single_hf")]) == 0
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "single_hf"), dtype=torch.float32)
    tokens = torch.tensor([[1, 5, 9, 33, 70]])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference.eval()(tokens).logits, rtol=1e-3, atol=1e-3)


def test_ddp_two_ranks_with_the_fused_loss_match_one_process(tmp_path):
    single = tmp_path / "single"
    train(load_config(None, [*BASE, "data.batch_size=8", "training.ce_kernel=plain"]), single)
    run_dir = tmp_path / "ddp"
    assert _two_ranks(run_dir, "distributed.strategy=ddp")["strategy"] == "ddp"
    assert _losses(run_dir) == pytest.approx(_losses(single), rel=2e-4, abs=1e-5)
