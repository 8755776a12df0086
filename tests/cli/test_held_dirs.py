"""Nothing that does not hold a run dir's lock writes in it: a `kiln train` refused by the lock
keeps its dependency messages out of the dir, and `kiln export` / `kiln report` refuse (exit 2)
to write into a dir a live kiln process holds (they read from it freely)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

from kiln import noise
from kiln.checkpoint import AppState, Checkpointer
from kiln.config.schema import CheckpointConfig
from kiln.outputs import RunDirLock

TINY = ["model.kwargs.hidden_size=8", "model.kwargs.num_layers=1", "training.steps=2", "training.device=cpu",
        "metrics.console=false", "metrics.tensorboard=false"]


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def held_elsewhere(path):
    """`path`'s lock held by another live process (as a running `kiln train` holds its run dir)."""
    code = ("import sys; from kiln.outputs import RunDirLock; RunDirLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temp directory kiln.noise falls back to, private to the test."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("launcher", [[], ["--nproc-per-node", "2"]], ids=["trainer", "launcher"])
def test_a_train_refused_by_the_lock_keeps_its_dependency_messages_out(tmp_path, temp_dir, monkeypatch, capsys,
                                                                        launcher):
    from kiln import config
    from kiln.cli.main import main

    load = config.load_config

    def load_and_make_noise(*args, **kw):  # a dependency's deprecation while the command runs
        noise.NOISE.write("transformers WARNING: something is deprecated")
        return load(*args, **kw)

    monkeypatch.setattr(config, "load_config", load_and_make_noise)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with RunDirLock(run_dir):  # a live run holds it
        before = _files(run_dir)
        assert main(["train", *launcher, "--run-dir", str(run_dir), *TINY]) == 2
        assert _files(run_dir) == before
    err = capsys.readouterr().err
    assert "in use by a running kiln process" in err
    kept = temp_dir / f"kiln-{os.getuid()}-{noise.LOG_NAME}"
    assert "something is deprecated" in kept.read_text() and str(kept) in err


def _finished_run(run_dir):
    """A run dir with a checkpoint, metrics and a summary, as a finished `kiln train` leaves it."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    Checkpointer(run_dir, CheckpointConfig(), rank=0, world_size=1).save(
        1, AppState(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "step_ms": 2.0}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "steps": 1}))


@pytest.mark.parametrize("out", ["model.safetensors", "hf", "exports/model.safetensors"])
def test_export_into_a_live_run_dir_is_refused(tmp_path, bad_input, capsys, out):
    from kiln.cli.main import main

    pytest.importorskip("safetensors")
    run_dir = tmp_path / "run"
    _finished_run(run_dir)
    capsys.readouterr()  # the save's log line
    (run_dir / "exports").mkdir()
    with held_elsewhere(run_dir) as pid:
        before = _files(run_dir)
        bad_input(["export", str(run_dir), "--out", str(run_dir / out)], ["--out", f"pid {pid}", str(run_dir)])
        assert _files(run_dir) == before
        assert main(["export", str(run_dir), "--out", str(tmp_path / "model.safetensors")]) == 0  # reading is fine
        assert _files(run_dir) == before


def test_report_of_a_live_run_goes_elsewhere(tmp_path, bad_input, capsys):
    from kiln.cli.main import main

    run_dir = tmp_path / "run"
    _finished_run(run_dir)
    capsys.readouterr()  # the save's log line
    with held_elsewhere(run_dir) as pid:
        before = _files(run_dir)
        bad_input(["report", str(run_dir)], ["--out", f"pid {pid}", "pass --out DIR"])
        bad_input(["report", str(run_dir / "metrics.jsonl")], ["--out", f"pid {pid}"])
        assert _files(run_dir) == before
        assert main(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
        assert _files(run_dir) == before
    assert (tmp_path / "report" / "report.md").exists()
    assert main(["report", str(run_dir)]) == 0  # nobody holds it any more: the report goes beside the run
    assert (run_dir / "report.md").exists()
