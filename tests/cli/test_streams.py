"""Output trouble never stops the work: a closed pipe ends the writing, the command goes on."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys

import pytest

from kiln.cli.streams import GuardedStream, guarded_output


class _Broken(io.StringIO):
    def __init__(self, err: int) -> None:
        super().__init__()
        self.err = err

    def write(self, text: str) -> int:
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize("err", [errno.EPIPE, errno.EIO], ids=["broken-pipe", "terminal-gone"])
def test_a_closed_reader_stops_the_writing_not_the_program(err):
    stream = GuardedStream(_Broken(err), "stdout")
    assert stream.write("step 1\n") == len("step 1\n")
    assert stream.closed_reader
    stream.write("step 2\n")  # dropped, no error
    stream.flush()


def test_other_errors_still_raise():
    with pytest.raises(OSError):
        GuardedStream(_Broken(errno.ENOSPC), "stdout").write("x")


def test_the_streams_are_restored_after():
    before = sys.stdout, sys.stderr
    with guarded_output():
        assert isinstance(sys.stdout, GuardedStream) and isinstance(sys.stderr, GuardedStream)
    assert (sys.stdout, sys.stderr) == before


def test_training_completes_when_its_output_pipe_closes_mid_run(tmp_path, tiny_overrides):
    """`kiln train ... | head -1`: the reader goes away after the first line; training runs to its
    last step and exits 0, metrics.jsonl and summary.json keep everything."""
    run_dir = tmp_path / "run"
    over = [o for o in tiny_overrides if not o.startswith(("training.steps", "training.log_interval",
                                                            "metrics.console"))]
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir), *over,
                             "training.steps=60", "training.log_interval=1", "checkpoint.interval=0"],
                            stdout=write, stderr=write, env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        reader.readline()  # one line of output, then the reader is gone: every later write gets EPIPE
    assert proc.wait(timeout=240) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 60
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 60
