"""Failing well, through the CLI as a user meets it: a full disk, a lost permission, a killed
DataLoader worker, a CUDA OOM, host memory. Each ends with exit 1 and a short message (what, where,
what was kept, what to do; no traceback unless --verbose), the traceback in error.log, the newest
complete checkpoint intact and loadable, no partial `.tmp` left, summary.json `failed` with the
error (or the message saying it could not be written)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kiln.checkpoint.export import export_safetensors
from kiln.cli.main import main

BASE = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12", "training.log_interval=2",
    "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false", "checkpoint.interval=4",
]


def _kiln(*args, env=None, preexec_fn=None, cwd=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=full_env,
                          timeout=600, preexec_fn=preexec_fn, cwd=cwd)


def message(err: str) -> list[str]:
    """The failure message: the lines from `kiln: failed` on."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("kiln: failed"))
    return lines[start:]


def assert_failed_cleanly(run_dir: Path, err: str, *, kept: int, needles: list[str], summary: bool = True,
                          verbose: bool = False) -> list[str]:
    msg = message(err)
    text = "\n".join(msg)
    assert 3 <= len(msg) <= 5, err
    assert ("Traceback" in err) == verbose, err
    for needle in [f"checkpoint step {kept} is intact", "resume with `kiln train --config", "to do:", *needles]:
        assert needle in text, (needle, err)
    checkpoints = run_dir / "checkpoints"
    assert not list(checkpoints.glob("*.tmp")), sorted(p.name for p in checkpoints.iterdir())
    assert export_safetensors(run_dir, run_dir.parent / f"{run_dir.name}.safetensors")["step"] == kept
    if summary:
        data = json.loads((run_dir / "summary.json").read_text())
        assert data["status"] == "failed" and data["error"], data
        assert "summary.json records status failed" in text
        assert "Traceback (most recent call last)" in (run_dir / "error.log").read_text()
    else:
        assert not (run_dir / "summary.json").exists()
        assert "summary.json could not be written" in text
    return msg


@pytest.mark.parametrize(("summary_disk", "async_save"), [("ok", False), ("full", False), ("ok", True)],
                         ids=["sync", "sync-summary-full", "async"])
def test_disk_full_inside_a_checkpoint_save(tmp_path, monkeypatch, capsys, summary_disk, async_save):
    import torch.distributed.checkpoint.filesystem as dcp_fs

    real_write = dcp_fs._write_item

    def write_item(transforms, stream, *args, **kwargs):
        if "step_00000008.tmp" in str(getattr(stream, "name", "")):
            stream.write(b"\0" * 100)  # a partial file, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(transforms, stream, *args, **kwargs)

    monkeypatch.setattr(dcp_fs, "_write_item", write_item)
    if summary_disk == "full":
        def no_space(path, summary):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        monkeypatch.setattr("kiln.train.finish.write_summary", no_space)
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), *BASE, f"checkpoint.async_save={str(async_save).lower()}"])
    err = capsys.readouterr().err
    assert code == 1
    msg = assert_failed_cleanly(run_dir, err, kept=4, summary=summary_disk == "ok", needles=[
        "failed saving checkpoint step 8", "disk full", "No space left on device", "step_00000008.tmp) was removed",
        "checkpoint.keep=3", f"df -h {run_dir}", f"traceback in {run_dir / 'error.log'}"])
    assert msg[0].startswith(f"kiln: failed saving checkpoint step 8 ({run_dir / 'checkpoints' / 'step_00000008'})")
    if summary_disk == "ok":
        assert "No space left on device" in json.loads((run_dir / "summary.json").read_text())["error"]


