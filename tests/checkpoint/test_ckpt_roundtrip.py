"""Save/load exactness, atomicity, retention and resume resolution (one process, CPU)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from kiln.checkpoint import AppState, CheckpointSaveError, dcp_io
from kiln.checkpoint.layout import MARKER, latest_complete, read_marker
from kiln.errors import ConfigError

from .ckpt_helpers import assert_bitwise_equal, checkpointer, make_run, seed_all, snapshot


# DCP's background save thread warns that it assumes one process (kiln silences it elsewhere).
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize(("async_save", "threads"), [(False, 1), (True, 1), (True, 3)],
                         ids=["sync", "async", "async-3-writers"])
def test_resume_continues_bitwise_identically(tmp_path: Path, async_save: bool, threads: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcp_io, "THREAD_BYTES", 1)  # every thread gets a file, however small the state
    seed_all(0)
    run = make_run(seed=0)
    ck = checkpointer(tmp_path, async_save=async_save, writer_threads=threads)
    for _ in range(3):
        run.step()
    ck.save(3, run.app)  # async: returns once staged; the steps below must not leak into it
    for _ in range(4):
        run.step()
    ck.wait()
    # one data file per writer thread, each listed with its checksum in the completion marker
    saved = latest_complete(tmp_path / "checkpoints")
    assert len(list(saved.glob("*.distcp"))) == threads
    assert sorted(read_marker(saved)["files"]) == sorted(p.name for p in saved.iterdir() if p.name != MARKER)
    expected = snapshot(run.model, run.optimizer)
    expected_lr = run.scheduler.get_last_lr()
    expected_draws = (torch.rand(3), run.data.state_dict())

    seed_all(123)  # a different start everywhere: the load must overwrite all of it
    resumed = make_run(seed=7)
    report = ck.load(ck.resolve_resume("auto"), resumed.app)
    assert report.step == 3 and report.notes == []
    assert resumed.app.progress["step"] == 3 and resumed.app.progress["samples_seen"] == 24
    for _ in range(4):
        resumed.step()
    assert_bitwise_equal(snapshot(resumed.model, resumed.optimizer), expected)
    assert resumed.scheduler.get_last_lr() == expected_lr
    assert torch.equal(torch.rand(3), expected_draws[0])
    assert resumed.data.state_dict() == expected_draws[1]


def test_writer_threads_follow_the_rank_s_bytes() -> None:
    """One thread per THREAD_BYTES of a rank's tensors, rounded up, at least one, at most the key."""
    mib = 1 << 20
    assert dcp_io.THREAD_BYTES == 256 * mib
    assert [dcp_io.writer_threads(8, n) for n in (0, 1, 256 * mib, 256 * mib + 1, 1000 * mib, 10 ** 12)] == \
        [1, 1, 1, 2, 4, 8]
    assert dcp_io.writer_threads(1, 10 ** 12) == 1


def test_a_small_state_is_one_file_per_rank_with_the_default_threads(tmp_path: Path) -> None:
    """checkpoint.writer_threads=8 (the default) on a state of kilobytes: one data file, not eight."""
    run = make_run()
    ck = checkpointer(tmp_path, writer_threads=8)
    run.step()
    ck.save(1, run.app)
    ck.wait()
    assert [p.name for p in latest_complete(tmp_path / "checkpoints").glob("*.distcp")] == ["__0_0.distcp"]


def test_keep_newest_k_and_never_touch_tmp(tmp_path: Path) -> None:
    run = make_run()
    ck = checkpointer(tmp_path, keep=2)
    stale = tmp_path / "checkpoints" / "step_00000099.tmp"
    stale.mkdir(parents=True)
    for step in range(1, 6):
        run.step()
        ck.save(step, run.app)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_00000004", "step_00000005", "step_00000099.tmp"]
    # Saving the same step twice (interval save on the last step, then the final save) is one save.
    assert ck.save(5, run.app, final=True) == tmp_path / "checkpoints" / "step_00000005"


def test_the_checkpoint_just_written_is_kept_even_if_older_ones_have_higher_steps(tmp_path: Path) -> None:
    run = make_run()
    checkpointer(tmp_path).save(10, run.app)
    checkpointer(tmp_path, keep=1).save(5, run.app)  # resumed from an earlier checkpoint
    assert (tmp_path / "checkpoints" / "step_00000005" / MARKER).is_file()


