"""metrics.jsonl holds whole records: a failed append is cut back off, a torn last line left by a
crash is dropped (saying so, naming the file) by every reader and by the next run."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

from kiln.monitor.records import BrokenRecordsError, read_records, torn_tail
from kiln.monitor.sinks import JsonlSink


def _write(path, *lines: str) -> None:
    path.write_text("".join(lines))


def test_a_torn_last_line_is_dropped_and_named(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write(path, '{"step": 1}\n', '{"step": 2}\n', '{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert [r["step"] for r in read_records(path)] == [1, 2]
    assert str(path) in caplog.text and "dropped its last line" in caplog.text
    assert torn_tail(path) == len('{"step": 3, "lo')


def test_damage_in_the_middle_names_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, '{"step": 1}\n', '{"ste\n', '{"step": 3}\n')
    with pytest.raises(BrokenRecordsError, match=r"metrics.jsonl:2 is not a JSON record"):
        read_records(path)


def test_a_failed_append_leaves_whole_records(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log({"step": 1, "loss": 0.5})
    real_write = os.write

    def disk_full_after_ten_bytes(fd, data):
        real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full_after_ten_bytes)
    with pytest.raises(OSError):
        sink.log({"step": 2, "loss": 0.25})
    monkeypatch.setattr(os, "write", real_write)
    sink.log({"step": 3, "loss": 0.125})
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 3]


def test_a_resumed_run_drops_a_torn_line_and_continues(tmp_path, tiny_overrides, caplog):
    from kiln.config import load_config
    from kiln.train.trainer import Trainer

    over = [*tiny_overrides, "training.steps=8", "training.log_interval=2", "checkpoint.interval=4"]
    run_dir = tmp_path / "run"
    Trainer(load_config(None, over), run_dir).fit()
    metrics = run_dir / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"step": 9, "loss": 0.1')  # what a crash in the middle of a write leaves
    resume = f"checkpoint.resume={run_dir / 'checkpoints' / 'step_00000004'}"
    with caplog.at_level(logging.WARNING, logger="kiln"):
        summary = Trainer(load_config(None, [*over, resume]), run_dir).fit()
    assert summary["status"] == "completed"
    assert f"{metrics}: dropped its last line" in caplog.text
    assert [r["step"] for r in read_records(metrics)] == [1, 2, 4, 5, 6, 8]  # the first step after a resume is logged


def test_damage_in_the_middle_is_its_own_failure_with_the_line_and_the_way_out(tmp_path, tiny_overrides, capsys):
    """Resuming a run whose metrics.jsonl is damaged mid-file: exit 1 naming the file and line and
    what to do (not "your model, data or factory code"); doing it lets the same command resume."""
    from kiln.cli.main import main
    from kiln.config import load_config
    from kiln.train.trainer import Trainer

    over = [*tiny_overrides, "training.steps=8", "training.log_interval=2", "checkpoint.interval=4"]
    run_dir = tmp_path / "run"

    def crash(step):
        if step == 6:
            raise RuntimeError("crash after step 6")

    with pytest.raises(RuntimeError):
        Trainer(load_config(None, over), run_dir, step_hook=crash).fit()
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + '{"step": 2, "lo\n' + "".join(lines[2:]))  # line 2 damaged, later ones whole
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run_dir), *over]) == 1
    err = capsys.readouterr().err
    assert "line 2 of metrics.jsonl is damaged" in err and f"{metrics}:2 is not a JSON record" in err, err
    assert f"head -n 1 {metrics}" in err and "your model, data or factory code" not in err, err
    metrics.write_text(lines[0])  # what the advice says: keep the lines before it
    assert main(["train", "--run-dir", str(run_dir), *over]) == 0
    assert [r["step"] for r in read_records(metrics)] == [1, 5, 6, 8]
