"""Branch from an earlier checkpoint with another config, crash, rerun the printed resume command:
one timeline (the new one) is resumed, kept and exported; the earlier one is moved aside."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.checkpoint.export import find_checkpoint, load_model_weights
from kiln.config import load_config
from kiln.train.trainer import Trainer

ARGS = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "model.kwargs.dropout=0.0", "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12",
    "training.log_interval=2", "training.device=cpu", "training.deterministic=true", "metrics.console=false",
    "metrics.tensorboard=false", "checkpoint.interval=4", "checkpoint.keep=2",
]


class Crash(RuntimeError):
    pass


def _crash_at(step: int):
    def hook(s: int) -> None:
        if s == step:
            raise Crash(f"crash after step {s}")
    return hook


def test_branch_crash_resume_is_one_timeline(tmp_path):
    run = tmp_path / "run"
    assert Trainer(load_config(None, ARGS), run).fit()["status"] == "completed"
    old = {p.name: load_model_weights(p) for p in (run / "checkpoints").glob("step_*")}
    old_lr = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(old) == ["step_00000008", "step_00000012"]  # keep=2

    branch_from = run / "checkpoints" / "step_00000008"
    branched = [*ARGS, "optim.lr=0.01", f"checkpoint.resume={branch_from}"]
    # Reference: the same branch, uninterrupted, in a dir of its own.
    reference = tmp_path / "reference"
    Trainer(load_config(None, branched), reference).fit()
    new_lr = {r["step"]: r["lr"] for r in map(json.loads, (reference / "metrics.jsonl").read_text().splitlines())}
    assert new_lr[10] == pytest.approx(10 * old_lr[10])  # the branch trains with its own learning rate

    with pytest.raises(Crash):
        Trainer(load_config(None, branched), run, step_hook=_crash_at(10)).fit()
    retired = list((run / "checkpoints" / "retired").glob("*/step_00000012"))
    assert len(retired) == 1  # moved aside, not deleted
    assert torch.equal(load_model_weights(retired[0])["backbone.0.linear.weight"], old["step_00000012"]["backbone.0.linear.weight"])

    # The printed recovery command: the run's own config.toml, checkpoint.resume=auto.
    again = Trainer(load_config(str(run / "config.toml"), ["checkpoint.resume=auto"]), run)
    assert not again.parts.resume.already_complete
    assert again.parts.resume.path == branch_from
    summary = again.fit()
    assert summary["status"] == "completed" and summary["steps"] == 12
    names = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert names == ["step_00000008", "step_00000012"]
    exported = load_model_weights(find_checkpoint(run))
    expected = load_model_weights(find_checkpoint(reference))
    for key, value in expected.items():
        assert torch.equal(exported[key], value), key
    assert any(not torch.equal(exported[k], v) for k, v in old["step_00000012"].items())
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 12


def test_a_branch_from_elsewhere_that_crashes_before_its_first_save_resumes_from_the_branch_point(tmp_path):
    source_run = tmp_path / "source"
    Trainer(load_config(None, ARGS), source_run).fit()
    source = source_run / "checkpoints" / "step_00000008"
    run = tmp_path / "run"
    Trainer(load_config(None, [*ARGS, "optim.lr=0.02"]), run).fit()  # some other run in the dir
    branched = [*ARGS, "optim.lr=0.01", f"checkpoint.resume={source}"]
    with pytest.raises(Crash):
        Trainer(load_config(None, branched), run, step_hook=_crash_at(9)).fit()
    assert not list((run / "checkpoints").glob("step_*"))  # the other run's: retired
    assert not (run / "metrics.jsonl").exists() or all(
        json.loads(line)["step"] > 8 for line in (run / "metrics.jsonl").read_text().splitlines())
    again = Trainer(load_config(str(run / "config.toml"), ["checkpoint.resume=auto"]), run)
    assert again.parts.resume.path == source
    assert again.fit()["status"] == "completed"


def _weights(path):
    return load_model_weights(path)["backbone.0.linear.weight"]


def test_retention_after_a_branch_keeps_the_new_timeline_and_never_touches_the_retired_one(tmp_path):
    """Branch from step 4 with checkpoint.keep=2, crash after step 9: the dir keeps the new
    timeline's 4 and 8 (not the earlier run's higher-numbered 8 and 12, which sit in retired/,
    intact); resuming to 12 lets retention drop the new 4, and still nothing in retired/."""
    run = tmp_path / "run"
    Trainer(load_config(None, [*ARGS, "checkpoint.keep=3"]), run).fit()
    ckpts = run / "checkpoints"
    old = {p.name: _weights(p) for p in ckpts.glob("step_*")}
    assert sorted(old) == ["step_00000004", "step_00000008", "step_00000012"]

    branched = [*ARGS, "optim.lr=0.01", f"checkpoint.resume={ckpts / 'step_00000004'}"]
    with pytest.raises(Crash):
        Trainer(load_config(None, branched), run, step_hook=_crash_at(9)).fit()
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000004", "step_00000008"]
    assert torch.equal(_weights(ckpts / "step_00000004"), old["step_00000004"])  # the branch point
    assert not torch.equal(_weights(ckpts / "step_00000008"), old["step_00000008"])  # the new timeline's 8
    (retired,) = (ckpts / "retired").iterdir()
    assert sorted(p.name for p in retired.glob("step_*")) == ["step_00000008", "step_00000012"]

    assert Trainer(load_config(str(run / "config.toml"), ["checkpoint.resume=auto"]), run).fit()["status"] == "completed"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000008", "step_00000012"]  # keep=2: the new 4 went
    assert not torch.equal(_weights(ckpts / "step_00000012"), old["step_00000012"])
    assert [p.name for p in (ckpts / "retired").iterdir()] == [retired.name]
    for name in ("step_00000008", "step_00000012"):  # never deleted, never rewritten
        assert torch.equal(_weights(retired / name), old[name]), name
