"""Stopping `kiln train --nproc-per-node 2` (gloo) with a signal: Ctrl-C to the process group,
SIGTERM (how a scheduler ends a job) or SIGHUP (a closed terminal) to the launcher. Every rank saves
its part of one checkpoint, the launcher exits 0 naming it and how to continue, no traceback, and
summary.json says `stopped`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

OVERRIDES = ["training.steps=1000000", "training.log_interval=2", "training.device=cpu", "metrics.tensorboard=false",
             "checkpoint.interval=0", "checkpoint.save_final=false", "model.kwargs.hidden_size=16",
             "model.kwargs.num_layers=1", "model.kwargs.num_classes=4", "data.synthetic_samples=64",
             "data.batch_size=8"]


def _wait_for_records(proc, metrics, count: int, timeout_s: float = 240) -> None:
    """Until `metrics` holds `count` records (the ranks are training), or fail naming why."""
    deadline = time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().count("\n") >= count):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the launcher ended before training ({proc.returncode}): {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("no training within the timeout")
        time.sleep(0.1)


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False),
                                                  (signal.SIGHUP, False)], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_signal_stops_every_rank_with_a_checkpoint(tmp_path, signum, to_group):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--nproc-per-node", "2", "--run-dir",
                             str(run_dir), *OVERRIDES], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    _wait_for_records(proc, run_dir / "metrics.jsonl", 2)
    if to_group:  # what a terminal's Ctrl-C does: the signal to the foreground process group
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    name = signal.Signals(signum).name
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    # The ranks agree on a stop at log steps: the message says so, not "after this step".
    assert "stopping at the next log step (training.log_interval=" in err and "stopping after this step" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == name
    checkpoint = run_dir / "checkpoints" / f"step_{summary['steps']:08d}"
    assert checkpoint.is_dir()
    assert {p.name.split("_")[2] for p in checkpoint.glob("__*_*.distcp")} == {"0", "1"}  # parts of both ranks
    # One summary line (not one per rank plus the launcher's), then the checkpoint and how to continue.
    assert out.count(f"kiln: stopped {summary['steps']} steps") == 1, out
    assert f"stopped by {name}: every rank saved its part of checkpoint {checkpoint}" in out
    assert "the same command continues the run" in out


def test_ranks_that_died_of_the_stop_signal_are_a_stop_not_a_failure(tmp_path):
    from kiln.checkpoint.signals import stopped_line
    from kiln.failure.ranks import RankFailure

    assert RankFailure(rank=0, exitcode=-15, timestamp=0.0).ended_by("SIGTERM")  # killed before its handler
    assert RankFailure(rank=1, exitcode=130, timestamp=0.0).ended_by("SIGINT")  # a second Ctrl-C: at once
    assert not RankFailure(rank=0, exitcode=-9, timestamp=0.0).ended_by("SIGTERM")
    own_error = RankFailure(rank=0, exitcode=1, timestamp=0.0, kiln={"kind": "disk-full"})
    assert not own_error.ended_by("SIGTERM")
    line = stopped_line("SIGTERM", None, tmp_path, "CMD", saved=False)
    assert line == "kiln: stopped by SIGTERM before any checkpoint of this run was saved; the same command starts it again"


def test_the_relay_passes_a_signal_on_once_and_a_later_repeat_again(monkeypatch):
    from kiln.distributed import signal_relay as signals

    passed = []
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    with signals.SignalRelay(forward=passed.append) as relay:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the same request delivered twice (scheduler + launcher)
        assert passed == [signal.SIGTERM] and relay.first == "SIGTERM"
        monkeypatch.setattr(signals, "REPEAT_WINDOW_S", 0.0)  # a repeat "later": the user insists
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
    assert passed == [signal.SIGTERM, signal.SIGTERM, signal.SIGHUP] and relay.received[-1] == "SIGHUP"
    assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == before  # handlers restored
