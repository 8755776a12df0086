"""launch_kiln's timeout: torchrun and its ranks are stopped (a kiln rank gets SIGTERM, saves and
says so), nothing is left running, and the caller gets 124."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiln.distributed.launch import LaunchSpec, launch_kiln


def _running_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


def test_a_point_past_its_timeout_is_stopped(tmp_path):
    run_dir = tmp_path / "endless"
    args = ["train", "--run-dir", str(run_dir), "training.device=cpu", "training.steps=10000000",
            "training.log_interval=50", "metrics.console=false", "metrics.tensorboard=false"]
    code = launch_kiln(LaunchSpec(nproc_per_node=1), args, timeout_s=30, log_path=tmp_path / "launch.log",
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert code == 124
    assert _running_with(str(run_dir)) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGTERM"