def _tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `path`; returns why not, or None when mounted."""
    if os.geteuid() != 0:
        return "mounting a tiny filesystem needs root"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else f"mount -t tmpfs failed: {proc.stderr.strip()}"


def test_disk_full_on_a_real_tiny_filesystem(tmp_path):
    mnt = tmp_path / "mnt"
    why = _tmpfs(mnt, "2m")  # one checkpoint of this model (~1.1 MB) fits, a second does not
    if why:
        pytest.skip(why)
    try:
        run_dir = mnt / "run"
        proc = _kiln("train", "--run-dir", str(run_dir), *BASE, "model.kwargs.hidden_size=128",
                     "model.kwargs.num_layers=4", "training.steps=20", "checkpoint.interval=4")
        assert proc.returncode == 1, proc.stderr
        assert (run_dir / "checkpoints" / "step_00000004").is_dir(), proc.stderr  # the first one fitted
        assert_failed_cleanly(run_dir, proc.stderr, kept=4, needles=[
            "failed saving checkpoint step 8", "disk full", "was removed"])
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _locking_model(where: Path, lock_at: int) -> str:
    """A model factory whose forward takes write access away from the run dir at optimizer step
    `lock_at` (forward call n is step n: kiln counts FLOPs on a copy of the model, of fake tensors): `chmod` (the run dir and
    checkpoints/ become 0555) or `readonly` (a read-only bind mount over the run dir, as a
    filesystem remounted read-only after errors; files already open keep working)."""
    src = where / "locking_model.py"
    src.write_text(textwrap.dedent(f"""
        import os, subprocess, torch
        class Net(torch.nn.Module):
            def __init__(self, run_dir, how):
                super().__init__()
                self.lin = torch.nn.Linear(8, 4)
                self.run_dir, self.how, self.calls = run_dir, how, 0
            def forward(self, x):
                self.calls += 1
                if self.calls == {lock_at}:
                    if self.how == "chmod":
                        for d in (self.run_dir, os.path.join(self.run_dir, "checkpoints")):
                            os.chmod(d, 0o555)
                    else:
                        subprocess.run(["mount", "--bind", self.run_dir, self.run_dir], check=True)
                        subprocess.run(["mount", "-o", "remount,bind,ro", self.run_dir], check=True)
                return self.lin(x)
        def make(run_dir, how):
            return Net(run_dir, how), {{"kind": "features", "shape": (8,), "num_classes": 4}}
    """))
    src.chmod(0o644)
    return str(src)


def _readable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IROTH and p.stat().st_mode & stat.S_IXOTH
               for p in [path, *path.parents] if p.is_dir())


def _unprivileged():
    """(preexec_fn, None) to run a command without root's power over file modes, or (None, why not)."""
    if os.geteuid() != 0:
        return None, None
    for needed in (Path(os.path.realpath(sys.executable)).parent, Path(__file__).resolve().parents[2] / "src"):
        if not _readable_by_others(needed):
            return None, f"root ignores file modes, and an unprivileged user cannot read {needed}"

    def drop():
        os.setgid(65534)
        os.setuid(65534)

    return drop, None


@pytest.mark.parametrize("how", ["chmod", "readonly"])
def test_permission_lost_on_the_run_dir(how):
    """Write access to the run dir goes away at step 6; the save at step 8 fails. Neither
    summary.json nor error.log can be written there: the message says so and names the log file
    it wrote instead."""
    preexec = None
    if how == "chmod":
        preexec, why = _unprivileged()
    else:
        why = None if os.geteuid() == 0 and shutil.which("mount") else "a read-only bind mount needs root"
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="kiln-perm-"))
    run_dir = base / "run"
    try:
        base.chmod(0o777)
        over = [o for o in BASE if not o.startswith("model.kwargs")]
        proc = _kiln("train", "--run-dir", str(run_dir), *over, f"model.name={_locking_model(base, 6)}:make",
                     f"model.kwargs.run_dir={run_dir}", f"model.kwargs.how={how}", env={"HOME": str(base)},
                     preexec_fn=preexec, cwd=base)
        assert proc.returncode == 1, proc.stderr
        if how == "readonly":
            subprocess.run(["umount", str(run_dir)], check=True)
        for d in (run_dir, run_dir / "checkpoints"):
            d.chmod(0o755)  # as the owner would, to look inside
        what = "permission denied" if how == "chmod" else "the filesystem is read-only"
        msg = assert_failed_cleanly(run_dir, proc.stderr, kept=4, summary=False, needles=[
            "failed saving checkpoint step 8", what, f"ls -ld {run_dir}", f"{run_dir} is not writable"])
        log = Path(next(w for w in " ".join(msg).split() if "kiln-error-" in w))
        assert "Traceback (most recent call last)" in log.read_text()
        log.unlink()
    finally:
        if how == "readonly":
            subprocess.run(["umount", str(run_dir)], check=False, capture_output=True)
        for d in (run_dir, run_dir / "checkpoints"):
            with contextlib.suppress(OSError):
                d.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_permission_lost_patched(tmp_path, monkeypatch, capsys):
    """The same through patched calls, for machines where neither real variant can run."""
    import pathlib

    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == "step_00000008.tmp":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    def no_access(path, summary):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr("kiln.train.finish.write_summary", no_access)
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), *BASE]) == 1
    monkeypatch.undo()
    assert_failed_cleanly(run_dir, capsys.readouterr().err, kept=4, summary=False, needles=[
        "failed saving checkpoint step 8", "permission denied", "step_00000008.tmp"])


