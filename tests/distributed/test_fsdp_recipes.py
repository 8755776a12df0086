"""kiln's recipes under FSDP2 on gloo ranks: bf16-master with fp32 masters of each rank's shard
(trains to the one-process losses, resumes bitwise, also after an async save), HSDP on 2 x 2
ranks (a replicate x shard mesh), and the configurations they refuse. The decoder is built on the
meta device and sharded (tests/distributed/test_meta_init.py): these resumes are also the DCP loads
into meta-built shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kiln.cli.main import main
from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.train.trainer import train

BASE = [
    "model.name=llama:llama-tiny", "model.kwargs.tie_word_embeddings=true", "data.seq_len=32",
    "data.synthetic_samples=128", "training.steps=6", "training.log_interval=1", "training.device=cpu",
    "training.deterministic=true", "metrics.console=false", "metrics.tensorboard=false", "optim.lr=3e-3",
    "checkpoint.interval=4", "training.ce_kernel=chunked",
]
GLOBAL_BATCH = 8


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _ranks(run_dir: Path, nproc: int, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """`kiln train` on `nproc` gloo ranks; with `fault`, every rank dies of it on the first attempt and
    the elastic agent (--max-restarts 1) restarts the group, which resumes from the run dir."""
    restarts = ["--max-restarts", "1"] if fault else []
    cmd = [sys.executable, "-m", "kiln", "train", "--nproc-per-node", str(nproc), *restarts, "--run-dir", str(run_dir),
           *BASE, f"data.batch_size={GLOBAL_BATCH // nproc}", "distributed.strategy=fsdp",
           "distributed.fsdp_unit_blocks=1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if fault:
        env["KILN_FAULT"] = fault
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def _checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint, gathered (model, fp32 masters and moments, ...)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(path, out)
    flat: dict[str, torch.Tensor] = {}

    def walk(tree, prefix=""):
        if isinstance(tree, dict):
            for k, v in tree.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(tree, torch.Tensor):
            flat[prefix] = tree

    walk(torch.load(out, weights_only=False))
    return flat


def _trains_then_resumes_bitwise(tmp_path: Path, nproc: int, *extra: str) -> tuple[dict, Path]:
    """A clean run of 6 steps; a run whose ranks die after step 5 (its step-4 checkpoint kept) and are
    restarted by the launcher (one launch, not a second command: the same resume from the run dir):
    the final checkpoints are equal bit for bit, optimizer state included."""
    clean = tmp_path / "clean"
    proc = _ranks(clean, nproc, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    crashed = tmp_path / "crashed"
    proc = _ranks(crashed, nproc, *extra, fault="host-oom@5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "injected by KILN_FAULT=host-oom@5" in proc.stderr  # the first attempt did die
    summary = json.loads((crashed / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step_00000004")
    a = _checkpoint_tensors(clean / "checkpoints" / "step_00000006")
    b = _checkpoint_tensors(crashed / "checkpoints" / "step_00000006")
    assert a.keys() == b.keys() and any(".optim.state." in k for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    return json.loads((clean / "summary.json").read_text()), clean


def test_bf16_master_under_fsdp2_trains_to_the_one_process_losses_and_resumes_bitwise(tmp_path):
    extra = ["precision.policy=bf16-master", "training.grad_clip=0.5"]
    single = tmp_path / "single"
    train(load_config(None, [*BASE, *extra, f"data.batch_size={GLOBAL_BATCH}"]), single)
    summary, clean = _trains_then_resumes_bitwise(tmp_path, 2, *extra)
    assert summary["strategy"] == "fsdp" and summary["precision"] == "bf16-master"
    assert summary["memory_plan"]["strategy"] == "fsdp"  # planned for the sharded, meta-built decoder
    assert summary["fsdp_layout"]["param_dtype"] == "bf16" and summary["fsdp_layout"]["reduce_dtype"] == "fp32"
    assert summary["fsdp_layout"]["mesh"] == {"replicate": 1, "shard": 2}
    # Each rank's bf16 gradient of its half batch is rounded before the fp32 reduce-scatter; one
    # process rounds the gradient of the whole batch once. Measured: <= 4e-5 relative over 6 steps.
    assert _losses(clean) == pytest.approx(_losses(single), rel=2e-4)
    tensors = _checkpoint_tensors(clean / "checkpoints" / "step_00000006")
    masters = {k: v for k, v in tensors.items() if k.endswith(".master")}
    assert masters and all(v.dtype == torch.float32 for v in masters.values())  # the fp32 masters, gathered
    saves = summary["checkpoint_saves"]
    assert saves["count"] == 2 and all(s["stall_s"] > 0 and s["total_s"] > 0 for s in saves["saves"])
    records = [json.loads(line) for line in (clean / "metrics.jsonl").read_text().splitlines()]
    assert [r["ckpt_step"] for r in records if "ckpt_step" in r] == [4]  # the interval save, in step 5's record


@pytest.mark.parametrize("kernel", [False, True], ids=["torch-ops", "triton-kernel-interpreted"])
def test_bf16_master_under_fsdp2_resumes_bitwise_after_an_async_save(run_ranks, tmp_path, monkeypatch, kernel):
    if kernel:  # the ranks import Triton fresh: its interpreter runs kiln's kernel on the CPU shards
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setenv("KERNEL", "1")
    reports = run_ranks("master_fsdp_worker.py", tmp_path / "report.json")["ranks"]
    for r in reports:
        assert r["async_in_flight"]  # the save was still being written while steps 4-6 ran
        assert r["resumed_step"] == 3 and r["resumed_losses"] == r["losses"]
        assert r["differ"] == [] and r["compared"] == 40  # params, masters, moments, steps: bit for bit
        assert (r["master_type"], r["master_dtype"], r["master_placements"]) == ("DTensor", "torch.float32",
                                                                                  ["Shard"])
        assert r["master_keys"] == 8  # one fp32 master per parameter in the checkpoint
        assert all(n > 0.05 for n in r["norms"])  # the folded clip scaled every update
        save = r["timing"]["saves"][0]
        assert save["async"] and 0 < save["stall_s"] and 0 < save["total_s"]


def test_hsdp_on_2x2_ranks_trains_to_the_one_process_losses_and_resumes_bitwise(tmp_path):
    single = tmp_path / "single"
    train(load_config(None, [*BASE, f"data.batch_size={GLOBAL_BATCH}"]), single)
    summary, clean = _trains_then_resumes_bitwise(tmp_path, 4, "distributed.replicate_degree=2")
    assert summary["world_size"] == 4 and summary["fsdp_layout"]["mesh"] == {"replicate": 2, "shard": 2}
    assert _losses(clean) == pytest.approx(_losses(single), rel=2e-4, abs=1e-5)  # fp32: summation order only


@pytest.mark.parametrize(("extra", "key"), [
    (["distributed.replicate_degree=2"], "distributed.replicate_degree"),  # strategy auto, not fsdp
    (["distributed.strategy=fsdp", "distributed.replicate_degree=0"], "distributed.replicate_degree"),
    (["distributed.strategy=fsdp", "precision.policy=bf16-master", "distributed.fsdp_param_dtype=fp32"],
     "distributed.fsdp_param_dtype"),
])
def test_bad_fsdp_configs_are_refused(extra, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, extra)


def test_replicas_that_do_not_split_the_ranks_exit_2_before_any_rank(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--nproc-per-node", "3", "--run-dir", str(run_dir), "training.device=cpu",
                 "distributed.strategy=fsdp", "distributed.replicate_degree=2", "metrics.console=false"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1 and "distributed.replicate_degree" in errors[0] and "3 ranks" in errors[0]
    assert not run_dir.exists()
