"""A run dir handed over by someone else (`cp -a`, `tar`, a shared filesystem) is untrusted, all of
it: a link (or a FIFO) at any name kiln writes is refused with exit 2 naming it and its target left
as it was; files named by the run dir are read as bounded regular files, so `/dev/zero` or a FIFO
never hangs kiln or fills memory; a checkpoint whose marker or data cannot be used is skipped for
the newest good one; a broken branch record is refused, never a silent restart from step 0."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from kiln.cli.main import main

ARGS = [
    "model.kwargs.hidden_size=16", "model.kwargs.num_layers=1", "model.kwargs.num_classes=4",
    "data.synthetic_samples=64", "data.batch_size=8", "training.log_interval=2", "training.device=cpu",
    "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
]
VICTIM = "precious, not kiln's\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 12-step run that failed at step 10, with checkpoints at steps 4 and 8: the same command
    continues it."""
    run = tmp_path_factory.mktemp("trained") / "run"
    os.environ["KILN_FAULT"] = "host-oom@10"
    try:
        assert main(["train", "--run-dir", str(run), *ARGS, "training.steps=12"]) == 1
    finally:
        del os.environ["KILN_FAULT"]
    return run


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    return run


def _train(run: Path, steps: int = 12) -> int:
    return main(["train", "--run-dir", str(run), *ARGS, f"training.steps={steps}"])


def _names_written(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


# Every name kiln writes in a run dir outside its saved checkpoints: what a tiny run writes (checked
# below), and what other paths write (the lock's pid note, the dependency log, the compile cache, a
# branch record, a report, TensorBoard's dir, an LM run's model files, the temporaries that older
# kiln wrote before renaming).
PLANTED = ["config.toml", "metrics.jsonl", "summary.json", "error.log", ".kiln.lock", "dependencies.log",
           "compile_cache.bin", "checkpoints/branch.json", "metrics.jsonl.part", "checkpoints/branch.json.part",
           "compile_cache.bin.part", "report.md", "tb", "model"]


def test_the_planted_names_cover_what_a_run_writes(trained):
    written = _names_written(trained)
    assert {"config.toml", "metrics.jsonl", "summary.json", "error.log",
            "checkpoints/step_00000008/kiln_complete.json"} <= set(written)
    assert {name for name in written if not name.startswith("checkpoints/step_")} <= set(PLANTED)


@pytest.mark.parametrize("name", PLANTED)
def test_a_link_at_any_name_kiln_writes_is_refused_and_its_target_kept(copy, tmp_path, capsys, name):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    link = copy / name
    if link.is_dir():
        shutil.rmtree(link)
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file() and not p.is_symlink()}
    assert _train(copy) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{link}: is a symbolic link to {victim}" in err
    assert victim.read_text() == VICTIM and link.is_symlink()
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file() and not p.is_symlink()} == before


def test_a_link_in_a_fresh_run_dir_is_refused_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "fresh"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (run / ".kiln.lock").symlink_to(victim)
    assert _train(run, 4) == 2
    assert ".kiln.lock: is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == VICTIM and sorted(p.name for p in run.iterdir()) == [".kiln.lock"]


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl"])
def test_a_fifo_or_dev_zero_in_the_run_dir_is_refused_within_seconds(copy, capsys, name):
    target = copy / name
    target.unlink()
    os.mkfifo(target)
    started = time.monotonic()
    assert _train(copy) == 2
    assert f"{target}: is a FIFO" in capsys.readouterr().err
    target.unlink()
    target.symlink_to("/dev/zero")
    assert _train(copy) == 2
    assert f"{target}: is a symbolic link to /dev/zero" in capsys.readouterr().err
    assert time.monotonic() - started < 60


def _marker(path: Path) -> dict:
    return json.loads((path / "kiln_complete.json").read_text())


def _remark(path: Path, **changes) -> None:
    (path / "kiln_complete.json").write_text(json.dumps({**_marker(path), **changes}))


def _resumed_from(run: Path) -> str:
    return json.loads((run / "summary.json").read_text())["resumed_from"]


@pytest.mark.parametrize("files", [
    {"/dev/zero": {"bytes": 0, "sha256": "0" * 64}},
    {"__0_0.distcp": "not an object"},
    ["__0_0.distcp"],
    {"fifo": {"bytes": 0, "sha256": "0" * 64}},
])
def test_a_marker_naming_what_kiln_never_wrote_skips_to_the_older_checkpoint(copy, tmp_path, caplog, files):
    newest = copy / "checkpoints" / "step_00000008"
    if "fifo" in files:
        os.mkfifo(newest / "fifo")
    _remark(newest, files=files)
    started = time.monotonic()
    assert main(["export", str(copy), "--out", str(tmp_path / "m.safetensors")]) == 0
    assert json.loads((tmp_path / "m.kiln_export.json").read_text())["step"] == 4
    assert _train(copy) == 0
    assert time.monotonic() - started < 120
    assert _resumed_from(copy).endswith("step_00000004")
    assert f"skipping checkpoint {newest}" in caplog.text


def _damage_and_remark(checkpoint: Path) -> None:
    """Bytes a read fails on, with the marker's sizes and checksums recomputed: only the read can tell."""
    from kiln.checkpoint.layout import content_manifest

    for data in checkpoint.glob("*.distcp"):  # every writer thread's file
        data.write_bytes(b"\0" * data.stat().st_size)
    _remark(checkpoint, files=content_manifest(checkpoint))


def test_a_remarked_corrupt_checkpoint_is_skipped_on_resume(copy, caplog):
    newest = copy / "checkpoints" / "step_00000008"
    _damage_and_remark(newest)
    assert _train(copy) == 0
    assert _resumed_from(copy).endswith("step_00000004")
    assert f"skipping checkpoint {newest}: reading checkpoint" in caplog.text
    steps = [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # the skipped steps ran again, logged once


def test_a_remarked_corrupt_checkpoint_is_skipped_by_export(copy, tmp_path, caplog):
    _damage_and_remark(copy / "checkpoints" / "step_00000008")
    out = tmp_path / "model.safetensors"
    assert main(["export", str(copy), "--out", str(out)]) == 0
    assert json.loads((tmp_path / "model.kiln_export.json").read_text())["step"] == 4
    assert "skipping checkpoint" in caplog.text


def test_a_leftover_tmp_that_is_a_link_is_removed_not_followed(copy, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text(VICTIM)
    tmp = copy / "checkpoints" / "step_00000012.tmp"
    tmp.symlink_to(victim)
    assert _train(copy) == 0
    assert (copy / "checkpoints" / "step_00000012").is_dir() and not tmp.is_symlink()
    assert (victim / "keep").read_text() == VICTIM and sorted(p.name for p in victim.iterdir()) == ["keep"]


@pytest.mark.parametrize("record", ["not json", "[1, 2]", '{"from": 5, "step": "x"}', '{"from": "/nowhere/step_00000004", "step": 4}'])
def test_a_broken_branch_record_is_refused_never_a_silent_restart(copy, capsys, record):
    shutil.rmtree(copy / "checkpoints" / "step_00000004")
    shutil.rmtree(copy / "checkpoints" / "step_00000008")  # no checkpoint of its own: the branch point decides
    branch = copy / "checkpoints" / "branch.json"
    branch.write_text(record)
    before = _names_written(copy)
    assert _train(copy) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(branch) in err and "checkpoint.resume" in err
    assert _names_written(copy) == before and json.loads((copy / "summary.json").read_text())["status"] == "failed"
