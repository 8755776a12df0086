"""`kiln export --out` never lands on, above or inside what it reads, and `--force` replaces only an
earlier kiln export: the run, its siblings and the user's files stay byte-identical (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.cli.main import main

from .ckpt_helpers import checkpointer, make_run

pytest.importorskip("safetensors.torch")


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def workspace(tmp_path) -> tuple[Path, Path]:
    """(parent, run): a run dir with a checkpoint, a sibling of the user's beside it."""
    parent = tmp_path / "work"
    run = parent / "run"
    checkpointer(run).save(1, make_run().app)
    (parent / "sibling").mkdir()
    (parent / "sibling" / "notes.txt").write_text("the user's")
    return parent, run


@pytest.mark.parametrize("where", ["run", "parent", "inside", "inside.safetensors", "cwd", "dot", "checkpoint"])
def test_an_export_onto_its_own_input_is_refused_and_nothing_moves(workspace, capsys, monkeypatch, where):
    parent, run = workspace
    monkeypatch.chdir(parent)
    out = {"run": run, "parent": parent, "inside": run / "hf", "inside.safetensors": run / "model.safetensors",
           "cwd": Path.cwd(), "dot": Path("."), "checkpoint": run / "checkpoints" / "step_00000001"}[where]
    before = _tree(parent)
    for force in ([], ["--force"]):
        assert main(["export", str(run), "--out", str(out), *force]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--out:" in err
        assert any(word in err for word in (" is RUN_DIR", " holds RUN_DIR", " lies inside RUN_DIR")), err
    assert _tree(parent) == before and not any(p.name.startswith(".") for p in parent.iterdir())


def test_force_onto_a_directory_of_the_users_is_refused(workspace, capsys, monkeypatch):
    parent, run = workspace
    monkeypatch.chdir(parent / "sibling")
    before = _tree(parent)
    assert main(["export", str(run), "--out", ".", "--force"]) == 2
    assert "is not an earlier kiln export (it holds what a kiln export never writes (notes.txt))" in capsys.readouterr().err
    assert _tree(parent) == before


def test_an_unwritable_out_is_bad_input(workspace, capsys):
    parent, run = workspace
    if os.geteuid() == 0:
        out = Path("/proc/kiln-export.safetensors")  # root writes anywhere a mode allows: use a filesystem that refuses
    else:
        locked = parent / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "model.safetensors"
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "--out:" in capsys.readouterr().err


def test_a_link_at_out_is_refused_even_with_force(workspace, capsys, tmp_path):
    parent, run = workspace
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"not kiln's")
    link = parent / "model.safetensors"
    link.symlink_to(victim)
    assert main(["export", str(run), "--out", str(link), "--force"]) == 2
    assert f"{link}: is a symbolic link" in capsys.readouterr().err
    assert victim.read_bytes() == b"not kiln's"


@pytest.mark.parametrize(("make", "out", "needles"), [
    (None, "hf", ["RUN_DIR", "does not exist", "kiln train"]),
    ("dir", "hf", ["RUN_DIR", "not a kiln run directory", "checkpoints/"]),
    (None, "w.safetensors", ["RUN_DIR", "does not exist"]),
])
def test_a_missing_or_foreign_run_dir_is_named_as_such(tmp_path, bad_input, make, out, needles):
    """The error says what is wrong with RUN_DIR (missing, or not a run), not what an export of a
    run without a model config should do instead."""
    run = tmp_path / "run"
    if make == "dir":
        run.mkdir()
    bad_input(["export", str(run), "--out", str(tmp_path / out)], needles)
