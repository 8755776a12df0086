"""kiln.outputs: the advisory lock on a run or output directory, and claiming an output dir."""

from __future__ import annotations

import os

import pytest

from kiln.errors import ConfigError
from kiln.outputs import LOCK_ENV, LOCK_FILE, RunDirLock, held_for_me, lock_holder


def test_the_lock_names_its_holder_and_goes_with_release(tmp_path):
    run = tmp_path / "run"
    assert lock_holder(tmp_path) is None  # a free dir: no holder, nothing written
    assert list(tmp_path.iterdir()) == []
    lock = RunDirLock(run).acquire()
    assert lock.held and lock.created
    assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(ConfigError, match=f"in use by a running kiln process \\(pid {os.getpid()}\\)") as err:
        RunDirLock(run).acquire()
    assert err.value.key == "--run-dir"
    lock.release(remove_if_created=True)
    assert not lock.held and not run.exists()  # created for the lock, left empty: removed again


def test_release_keeps_a_dir_that_holds_files(tmp_path):
    with RunDirLock(tmp_path / "run") as lock:
        (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    lock.release(remove_if_created=True)  # a second release does nothing
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["metrics.jsonl"]


def test_released_on_error_undoes_the_lock_only_when_the_block_raises(tmp_path):
    lock = RunDirLock(tmp_path / "run")
    with lock.released_on_error():
        lock.acquire()
    assert lock.held  # no error: still held
    lock.release()
    lock = RunDirLock(tmp_path / "other")
    with pytest.raises(ValueError), lock.released_on_error():
        lock.acquire()
        raise ValueError("bad input")
    assert not lock.held and not (tmp_path / "other").exists()  # created for the lock: removed again


def test_a_launcher_holds_the_lock_for_its_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, f"{os.getpid()}:{tmp_path}")
    assert not held_for_me(tmp_path)  # named, but nobody holds it
    with RunDirLock(tmp_path):
        assert held_for_me(tmp_path)
        monkeypatch.setenv(LOCK_ENV, f"{os.getpid() + 1}:{tmp_path}")
        assert not held_for_me(tmp_path)  # held, but not by the launcher named
    monkeypatch.delenv(LOCK_ENV)
    assert not held_for_me(tmp_path)


def test_a_rank_acquires_under_its_launchers_lock(tmp_path, monkeypatch):
    with RunDirLock(tmp_path):  # the launcher's lock (this process stands in for it)
        monkeypatch.setenv(LOCK_ENV, f"{os.getpid()}:{tmp_path}")
        rank = RunDirLock(tmp_path).acquire()
        assert not rank.held  # its launcher holds it for it: not taken again, no error
        monkeypatch.setenv(LOCK_ENV, f"{os.getpid() + 1}:{tmp_path}")
        with pytest.raises(ConfigError, match="in use by a running kiln process"):
            RunDirLock(tmp_path).acquire()  # held, but not by the launcher named


def test_held_by_another_counts_only_other_processes(tmp_path):
    from kiln.outputs import held_by_another

    nested = tmp_path / "run" / "exports" / "model.safetensors"
    assert held_by_another(nested) is None  # nobody holds anything
    with RunDirLock(tmp_path / "run"):
        assert held_by_another(nested) is None  # this process's own run dir is its to write
    (tmp_path / "run" / LOCK_FILE).write_text("12345\n")  # a note left by a killed holder: no lock
    assert held_by_another(nested) is None
