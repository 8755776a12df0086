"""launch_kiln's timeout: torchrun and its ranks are stopped (a kiln rank gets SIGTERM, saves and
says so), nothing is left running, and the caller gets 124."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import kiln.distributed.launch as launch_module
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


def test_a_point_past_its_timeout_is_stopped(tmp_path, monkeypatch):
    run_dir = tmp_path / "endless"
    metrics = run_dir / "metrics.jsonl"

    class TimesOutOnceTraining(subprocess.Popen):
        """The launcher's wait with a timeout expires once the rank is training (its first metrics
        record), not after a wall-clock time that a loaded machine may spend still starting up."""

        expired = False

        def wait(self, timeout=None):
            if timeout is None or TimesOutOnceTraining.expired:
                return super().wait(timeout)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return super().wait(0.2)  # the launcher ended on its own: the test fails below
            TimesOutOnceTraining.expired = True
            raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(launch_module.subprocess, "Popen", TimesOutOnceTraining)
    args = ["train", "--run-dir", str(run_dir), "training.device=cpu", "training.steps=10000000",
            "training.log_interval=50", "metrics.console=false", "metrics.tensorboard=false"]
    code = launch_kiln(LaunchSpec(nproc_per_node=1), args, timeout_s=30, log_path=tmp_path / "launch.log",
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert code == 124
    assert _running_with(str(run_dir)) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGTERM"


def test_run_bounded_stops_a_child_and_the_processes_it_started(tmp_path):
    """A child that ignores SIGTERM and has started a process of its own: past the limit, both end."""
    import sys

    from kiln.distributed.launch import run_bounded

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    code, out, _ = run_bounded([sys.executable, "-c", script], timeout_s=5.0, grace_s=1.0)
    assert code is None and "started" in out
    proc_dir = Path(f"/proc/{int(pid_file.read_text())}")
    # Killed with the group: gone, or a zombie waiting to be reaped, never still running. A pid the
    # busy machine has already handed to another program is not the grandchild.
    try:
        state = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
        still_ours = b"time.sleep(600)" in (proc_dir / "cmdline").read_bytes()
    except (OSError, IndexError):
        return  # gone
    assert state == "Z" or not still_ours, f"the grandchild is still {state}"


def test_run_bounded_returns_the_output_of_a_child_that_ends():
    import sys

    from kiln.distributed.launch import run_bounded

    code, out, err = run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                                 timeout_s=60)
    assert (code, out, err) == (3, "out\n", "err\n")
