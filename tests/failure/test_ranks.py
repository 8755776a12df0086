"""A failing rank in a 2-rank gloo job through the launcher users call: the message names the rank
that failed first (not the peer whose collective broke because of it), what was kept and what to
do; summary.json records it; the ranks' errors do not drown it. Plus the first-failure rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kiln.checkpoint.export import export_safetensors
from kiln.failure.ranks import RankFailure, dump_failures, first_failure, load_failures

BASE = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12", "training.log_interval=2",
    "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
    "distributed.strategy=ddp",
]


def _kiln(*args, env):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-m", "kiln", "train", *args], capture_output=True, text=True,
                          env=full_env, timeout=600)


def _message(err: str) -> list[str]:
    lines = err.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("kiln: failed")):]


@pytest.mark.parametrize(("fault", "rank", "needles"), [
    # Where a SIGKILLed rank stopped: from its peer's report ("near step 6") or, when the agent
    # stopped the peer before it reported (seen under CI load), from the last metrics record.
    ("kill@6", 1, [("kiln: failed on rank 1 near step 6: killed by SIGKILL",
                    "kiln: failed on rank 1 after step 6 (the last logged): killed by SIGKILL",
                    "kiln: failed on rank 1 after step 4 (the last logged): killed by SIGKILL"), "OOM killer"]),
    ("cuda-oom@6", 1, ["kiln: failed on rank 1 in step 6: CUDA out of memory", "data.batch_size=4"]),
    # Rank 0 also writes summary.json while failing; its peer's echo ends first, and the agent then
    # stops rank 0, maybe mid-cleanup: the report it published on catching the error still counts.
    ("cuda-oom@6", 0, ["kiln: failed on rank 0 in step 6: CUDA out of memory"]),
])
def test_the_rank_that_failed_first_is_named(tmp_path, fault, rank, needles):
    run_dir = tmp_path / "run"
    proc = _kiln("--nproc-per-node", "2", "--run-dir", str(run_dir), *BASE,
                 env={"KILN_FAULT": fault, "KILN_FAULT_RANK": str(rank)})
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    msg = _message(err)
    text = "\n".join(msg)
    assert len(msg) == 4, err
    for needle in [*needles, "checkpoint step 4 is intact",
                   f"resume with `kiln train --nproc-per-node=2 --config {run_dir / 'config.toml'}",
                   f"summary.json records status failed and rank {rank}'s error",
                   f"traceback in {run_dir / 'error.log'}"]:
        assert any(n in text for n in needle) if isinstance(needle, tuple) else needle in text, (needle, err)
    # The other rank only lost its peer: it says nothing under the launcher; no traceback reaches the console.
    assert "Traceback" not in err and "ChildFailedError" not in err
    assert f"kiln[rank {1 - rank}]: failed" not in err
    assert len(err.splitlines()) <= 14, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == rank
    assert summary["error"].startswith(f"rank {rank}: ") and str(rank) in summary["rank_errors"]
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert export_safetensors(run_dir, tmp_path / "w.safetensors")["step"] == 4
    # The other rank may or may not be listed: the agent stops it once one is gone, maybe before it reports.
    assert f"---- rank {rank}" in (run_dir / "error.log").read_text()


def test_plain_torchrun_ranks_say_it_themselves(tmp_path):
    """Without kiln's launcher each rank speaks for itself: the failing rank gives the whole
    message, the rank that only lost its peer one line; torchrun's root cause shows kiln's report."""
    run_dir = tmp_path / "run"
    # torchrun stops the ranks still running once one has exited (its default monitor interval): rank
    # 1 prints its whole message before it leaves the group and so frees rank 0 (kiln train's order).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "kiln",
           "train", "--run-dir", str(run_dir), *BASE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "KILN_FAULT": "host-oom@6", "KILN_FAULT_RANK": "1"})
    assert proc.returncode != 0
    err = proc.stderr
    assert "kiln[rank 1]: failed in step 6: out of host memory" in err
    assert "kiln[rank 1]: to do:" in err and "torchrun ... -m kiln train --config" in err
    rank0 = [line for line in err.splitlines() if line.startswith("kiln[rank 0]: failed")]
    assert len(rank0) <= 1 and all("lost contact with another rank" in line for line in rank0)
    # torchrun read rank 1's error file (its own failure table quotes what kiln wrote there).
    assert "injected by KILN_FAULT=host-oom@6" in err.split("ChildFailedError")[-1]


def _failure(rank, exitcode, t, kiln=None):
    return RankFailure(rank=rank, exitcode=exitcode, timestamp=t, kiln=kiln or {})


def test_first_failure_prefers_a_cause_over_its_echoes():
    own = {"kind": "cuda_oom", "what": "CUDA out of memory", "secondary": False, "time": 10.5}
    echo = {"kind": "peer_lost", "what": "lost contact", "secondary": True, "time": 10.1}
    # A peer's echo came first by the clock, but it is an echo.
    assert first_failure([_failure(0, 1, 10, echo), _failure(1, 1, 10, own)]).rank == 1
    # A rank killed without a word beats the echo and the rank the launcher stopped.
    assert first_failure([_failure(0, 1, 10, echo), _failure(2, -15, 9), _failure(1, -9, 11)]).rank == 1
    # NCCL's watchdog aborts survivors (SIGABRT): after a kill, before an echo.
    assert first_failure([_failure(0, -6, 9), _failure(1, -9, 10)]).rank == 1
    # Two own errors: the earlier one.
    later = {**own, "time": 11.0}
    assert first_failure([_failure(0, 1, 10, later), _failure(1, 1, 10, own)]).rank == 1
    assert first_failure([]) is None
    assert _failure(1, -9, 1).diagnosis().what == "killed by SIGKILL"
    assert _failure(1, -15, 1).diagnosis().secondary


def test_launcher_reads_the_agent_and_the_ranks_reports(tmp_path):
    """The agent lists the ranks that had exited (here rank 0's echo and rank 2's SIGKILL); rank 1,
    whose own error came first, was still cleaning up and got stopped: its report still counts."""
    echo = {"message": {"message": "lost contact", "extraInfo": {
        "py_callstack": "Traceback ...", "timestamp": "10", "kiln": {"rank": 0, "kind": "peer_lost", "secondary": True,
                                                                     "what": "lost contact", "step": 6, "time": 10.1}}}}
    failures = {0: SimpleNamespace(exitcode=1, timestamp=10, message="lost contact", error_file_data=echo),
                2: SimpleNamespace(exitcode=-9, timestamp=11, message="Signal 9", error_file_data={})}
    dump_failures(str(tmp_path), failures)
    own = {"rank": 1, "kind": "cuda_oom", "what": "CUDA out of memory", "secondary": False, "where": "in step 6",
           "step": 6, "time": 10.4, "removed": [str(tmp_path / "step_00000008.tmp")]}
    (tmp_path / "rank_1.json").write_text(json.dumps({"kiln": own, "callstack": "Traceback (OOM)"}))
    loaded = load_failures(tmp_path)
    assert [f.rank for f in loaded] == [0, 1, 2]
    assert loaded[0].step == 6 and loaded[0].callstack == "Traceback ..." and loaded[2].signal_name == "SIGKILL"
    first = first_failure(loaded)
    assert first.rank == 1 and first.exitcode is None and first.diagnosis().what == "CUDA out of memory"
    assert first.removed() == [tmp_path / "step_00000008.tmp"]
    assert "stopped by the launcher" in first.log_section() and "Traceback (OOM)" in first.log_section()
    assert load_failures(tmp_path / "missing") == []


def test_a_silent_kill_is_placed_by_the_peers_or_by_the_last_metrics_record(tmp_path):
    from kiln.train.failure import group_report

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    killed = _failure(1, -9, 10)
    echo = _failure(0, 1, 10, {"kind": "peer_lost", "what": "lost contact", "secondary": True, "step": 6})
    assert group_report(run_dir, killed, [echo, killed], [], owner=False).where == "on rank 1 near step 6"
    # No peer reported (the agent stopped it first) and nothing logged: the step is unknown.
    assert group_report(run_dir, killed, [killed], [], owner=False).where == "on rank 1"
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n{"step": 6, "loss": 0.9}\n{"step": 8, "lo')
    assert group_report(run_dir, killed, [killed], [], owner=False).where == "on rank 1 after step 6 (the last logged)"
