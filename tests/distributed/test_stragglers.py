"""Distributed timing through the launcher users call: 2 gloo DDP ranks, rank 1 slowed on purpose
(KILN_FAULT=slow@STEP:MS). Every rank's wall step time is the same (the fast one waits in the
all-reduce); the time blocked in collectives tells them apart, and rank 1 is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BASE = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12", "training.log_interval=2",
    "training.device=cpu", "metrics.tensorboard=false", "distributed.strategy=ddp",
    "metrics.straggler_intervals=3", "checkpoint.save_final=false", "metrics.sync_timing=true",
]


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_slowed_rank_is_named(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILN_FAULT": "slow@1:200", "KILN_FAULT_RANK": "1"}
    proc = subprocess.run([sys.executable, "-m", "kiln", "train", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                           *BASE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(run_dir)
    # Named after 3 slow intervals in a row (steps 1, 2, 4), and from then on.
    assert [r["step"] for r in records] == [1, 2, 4, 6, 8, 10, 12]
    assert [r["stragglers"] for r in records] == [[], [], [1], [1], [1], [1], [1]]
    assert all(r["straggler_count"] == len(r["stragglers"]) for r in records)
    last = records[-1]
    for key in ("step_ms_ranks", "data_wait_ms_ranks", "sync_wait_ms_ranks", "own_ms_ranks"):
        assert len(last[key]) == 2, key
    # Rank 0 waits for rank 1's 200 ms in the gradient all-reduce; rank 1 hardly waits. (200 ms, not
    # less: a preempted rank 0 on a loaded 2-core machine must not look as slow as the slowed rank.)
    assert last["sync_wait_ms_ranks"][0] > 100 > last["sync_wait_ms_ranks"][1]
    assert last["own_ms_ranks"][1] > 200 > last["own_ms_ranks"][0]
    assert last["straggler_ratio"] > 1.2
    assert proc.stderr.count("straggler: rank 1 spends") == 1  # one warning, from rank 0, when named
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stragglers_seen"] == [1]
    assert summary["sync_timing"] == "ddp_hook+log_gather"
