"""`kiln export`: a checkpoint's model as one safetensors file, without the model code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kiln.checkpoint import AppState
from kiln.cli.main import main

from .ckpt_helpers import checkpointer, make_run

safetensors_torch = pytest.importorskip("safetensors.torch")


def test_export_newest_checkpoint_equals_model(tmp_path: Path, capsys) -> None:
    run = make_run()
    run_dir = tmp_path / "run"
    ck = checkpointer(run_dir)
    run.step()
    ck.save(1, run.app)
    run.step()
    ck.save(2, run.app)
    out = tmp_path / "export" / "model.safetensors"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert "step 2" in capsys.readouterr().out
    loaded = safetensors_torch.load_file(str(out))
    expected = run.model.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
    summary = json.loads((out.parent / "model.kiln_export.json").read_text())
    assert summary["step"] == 2 and summary["tensors"] == len(expected)

    # --checkpoint by name under RUN_DIR/checkpoints picks an older one.
    older = tmp_path / "older.safetensors"
    assert main(["export", str(run_dir), "--checkpoint", "step_00000001", "--out", str(older)]) == 0
    assert not torch.equal(safetensors_torch.load_file(str(older))["0.weight"], expected["0.weight"])


def test_export_tied_weights(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as in many LMs
    app = AppState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer(tmp_path / "run").save(1, app)
    out = tmp_path / "tied.safetensors"
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    loaded = safetensors_torch.load_file(str(out))
    assert torch.equal(loaded["0.weight"], model[0].weight.detach())


@pytest.mark.parametrize(
    "args, message",
    [
        (["{missing}", "--out", "{out}"], "RUN_DIR: {missing}: does not exist"),
        (["{empty}", "--out", "{out}"], "RUN_DIR: {empty}: no complete checkpoint"),
        (["{empty}", "--checkpoint", "{missing}", "--out", "{out}"], "--checkpoint: {missing}: does not exist"),
        (["{empty}", "--out", "{empty}/model.pt"], "--out: {empty}/model.pt: must end in .safetensors"),
    ],
)
def test_export_bad_input_exits_2(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    names = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "out": tmp_path / "o.safetensors"}
    (tmp_path / "empty").mkdir()
    assert main(["export", *(a.format(**names) for a in args)]) == 2
    assert message.format(**names) in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def test_export_refuses_an_existing_file_unless_forced(tmp_path: Path, capsys) -> None:
    run = make_run()
    run_dir = tmp_path / "run"
    checkpointer(run_dir).save(1, run.app)
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"another run's export")
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"kiln: error: --out: {out} already exists (a file); choose another path, or pass --force "
                           "to replace an earlier kiln export there")
    assert out.read_bytes() == b"another run's export"  # untouched
    # --force replaces only what kiln exported: this file is not that
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 2
    assert "is not an earlier kiln export" in capsys.readouterr().err
    assert out.read_bytes() == b"another run's export"
    out.unlink()
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0
    assert f"the earlier export at {out} was replaced" in capsys.readouterr().out
    assert safetensors_torch.load_file(str(out)).keys() == run.model.state_dict().keys()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_export_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    import os

    run = make_run()
    checkpointer(tmp_path / "run").save(1, run.app)
    out = tmp_path / "export" / "model.safetensors"
    out.parent.mkdir()
    previous = os.umask(umask)
    try:
        assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    finally:
        os.umask(previous)
    for path in (out, out.parent / "model.kiln_export.json"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
