"""Rerunning a command in its run dir: continue the same config's run, refuse another config's
(kiln.train.rundir), through the CLI a user calls after a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.config import load_config
from kiln.config.identity import config_digest, differences, identity
from kiln.config.load import save_config
from kiln.errors import ConfigError
from kiln.outputs import RunDirLock
from kiln.train.rundir import check_run_dir, inspect_run_dir, no_checkpoint_decision

ARGS = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12", "training.log_interval=2",
    "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
]


def _kiln(*args, env=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=full_env,
                          timeout=600)


def _snapshot(run_dir):
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*") if p.is_file()}


def test_rerun_after_kill_continues_and_another_config_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ["train", "--run-dir", str(run_dir), *ARGS]
    killed = _kiln(*cmd, env={"KILN_FAULT": "kill@6"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoints" / "step_00000004").is_dir()

    again = _kiln(*cmd)  # exactly the same command
    assert again.returncode == 0, again.stderr[-2000:]
    assert "continuing it" in again.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert summary["resumed_from"].endswith("step_00000004")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 4, 5, 6, 8, 10, 12]

    before = _snapshot(run_dir)
    other = _kiln(*cmd, "optim.lr=0.01", "training.steps=20")
    assert other.returncode == 2
    line = other.stderr.strip().splitlines()[-1]
    assert "another config" in line
    assert "optim.lr: 0.001 -> 0.01" in line and "training.steps: 12 -> 20" in line
    assert _snapshot(run_dir) == before

    done = _kiln(*cmd)  # the completed run again: nothing to do, nothing touched
    assert done.returncode == 0, done.stderr[-2000:]
    assert "already holds the completed run" in done.stdout
    assert _snapshot(run_dir) == before


def test_bookkeeping_keys_do_not_change_identity():
    base = load_config(None, ARGS)
    same = load_config(None, [*ARGS, "checkpoint.interval=2", "metrics.console=true", "training.log_interval=3",
                              "checkpoint.resume=never", "data.num_workers=0"])
    other = load_config(None, [*ARGS, "model.kwargs.hidden_size=64"])
    assert config_digest(base) == config_digest(same)
    assert differences(identity(base), identity(other)) == ["model.kwargs: " + json.dumps(
        {"hidden_size": 32, "num_classes": 4, "num_layers": 2}, sort_keys=True) + " -> " + json.dumps(
        {"hidden_size": 64, "num_classes": 4, "num_layers": 2}, sort_keys=True)]


def test_saved_config_round_trips_to_the_same_identity(tmp_path):
    cfg = load_config(None, [*ARGS, "optim.betas=[0.9, 0.95]", "compile.options.max_autotune=true"])
    (tmp_path / "metrics.jsonl").write_text("")
    save_config(cfg, tmp_path / "config.toml")
    assert check_run_dir(tmp_path, cfg, "auto") == "same config"


def test_decisions(tmp_path):
    cfg = load_config(None, ARGS)
    assert check_run_dir(tmp_path / "new", cfg, "auto") is None  # nothing there
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("a user's file is not a run")
    assert check_run_dir(run, cfg, "never") is None
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no readable config.toml"):
        check_run_dir(run, cfg, "auto")
    save_config(cfg, run / "config.toml")
    assert check_run_dir(run, cfg, "/some/checkpoint") is None  # an explicit checkpoint: the user's choice
    assert "starting over" in no_checkpoint_decision(inspect_run_dir(run))  # died before its first checkpoint
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(ConfigError, match="completed run of this config and no checkpoint"):
        no_checkpoint_decision(inspect_run_dir(run))
    file_path = tmp_path / "file"
    file_path.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        check_run_dir(file_path, cfg, "auto")


def test_a_live_run_holds_the_dir(tmp_path):
    cfg = load_config(None, ARGS)
    with RunDirLock(tmp_path):
        with pytest.raises(ConfigError, match="in use by a running kiln process"):
            check_run_dir(tmp_path, cfg, "auto")
        with pytest.raises(ConfigError, match="in use"):
            RunDirLock(tmp_path).__enter__()
    assert check_run_dir(tmp_path, cfg, "auto") is None  # released: the dir holds no run


def test_without_run_dir_the_same_command_continues_the_stopped_run(tmp_path):
    """A run without --run-dir stopped by Ctrl-C says the same command continues it, and it does:
    the rerun finds the unfinished run of this config under runs/ (not a new timestamped dir).
    A completed run, or another config, starts a new dir."""
    import signal
    import time

    cmd = [sys.executable, "-m", "kiln", "train", *ARGS, "training.steps=60", "checkpoint.interval=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILN_FAULT": "slow@1:100"}  # ~6 s of steps to interrupt
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not [p for p in (tmp_path / "runs").glob("*/metrics.jsonl") if p.read_text().count("\n") >= 2]:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["status"] == "stopped" and stopped["steps"] < 60
    assert f"the same command continues the run in {run_dir.relative_to(tmp_path)}" in err

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env={**env, "KILN_FAULT": ""},
                           timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "continuing the unfinished run of this config" in again.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 60
    assert summary["resumed_from"].endswith(f"step_{stopped['steps']:08d}")

    fresh = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env={**env, "KILN_FAULT": ""},
                           timeout=600)  # the run is complete: a new run, in a new dir
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert len(list((tmp_path / "runs").iterdir())) == 2 and "continuing" not in fresh.stderr


def test_a_finished_run_trains_longer_with_its_schedule_continuing(tmp_path, caplog):
    """Raising training.steps in a finished run's dir continues it from its last checkpoint; the LR
    does not jump back up the cosine: the extra steps run at the LR the run ended with."""
    import logging

    from kiln.train.trainer import train

    run_dir = tmp_path / "run"
    base = [a for a in ARGS if not a.startswith(("training.steps", "training.log_interval"))]
    base += ["training.log_interval=1", "optim.lr=1e-3", "optim.min_lr_ratio=0.1"]
    assert train(load_config(None, [*base, "training.steps=12"]), run_dir)["status"] == "completed"
    with caplog.at_level(logging.INFO, logger="kiln"):
        summary = train(load_config(None, [*base, "training.steps=20"]), run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["resumed_from"].endswith("step_00000012")
    assert "training.steps 12 -> 20" in caplog.text and "steps 13-20 run at its final LR 0.0001" in caplog.text
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert sorted(lrs) == list(range(1, 21))
    assert lrs[1] == pytest.approx(1e-3) and lrs[12] > 1e-4
    assert all(lrs[s] == pytest.approx(1e-4) for s in range(13, 21))  # no jump back up
    assert "decay_steps = 12" in (run_dir / "config.toml").read_text()

    before = _snapshot(run_dir)  # the same longer command again: complete, nothing touched
    assert train(load_config(None, [*base, "training.steps=20"]), run_dir)["already_complete"]
    assert _snapshot(run_dir) == before
    with pytest.raises(ConfigError, match="training.steps: 20 -> 8"):  # fewer steps: another run
        check_run_dir(run_dir, load_config(None, [*base, "training.steps=8"]), "auto")
