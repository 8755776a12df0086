"""Real 2-rank gloo runs through the launcher users call (kiln train --nproc-per-node, torchrun -m
kiln): same global batch, same loss trajectory as one process; clear launch errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.distributed.launch import LaunchSpec, check_launch, torchrun_command
from kiln.errors import ConfigError
from kiln.train.trainer import train

BASE = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=3", "model.kwargs.num_classes=4",
    "model.kwargs.dropout=0.0", "data.synthetic_samples=256", "training.steps=12", "training.log_interval=4",
    "training.device=cpu", "training.deterministic=true", "metrics.console=false", "metrics.tensorboard=false",
    "optim.lr=3e-3",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process with the global batch: the trajectory both strategies' two ranks must follow."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    train(load_config(None, [*BASE, "data.batch_size=16"]), run_dir)
    return run_dir


def _kiln(*args):
    return subprocess.run([sys.executable, "-m", "kiln", "train", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


@pytest.mark.parametrize(("strategy", "accum"), [("ddp", 1), ("fsdp", 2)])
def test_two_ranks_match_one_process(tmp_path, single, strategy, accum):
    run_dir = tmp_path / strategy
    per_rank = 16 // (2 * accum)
    proc = _kiln("--nproc-per-node", "2", "--run-dir", str(run_dir), *BASE, f"distributed.strategy={strategy}",
                 f"data.batch_size={per_rank}", f"training.grad_accum_steps={accum}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["strategy"] == strategy
    assert summary["global_batch"] == 16
    if strategy == "fsdp":  # 12 steps of 2 micro-batches: the first creates the state through DTensor
        assert summary["optimizer_update_steps"] == {"local_shards": 11, "dtensor": 1}
        # The layout chosen (the config says 0 and auto): all 3 tiny blocks in one unit, kept gathered.
        # Two ranks: torch's all-gather copy-out, not kiln's one-rank fused copy.
        assert summary["fsdp_layout"] == {"unit_blocks": [3], "reshard_after_forward": False,
                                          "forward_prefetch": 0, "backward_prefetch": 0,
                                          "mesh": {"replicate": 1, "shard": 2}, "param_dtype": "fp32",
                                          "reduce_dtype": "fp32", "one_rank_fused_copy": False}
    else:
        assert summary["fsdp_layout"] is None
    # Same samples per step (rank r takes every 2nd sample of the shared order): same trajectory.
    assert _losses(run_dir) == pytest.approx(_losses(single), rel=2e-4, abs=1e-5)
    assert summary["final_loss"] < summary["first_loss"]
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(record["step_ms_ranks"]) == 2 and record["straggler_ratio"] >= 1.0


def test_torchrun_module_entry_point(tmp_path):
    run_dir = tmp_path / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "kiln",
           "train", "--run-dir", str(run_dir), *BASE, "data.batch_size=8", "distributed.strategy=auto"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert "auto" in summary["strategy_reason"]


def test_fsdp_without_repeated_blocks_wraps_root_and_warns(tmp_path):
    src = tmp_path / "flat.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    return torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Tanh()),"
                   " {'kind': 'features', 'shape': (8,), 'num_classes': 3}\n")
    run_dir = tmp_path / "flat"
    over = [o for o in BASE if not o.startswith("model.kwargs")]
    proc = _kiln("--nproc-per-node", "2", "--run-dir", str(run_dir), *over, f"model.name={src}:make",
                 "distributed.strategy=fsdp", "data.batch_size=4", "training.steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no repeated blocks" in proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--nproc-per-node", "2", "--nnodes", "2"], "--rdzv-endpoint"),
        (["--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29555"], "--node-rank"),
        (["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:{closed}",
          "--rdzv-wait", "1"], "unreachable"),
        (["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "192.0.2.7:29500"],
         "not this machine"),
        (["--nproc-per-node", "2", "--rdzv-endpoint", "nonsense"], "HOST:PORT"),
        (["--nproc-per-node", "2", "distributed.strategy=zero3"], "distributed.strategy"),
    ],
)
def test_launch_errors_exit_2(tmp_path, capsys, args, needle):
    with socket.socket() as held:  # a port the OS gave out and nothing listens on: unreachable for sure
        held.bind(("127.0.0.1", 0))
        args = [a.format(closed=held.getsockname()[1]) for a in args]
        code = main(["train", "--run-dir", str(tmp_path / "run"), *args, *BASE])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert not (tmp_path / "run").exists()


def test_more_processes_than_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="4 processes but 2 visible GPUs"):
        check_launch(LaunchSpec(nproc_per_node=4), "auto")
    check_launch(LaunchSpec(nproc_per_node=4), "cpu")  # CPU ranks share the CPU


def test_fsdp_unsupported_torch_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("kiln.train.preflight.fsdp_available", lambda: False)  # where the launcher checks it
    code = main(["train", "--run-dir", str(tmp_path / "run"), "--nproc-per-node", "2", *BASE,
                 "distributed.strategy=fsdp"])
    assert code == 2
    assert "FSDP2" in capsys.readouterr().err


def test_torchrun_command_shapes(tmp_path):
    one = torchrun_command(LaunchSpec(nproc_per_node=2, max_restarts=3), tmp_path, ["a=1"])
    assert "--standalone" in one and "--max-restarts=3" in one and one[-3:] == ["--run-dir", str(tmp_path), "a=1"][-3:]
    assert one[one.index("-m", 2) + 1: one.index("-m", 2) + 3] == ["kiln", "train"]
    multi = torchrun_command(LaunchSpec(nproc_per_node=8, nnodes=2, node_rank=1, rdzv_endpoint="h:29500"), tmp_path,
                             [])
    assert "--master-addr=h" in multi and "--master-port=29500" in multi and "--node-rank=1" in multi
    assert "--standalone" not in multi
