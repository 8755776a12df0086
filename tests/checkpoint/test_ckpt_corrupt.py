"""A checkpoint whose bytes changed after its save (same size) is found by its checksums, named in
kiln's words and skipped for the newest intact one, on resume and in `kiln export`."""

from __future__ import annotations

import json

import pytest
from tests.train.test_rundir import ARGS, _kiln  # the same tiny seed-MLP run and CLI call


def _corrupt(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))  # same size: only a checksum can tell


@pytest.fixture
def crashed_run(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ["train", "--run-dir", str(run_dir), *ARGS]
    killed = _kiln(*cmd, env={"KILN_FAULT": "kill@10"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    newest = run_dir / "checkpoints" / "step_00000008"
    marker = json.loads((newest / "kiln_complete.json").read_text())
    assert marker["format"] == 2 and "__0_0.distcp" in marker["files"]
    assert len(marker["files"]["__0_0.distcp"]["sha256"]) == 64
    _corrupt(newest / "__0_0.distcp")
    return run_dir, cmd


def test_a_corrupt_checkpoint_is_skipped_on_resume_and_export(crashed_run, tmp_path):
    run_dir, cmd = crashed_run
    out = tmp_path / "model.safetensors"
    exported = _kiln("export", str(run_dir), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert "step_00000008" in exported.stderr and "does not match its checksum" in exported.stderr
    assert json.loads(out.with_name("model.kiln_export.json").read_text())["step"] == 4

    explicit = _kiln(*cmd, f"checkpoint.resume={run_dir / 'checkpoints' / 'step_00000008'}")
    assert explicit.returncode == 2
    assert "does not match its checksum" in explicit.stderr.strip().splitlines()[-1]

    again = _kiln(*cmd)  # the printed resume command: continues from the newest good checkpoint
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipping checkpoint" in again.stderr and "__0_0.distcp does not match its checksum" in again.stderr
    assert "Traceback" not in again.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000004")
    marker = json.loads((run_dir / "checkpoints" / "step_00000008" / "kiln_complete.json").read_text())
    from kiln.checkpoint.layout import checkpoint_problem

    assert marker["step"] == 8 and checkpoint_problem(run_dir / "checkpoints" / "step_00000008") is None


def test_a_failed_read_is_reported_in_kiln_words(tmp_path):
    """A checkpoint without checksums (written before them) whose data cannot be read: DCP's
    CheckpointException (a BaseException) becomes kiln's own error naming the checkpoint."""
    import torch

    from kiln.checkpoint import AppState, Checkpointer
    from kiln.checkpoint.dcp_io import CheckpointReadError
    from kiln.config.schema import CheckpointConfig

    model = torch.nn.Linear(4, 4)
    app = AppState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ck = Checkpointer(tmp_path, CheckpointConfig(), rank=0, world_size=1)
    path = ck.save(1, app)
    marker = json.loads((path / "kiln_complete.json").read_text())
    del marker["files"]
    (path / "kiln_complete.json").write_text(json.dumps(marker))
    data = path / "__0_0.distcp"
    data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.raises(CheckpointReadError, match=f"reading checkpoint {path} failed"):
        ck.load(path, AppState(model, torch.optim.SGD(model.parameters(), lr=0.1)))


def test_a_sizes_only_check_reads_no_data_and_is_not_remembered_as_verified(tmp_path):
    """hashes=False (a message about a checkpoint just written) sees a same-size change only when a
    later full check, the one before a load, reads the bytes; it must not cache its lighter answer."""
    from kiln.checkpoint.layout import MARKER, content_problem, file_digest

    ckpt = tmp_path / "step_00000001"
    ckpt.mkdir()
    data = ckpt / "__0_0.distcp"
    data.write_bytes(b"abcdefgh")
    marker = {"files": {data.name: {"bytes": 8, "sha256": file_digest(data)}}}
    (ckpt / MARKER).write_text("{}")
    data.write_bytes(b"abc")
    assert "truncated" in content_problem(ckpt, marker, hashes=False)  # sizes are still checked
    data.write_bytes(b"abcdefgX")  # same size, other bytes
    assert content_problem(ckpt, marker, hashes=False) is None
    assert "does not match its checksum" in content_problem(ckpt, marker)