def test_a_killed_dataloader_worker(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((512, 32)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.random.default_rng(1).integers(0, 4, 512))
    run_dir = tmp_path / "run"
    # Many steps: the loader notices the dead worker a few batches later at most.
    proc = _kiln("train", "--run-dir", str(run_dir), *BASE, "training.steps=5000", "data.source=files",
                 f"data.path={tmp_path / 'x.npy'}", f"data.labels_path={tmp_path / 'y.npy'}", "data.num_workers=2",
                 env={"KILN_FAULT": "kill-worker@6"})
    assert proc.returncode == 1, proc.stderr
    msg = assert_failed_cleanly(run_dir, proc.stderr, kept=4, needles=["DataLoader worker", "data.num_workers (now 2)"])
    # The fault (at the end of step 6) waits for the death, so torch's SIGCHLD handler raises there.
    assert msg[0].startswith("kiln: failed in step 6: a DataLoader worker was killed"), msg[0]


def test_a_dead_worker_that_interrupts_a_checkpoint_save_is_not_blamed_on_the_save(tmp_path):
    # The worker's death arrives by SIGCHLD wherever the main thread is; when that is a checkpoint
    # save, the save is where the news surfaced, not what failed (seen under CI load).
    from kiln.checkpoint.storage import CheckpointSaveError
    from kiln.failure.classify import diagnose
    from kiln.train.failure import where_it_failed

    try:
        try:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
        except RuntimeError as worker:
            raise CheckpointSaveError(8, tmp_path / "step_00000008", worker) from worker
    except CheckpointSaveError as exc:
        err = exc
    assert diagnose(err).kind == "worker_killed"
    assert where_it_failed(err, 8, 8, asynchronous=True) == "after step 8 (it interrupted saving checkpoint step 8)"
    disk = CheckpointSaveError(8, tmp_path / "step_00000008", OSError(errno.ENOSPC, "No space left on device"))
    assert where_it_failed(disk, 8, 8).startswith("saving checkpoint step 8 (")


@pytest.mark.parametrize("verbose", [False, True])
def test_cuda_out_of_memory_in_the_step(tmp_path, monkeypatch, capsys, verbose):
    monkeypatch.setenv("KILN_FAULT", "cuda-oom@6")
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), *(["--verbose"] if verbose else []), *BASE])
    err = capsys.readouterr().err
    assert code == 1
    msg = assert_failed_cleanly(run_dir, err, kept=4, verbose=verbose, needles=[
        "failed in step 6: CUDA out of memory", "data.batch_size=4 training.grad_accum_steps=2",
        "distributed.strategy=fsdp", "traceback above and in" if verbose else "traceback in"])
    assert len(msg) == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5 and "OutOfMemoryError" in summary["error"]
    assert "CUDA memory summary" in (run_dir / "error.log").read_text()


def test_host_out_of_memory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_FAULT", "host-oom@6")
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), *BASE]) == 1
    assert_failed_cleanly(run_dir, capsys.readouterr().err, kept=4,
                          needles=["failed in step 6: out of host memory (MemoryError", "data.batch_size"])


def test_the_message_is_out_before_the_process_group_is_left(tmp_path, monkeypatch, capsys):
    """Leaving the group frees the peers blocked in a collective, and torchrun stops a rank once a
    peer has exited: kiln train prints and publishes its report first, then leaves."""
    import kiln.failure
    import kiln.train.trainer

    events = []
    emit = kiln.failure.emit
    monkeypatch.setattr(kiln.failure, "emit", lambda *a, **k: (events.append("message"), emit(*a, **k)))
    monkeypatch.setattr(kiln.train.trainer, "destroy_process_group", lambda: events.append("leave group"))
    monkeypatch.setenv("KILN_FAULT", "host-oom@6")
    assert main(["train", "--run-dir", str(tmp_path / "run"), *BASE]) == 1
    assert "failed in step 6" in capsys.readouterr().err
    assert events == ["message", "leave group"]


def test_the_printed_resume_command_continues_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_FAULT", "host-oom@6")
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), *BASE]) == 1
    resume = message(capsys.readouterr().err)[1].split("resume with `")[1].rstrip("`")
    monkeypatch.delenv("KILN_FAULT")
    args = shlex.split(resume)[1:]  # as printed, minus the program name
    assert args[:3] == ["train", "--config", str(run_dir / "config.toml")]
    assert main(args) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000004")


EXITING_FACTORY = """
import sys
import torch
from kiln.models.spec import InputSpec

class Quitter(torch.nn.Linear):
    def forward(self, x):
        if WHEN == "step":
            sys.exit(0)
        return super().forward(x)

def build():
    if WHEN == "build":
        sys.exit(0)
    return Quitter(8, 4), InputSpec("features", (8,), num_classes=4)
"""


@pytest.mark.parametrize("when", ["build", "step"])
def test_a_factory_calling_sys_exit_is_an_error_not_success(tmp_path, when):
    import subprocess
    import sys

    (tmp_path / "quit.py").write_text(f"WHEN = {when!r}\n" + EXITING_FACTORY)
    run = subprocess.run([sys.executable, "-m", "kiln", "train", "--run-dir", str(tmp_path / "run"),
                          f"model.name={tmp_path / 'quit.py'}:build", "training.steps=3", "training.device=cpu",
                          "metrics.console=false", "metrics.tensorboard=false", "metrics.mfu=false"],
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == (2 if when == "build" else 1), run.stderr[-2000:]
    assert "sys.exit(0)" in run.stderr
