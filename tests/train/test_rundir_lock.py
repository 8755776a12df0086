"""The run dir's lock is taken before the run dir is checked and held through the whole run; a
process refused by it (a `kiln train`, a multi-rank launcher) exits 2 and touches nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kiln.config import load_config
from kiln.train.trainer import Trainer

ARGS = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "data.synthetic_samples=256", "data.batch_size=8", "training.steps=8", "training.log_interval=2",
    "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
]

# A factory that blocks while it builds the real model (not the launcher's meta-device preflight)
# until the test creates GO: a run held "while building its model", deterministically.
FACTORY = """
import os, time, torch
from kiln.models.mlp import build_mlp
from kiln.models.spec import InputSpec

def build(hidden_size=32, num_layers=2, num_classes=4, dropout=0.0):
    if torch.empty(0).device.type != "meta":
        open(os.environ["KILN_TEST_BUILDING"] + f".{os.getpid()}", "w").close()
        while not os.path.exists(os.environ["KILN_TEST_GO"]):
            time.sleep(0.05)
    model = build_mlp(hidden_size, num_layers, num_classes, dropout)
    return model, InputSpec("features", (hidden_size,), num_classes=num_classes)
"""


def _kiln(*args, env=None, **kw):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=full_env,
                          timeout=kw.pop("timeout", 600), **kw)


def _files(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _blocking_factory(tmp_path) -> tuple[dict, Path, str]:
    """The env that makes FACTORY block, the GO file that frees it, and its model.name override."""
    (tmp_path / "factory.py").write_text(FACTORY)
    go = tmp_path / "GO"
    env = {"KILN_TEST_BUILDING": str(tmp_path / "building"), "KILN_TEST_GO": str(go),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return env, go, f"model.name={tmp_path / 'factory.py'}:build"


def _wait_building(tmp_path, proc) -> None:
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("building.*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(tmp_path.glob("building.*")), "the run never started building its model"


def test_two_configs_racing_for_one_run_dir(tmp_path, monkeypatch):
    """The winner holds the dir from before its checks: while it is still building its model (it
    has written nothing but the lock's note), a run of another config is refused and touches
    nothing; the winner then finishes as if alone."""
    run_dir = tmp_path / "run"
    env, go, factory = _blocking_factory(tmp_path)
    winner = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir), *ARGS, factory],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    try:
        _wait_building(tmp_path, winner)
        before = _files(run_dir)
        loser = _kiln("train", "--run-dir", str(run_dir), *ARGS, "optim.lr=0.05", timeout=300)
        after = _files(run_dir)
        go.touch()
        _, err = winner.communicate(timeout=600)
    finally:
        go.touch()
        if winner.poll() is None:
            winner.kill()
    assert loser.returncode == 2, loser.stderr[-2000:]
    assert "in use by a running kiln process" in loser.stderr.strip().splitlines()[-1]
    assert after == before  # the loser wrote and removed nothing
    assert winner.returncode == 0, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert 'lr = 0.001' in (run_dir / "config.toml").read_text()
    # The winner's files are its own: an uninterrupted run of its config alone writes the same bytes.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    alone = tmp_path / "alone"
    Trainer(load_config(None, [*ARGS, factory]), alone).fit()
    for name in ("config.toml", "checkpoints/step_00000004/__0_0.distcp", "checkpoints/step_00000008/__0_0.distcp"):
        assert (run_dir / name).read_bytes() == (alone / name).read_bytes(), name
    assert not (run_dir / ".kiln.lock").exists()


def test_a_refused_trainer_leaves_no_dir_behind(tmp_path):
    bad = _kiln("train", "--run-dir", str(tmp_path / "new"), *ARGS, "model.kwargs.no_such_kwarg=1")
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert not (tmp_path / "new").exists()


def test_two_launchers_racing_the_live_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    env, go, factory = _blocking_factory(tmp_path)
    cmd = ["train", "--nproc-per-node", "2", "--run-dir", str(run_dir), *ARGS, factory]
    live = subprocess.Popen([sys.executable, "-m", "kiln", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    try:
        _wait_building(tmp_path, live)
        try:
            refused = _kiln(*cmd, env=env, timeout=120)  # the same command, while the first builds
            refused_code, refused_err = refused.returncode, refused.stderr
        except subprocess.TimeoutExpired as exc:  # it started ranks that wait for GO as well
            refused_code, refused_err = None, str(exc.stderr)
        go.touch()
        out, err = live.communicate(timeout=600)
    finally:
        go.touch()
        if live.poll() is None:
            live.kill()
    assert refused_code == 2, refused_err[-2000:]
    assert "in use by a running kiln process" in refused_err.strip().splitlines()[-1]
    assert live.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 8
    assert not list(run_dir.glob("error*.log"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000004", "step_00000008"]
