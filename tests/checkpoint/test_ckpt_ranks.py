"""Resuming with another number of ranks, through the launcher users call: 1 -> 2 -> 3 -> 1
gloo ranks on CPU, each attempt killed after its checkpoint, the last one completing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ARGS = [
    "model.kwargs.hidden_size=16", "model.kwargs.num_layers=1", "model.kwargs.num_classes=4",
    "data.synthetic_samples=192", "data.batch_size=4", "training.steps=16", "training.log_interval=2",
    "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
    "checkpoint.keep=5", "cpu.threads=1",
]


def _kiln(*args, env=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=full_env,
                          timeout=600)


def test_resume_with_more_and_fewer_ranks(tmp_path):
    run_dir = tmp_path / "run"
    base = ["train", "--run-dir", str(run_dir), *ARGS]
    first = _kiln(*base, env={"KILN_FAULT": "kill@5"})
    assert first.returncode == -9, first.stderr[-2000:]
    for ranks, kill in ((2, 9), (3, 13)):
        attempt = _kiln(base[0], "--nproc-per-node", str(ranks), *base[1:], env={"KILN_FAULT": f"kill@{kill}"})
        assert attempt.returncode == 1, attempt.stderr[-3000:]
        assert "KeyError" not in attempt.stderr, attempt.stderr[-3000:]
        marker = json.loads((run_dir / "checkpoints" / f"step_{kill - 1:08d}" / "kiln_complete.json").read_text())
        assert marker["world_size"] == ranks, attempt.stderr[-3000:]
        previous = ranks - 1 if ranks > 2 else 1
        assert f"resharded from world size {previous} to {ranks}" in attempt.stderr
        assert f"rank {ranks - 1} is new: its RNG state is freshly seeded" in attempt.stderr
    last = _kiln(*base)  # 3 -> 1
    assert last.returncode == 0, last.stderr[-3000:]
    assert "resharded from world size 3 to 1" in last.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 16
    assert summary["resumed_from"].endswith("step_00000012")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 16