def test_failed_save_removes_its_partial_dir_and_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    run = make_run()
    ck = checkpointer(tmp_path)
    run.step()
    ck.save(1, run.app)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints" / "step_00000001").iterdir()}
    real_save = dcp.save

    def save_then_fail(*args, **kwargs):
        real_save(*args, **kwargs)  # every data file and .metadata written, no marker yet
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", save_then_fail)
    run.step()
    with pytest.raises(CheckpointSaveError, match=r"step 2 to .*step_00000002 failed: OSError: \[Errno 28\]") as info:
        ck.save(2, run.app)
    assert info.value.step == 2 and isinstance(info.value.cause, OSError)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001"]
    assert ck.removed_partial == [tmp_path / "checkpoints" / "step_00000002.tmp"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints" / "step_00000001").iterdir()} == before
    assert checkpointer(tmp_path).resolve_resume("auto").name == "step_00000001"
    ck.save(2, run.app)  # the same step saves fine once the storage is back
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000002"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_failed_writer_thread_fails_the_save_quietly(tmp_path: Path, monkeypatch, capfd, async_save: bool) -> None:
    """With several writer threads, one extra thread's write fails (disk full) while the others
    succeed: the save fails as a full disk, nothing is printed from the thread, and the previous
    checkpoint stays the newest (DCP alone completes the checkpoint without that thread's items)."""
    import threading

    from torch.distributed.checkpoint.filesystem import FileSystem

    monkeypatch.setattr(dcp_io, "THREAD_BYTES", 1)  # three writer threads for this small state
    run = make_run()
    ck = checkpointer(tmp_path, writer_threads=3, async_save=async_save)
    run.step()
    ck.save(1, run.app)
    ck.wait()
    real_stream, calls = FileSystem.create_stream, []

    def create_stream(self, path, mode):
        first_writer = "_write_files_from_queue" in threading.current_thread().name and not calls
        calls.append(path)
        if first_writer:  # one of the writer threads DCP starts beside the saving one
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_stream(self, path, mode)

    monkeypatch.setattr(FileSystem, "create_stream", create_stream)
    run.step()
    with pytest.raises(CheckpointSaveError, match=r"Errno 28"):
        ck.save(2, run.app)
        ck.wait()
    monkeypatch.undo()
    assert "Traceback" not in capfd.readouterr().err
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000001"


def test_failed_save_without_errno_asks_the_storage(tmp_path: Path, monkeypatch) -> None:
    """torch.save reports a full disk as `enforce fail ... unexpected pos`: the storage says why."""
    import kiln.checkpoint.storage as storage

    run = make_run()
    ck = checkpointer(tmp_path)

    def enforce_fail(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(dcp, "save", enforce_fail)
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(6 << 20, 6 << 20, 4096))
    with pytest.raises(CheckpointSaveError, match=r"No space left on device \(4\.0 KiB free of 6\.0 MiB\)") as info:
        ck.save(1, run.app)
    assert info.value.storage.errno == errno.ENOSPC
    assert not (tmp_path / "checkpoints" / "step_00000001.tmp").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_async_save_failure_surfaces_in_wait(tmp_path: Path, monkeypatch) -> None:
    import kiln.checkpoint.manager as manager

    run = make_run()
    ck = checkpointer(tmp_path, async_save=True)
    ck.save(1, run.app)
    ck.wait()

    def no_marker(path, data, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(manager, "write_json", no_marker)
    ck.save(2, run.app)  # returns at once; the failure happens in the background
    with pytest.raises(CheckpointSaveError, match="checkpoint save of step 2 .* failed: OSError: no space left"):
        ck.wait()
    assert ck.resolve_resume("auto").name == "step_00000001"
    assert not (tmp_path / "checkpoints" / "step_00000002.tmp").exists()  # removed in the background


def test_process_killed_mid_save_leaves_previous_checkpoint_latest(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch.distributed.checkpoint as dcp
        from ckpt_helpers import checkpointer, make_run
        run = make_run()
        ck = checkpointer({str(tmp_path)!r})
        run.step(); ck.save(1, run.app)
        real = dcp.save
        def killed(*a, **k):
            real(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)
        dcp.save = killed
        run.step(); ck.save(2, run.app)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (tmp_path / "checkpoints" / "step_00000002.tmp" / ".metadata").is_file()
    assert checkpointer(tmp_path).resolve_resume("auto").name == "step_00000001"
    # Saving that step again replaces the leftover; the failure path sweeps any other.
    run = make_run()
    ck = checkpointer(tmp_path)
    ck.save(2, run.app)
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000002"
    (tmp_path / "checkpoints" / "step_00000003.tmp").mkdir()
    assert ck.remove_partial() == [tmp_path / "checkpoints" / "step_00000003.tmp"]


def test_resolve_resume(tmp_path: Path) -> None:
    ck = checkpointer(tmp_path)
    assert ck.resolve_resume("never") is None
    assert ck.resolve_resume("auto") is None
    run = make_run()
    saved = ck.save(1, run.app)
    assert ck.resolve_resume("never") is None
    assert ck.resolve_resume("auto") == saved
    assert ck.resolve_resume(str(saved)) == saved
    with pytest.raises(ConfigError, match=r"checkpoint\.resume: .*nope: does not exist"):
        ck.resolve_resume(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"is a run directory; give one of its checkpoints \(newest complete: .*step_00000001\)"):
        ck.resolve_resume(str(tmp_path))
    (saved / MARKER).unlink()  # no marker: not complete
    with pytest.raises(ConfigError, match=r"step_00000001: not a complete kiln checkpoint: no valid completion"):
        ck.resolve_resume(str(saved))
    assert ck.resolve_resume("auto") is None


def test_truncated_data_file_is_skipped(tmp_path: Path, caplog) -> None:
    run = make_run()
    ck = checkpointer(tmp_path)
    first = ck.save(1, run.app)
    second = ck.save(2, run.app)
    data_file = next(second.glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="kiln.checkpoint"):
        assert ck.resolve_resume("auto") == first
    assert f"skipping checkpoint {second}: data file {data_file.name} is truncated" in caplog.text


def test_mismatch_names_path_and_keys_and_modifies_nothing(tmp_path: Path) -> None:
    run = make_run()
    run.step()
    saved = checkpointer(tmp_path).save(1, run.app)
    files_before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    other = make_run(seed=3)
    other.model[3] = torch.nn.Linear(16, 5)  # shape mismatch
    other.model.add_module("extra", torch.nn.Linear(2, 2))  # missing from the checkpoint
    other.optimizer = torch.optim.AdamW(other.model.parameters())
    other.app.model, other.app.optimizer = other.model, other.optimizer
    model_before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        checkpointer(tmp_path).load(saved, other.app)
    message = str(info.value)
    assert message.startswith(f"checkpoint.resume: {saved}: checkpoint does not match the model")
    assert "missing extra.bias, extra.weight" in message
    assert "shape 3.bias [3] in checkpoint vs [5] in model" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files_before
    assert all(torch.equal(v, model_before[k]) for k, v in other.model.state_dict().items())

    fewer = make_run(seed=3)
    fewer.model[3] = torch.nn.Identity()  # the checkpoint has keys this model lacks
    with pytest.raises(ConfigError, match=r"unexpected 3\.bias, 3\.weight"):
        checkpointer(tmp_path).load(saved, fewer.app)


def test_other_optimizer_is_a_mismatch(tmp_path: Path) -> None:
    run = make_run()
    run.step()
    saved = checkpointer(tmp_path).save(1, run.app)
    other = make_run()
    other.app.optimizer = torch.optim.SGD(other.model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ConfigError, match=r"does not match the optimizer: missing state\.0\.bias\.momentum_buffer"):
        checkpointer(tmp_path).load(saved, other.app)


def test_load_never_unpickles_code(tmp_path: Path, monkeypatch) -> None:
    run = make_run()
    run.step()
    saved = checkpointer(tmp_path).save(1, run.app)

    real_load = torch.load
    calls = []

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    checkpointer(tmp_path).load(saved, make_run().app)
    assert calls and all(flag is True for flag in calls)
    monkeypatch.undo()

    # A crafted .metadata that would run code when unpickled is refused, and does not run.
    witness = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {witness}",))

    import pickle

    (saved / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ConfigError, match=r"refers to posix\.system|refers to os\.system"):
        checkpointer(tmp_path).resolve_resume(str(saved))
    assert checkpointer(tmp_path).resolve_resume("auto") is None
    assert not witness.exists()


def test_resuming_fp32_masters_under_another_optimizer_says_they_are_not_loaded(tmp_path: Path, caplog) -> None:
    """A bf16-master checkpoint resumed with another precision policy's optimizer: its fp32 masters
    have no place there; the resume says so instead of dropping them silently."""
    from kiln.train.master_adamw import MasterAdamW

    def app(optimizer_cls, **kw):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4).to(torch.bfloat16)
        optimizer = optimizer_cls(model.parameters(), lr=0.1, **kw)
        model(torch.ones(2, 4, dtype=torch.bfloat16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        return AppState(model, optimizer)

    path = checkpointer(tmp_path).save(1, app(MasterAdamW, use_kernel=False))
    same = checkpointer(tmp_path).load(path, app(MasterAdamW, use_kernel=False))
    assert not any("not loaded" in note for note in same.notes)
    other = checkpointer(tmp_path).load(path, app(torch.optim.AdamW))
    assert any("optimizer state master is not used" in note and "precision.policy=bf16-master" in note
               for note in other.notes), other.notes


def test_app_state_is_a_dcp_stateful_and_the_launcher_imports_no_dcp() -> None:
    """AppState is a DCP Stateful by its methods (DCP checks the runtime protocol), so kiln's modules
    import torch.distributed.checkpoint, and DTensor and sympy with it, only when a state is made or
    read: the process that launches the ranks, and any command that never touches a checkpoint,
    starts without that second."""
    from torch.distributed.checkpoint.stateful import Stateful

    assert isinstance(make_run(seed=0).app, Stateful)
    code = ("import sys, kiln.train.command, kiln.checkpoint.export\n"
            "print(sorted(m for m in ('torch.distributed.checkpoint', 'torch.distributed.tensor', 'sympy')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
