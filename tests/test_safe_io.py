"""kiln.safe_io and the writers that go through it: a link planted where kiln writes is refused
(LinkRefused, exit 2 naming it) and its target never changes, also when it appears after a
command's first check; reads take bounded regular files only, so a FIFO or /dev/zero never hangs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from kiln.errors import ConfigError
from kiln.safe_io import (
    LinkRefused,
    UnsafeFile,
    append_text,
    open_truncate,
    read_bytes,
    read_json,
    refuse_links,
    write_atomic,
)

VICTIM = "the victim's bytes\n"


@pytest.fixture
def planted(tmp_path):
    """(directory, victim): `plant(name)` puts a link to the victim at directory/name."""
    directory, victim = tmp_path / "dir", tmp_path / "victim"
    directory.mkdir()
    victim.write_text(VICTIM)

    def plant(name: str) -> Path:
        link = directory / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(victim)
        return link

    yield directory, plant
    assert victim.read_text() == VICTIM


@pytest.mark.parametrize("write", [
    lambda p: write_atomic(p, "new"),
    lambda p: append_text(p, "more"),
    lambda p: os.close(open_truncate(p)),
])
def test_every_write_primitive_refuses_a_link(planted, write):
    directory, plant = planted
    link = plant("file")
    with pytest.raises(LinkRefused, match=f"{link}: is a symbolic link to"):
        write(link)
    assert isinstance(LinkRefused(link, "x"), ConfigError)  # exit 2


def test_write_atomic_never_opens_a_planted_temporary_name(planted):
    directory, plant = planted
    for name in ("summary.json.part", ".summary.json.part", "summary.json.tmp"):
        plant(name)
    write_atomic(directory / "summary.json", "{}")
    assert (directory / "summary.json").read_text() == "{}" and not (directory / "summary.json").is_symlink()


def test_a_fifo_is_refused_without_blocking_for_reads_and_writes(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def attempt():
        with pytest.raises(UnsafeFile, match="is a FIFO"):
            read_bytes(fifo, 100)
        with pytest.raises(LinkRefused, match="is a FIFO"):
            append_text(fifo, "x")
        done.set()

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(20)
    assert done.is_set(), "a FIFO blocked kiln"


def test_reads_are_bounded_and_refuse_devices_and_links(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 100}))
    with pytest.raises(UnsafeFile, match="more than the 10"):
        read_json(big, 10)
    with pytest.raises(UnsafeFile, match="not a regular file"):
        read_bytes("/dev/zero", 1 << 20, follow=True)
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafeFile, match="symbolic link to /dev/zero"):
        read_bytes(tmp_path / "zero", 1 << 20)
    (tmp_path / "ok").symlink_to(big)
    assert read_json(tmp_path / "ok", 1 << 20, follow=True)["x"].startswith("y")  # followed where asked, and logged


def test_refuse_links_names_the_first_link_anywhere_but_inside_checkpoints(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000004").mkdir(parents=True)
    (run / "checkpoints" / "step_00000004" / "data").symlink_to("/etc/passwd")  # left to the checkpoint checks
    refuse_links(run)
    (run / "tb").mkdir()
    (run / "tb" / "events").symlink_to("/etc/passwd")
    with pytest.raises(LinkRefused, match=f"{run / 'tb' / 'events'}: is a symbolic link to /etc/passwd"):
        refuse_links(run)


def test_writers_refuse_a_link_planted_after_the_run_dir_check(planted):
    """A link that appears mid-run (the lock's scan came earlier) is still never written through."""
    from kiln.compile_cache import save_artifacts  # noqa: F401  (imported: the module writes via safe_io)
    from kiln.monitor.sinks import JsonlSink
    from kiln.monitor.summary import write_summary
    from kiln.train.rundir import trim_metrics

    directory, plant = planted
    with pytest.raises(LinkRefused):
        JsonlSink(plant("metrics.jsonl"))
    with pytest.raises(LinkRefused):
        write_summary(plant("summary.json"), {"status": "running"})
    (directory / "m.jsonl").write_text('{"step": 1}\n{"step": 5}\n')
    trim_metrics(directory / "m.jsonl", 1)
    assert (directory / "m.jsonl").read_text() == '{"step": 1}\n'
    with pytest.raises(LinkRefused):
        trim_metrics(plant("k.jsonl"), 1)


def test_a_failure_report_is_never_appended_through_a_link(planted):
    from kiln.failure.classify import diagnose
    from kiln.failure.report import FailureReport, write_log

    directory, plant = planted
    plant("error.log")
    report = FailureReport(diagnose(RuntimeError("boom")), rank=None, log_dir=directory, exc=None, log_name="error.log")
    write_log(report, ["kiln", "train"])
    assert report.log_path is not None and report.log_path.parent != directory  # a temporary file instead
    assert "error.log is a symbolic link" in report.log_problem
    report.log_path.unlink()


def test_an_output_dir_with_a_planted_lock_link_is_refused(planted):
    from kiln.outputs import claim_output_dir, release_output_dir

    directory, plant = planted
    link = plant(".kiln.lock")
    with pytest.raises(ConfigError, match=f"{link}: is a symbolic link"):
        claim_output_dir(directory)
    release_output_dir(directory)


def test_a_report_is_never_written_through_a_link(planted, capsys):
    from kiln.cli.main import main

    directory, plant = planted
    (directory / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
    link = plant("report.md")
    assert main(["report", str(directory)]) == 2
    assert f"{link}: is a symbolic link" in capsys.readouterr().err


def test_a_hard_link_is_refused_for_appends_and_by_the_scan(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (tmp_path / "run").mkdir()
    os.link(victim, tmp_path / "run" / "metrics.jsonl")
    with pytest.raises(LinkRefused, match="is a hard link"):
        append_text(tmp_path / "run" / "metrics.jsonl", "more")
    with pytest.raises(LinkRefused, match="metrics.jsonl: is a hard link"):
        refuse_links(tmp_path / "run")
    assert victim.read_text() == VICTIM
