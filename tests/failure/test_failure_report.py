"""diagnose(): each kind of failure, found through the wrappers it arrives in; the report's lines
and its log file (with a fallback when the run's directory is not writable)."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from kiln.checkpoint import CheckpointSaveError
from kiln.checkpoint.nonfinite import NonFiniteError
from kiln.failure import FailureReport, diagnose, emit, generic_report, short_error

CFG = SimpleNamespace(data=SimpleNamespace(batch_size=32, num_workers=4, source="files"),
                      training=SimpleNamespace(grad_accum_steps=1), precision=SimpleNamespace(policy="fp32"),
                      checkpoint=SimpleNamespace(keep=3))


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as e:
        return e


def _dcp(inner: BaseException) -> CheckpointException:
    """What dcp.save raises on every rank when rank 1's write failed."""
    return CheckpointException("write", {1: (inner, None)})


@pytest.mark.parametrize(("exc", "kind", "what"), [
    (OSError(errno.ENOSPC, "No space left on device", "/r/metrics.jsonl"), "disk_full", "disk full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full", "disk quota exceeded"),
    (PermissionError(errno.EACCES, "Permission denied", "/r/summary.json"), "no_access", "permission denied"),
    (OSError(errno.EROFS, "Read-only file system"), "no_access", "the filesystem is read-only"),
    (RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed. "), "worker_killed",
     "a DataLoader worker was killed (SIGKILL)"),
    (RuntimeError("DataLoader worker (pid 9) is killed by signal: Bus error. "), "worker_killed",
     "a DataLoader worker was killed (SIGBUS)"),
    (RuntimeError("DataLoader worker (pid(s) 4, 5) exited unexpectedly"), "worker_killed",
     "a DataLoader worker exited unexpectedly"),
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "cuda_oom", "CUDA out of memory"),
    (MemoryError(), "host_oom", "out of host memory"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), "host_oom",
     "out of host memory"),
    (NonFiniteError(5, "non-finite loss or gradient norm at step 5"), "nonfinite", "non-finite loss or gradient"),
    (RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5. This is typically "
                  "caused by a remote worker crashing."), "peer_lost", "lost contact with another rank"),
    (RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation"),
     "collective_timeout", "a collective timed out"),
    (ValueError("bad shape in my_model.py"), "error", "error"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), "error", "error"),  # stdout piped into `head`: no peer
])
def test_diagnose_kinds(exc, kind, what):
    d = diagnose(_raised(exc), cfg=CFG, run_dir="/r")
    assert (d.kind, d.what) == (kind, what)
    assert d.detail.startswith(type(exc).__name__) and len(d.detail) <= 240 and "\n" not in d.detail
    assert d.advice
    assert d.secondary == (kind == "peer_lost")
    assert "pair.cc" not in d.detail and "typically caused" not in d.detail


def test_advice_uses_the_runs_settings():
    oom = diagnose(torch.cuda.OutOfMemoryError("CUDA out of memory"), cfg=CFG)
    assert "now 32" in oom.advice and "data.batch_size=16 training.grad_accum_steps=2" in oom.advice
    assert "precision.policy=bf16-mixed" in oom.advice
    full = diagnose(OSError(errno.ENOSPC, "No space left on device"), cfg=CFG, run_dir="/data/run")
    assert "checkpoint.keep=3" in full.advice and "df -h /data/run" in full.advice
    assert "data.num_workers (now 4)" in diagnose(MemoryError(), cfg=CFG).advice


def test_the_cause_is_found_through_dcp_and_kiln_wrappers(tmp_path):
    inner = _raised(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
                    OSError(errno.ENOSPC, "No space left on device"))
    dcp_error = _dcp(inner)
    wrapped = _raised(CheckpointSaveError(8, tmp_path / "step_00000008", dcp_error), dcp_error)
    d = diagnose(wrapped)
    assert d.kind == "disk_full" and d.detail == "OSError: [Errno 28] No space left on device"
    assert "failed: OSError: [Errno 28] No space left on device" in str(wrapped)
    # Without any errno, the storage's verdict decides.
    probe = OSError(errno.EACCES, "Permission denied", str(tmp_path))
    blind = CheckpointSaveError(8, tmp_path / "s", _dcp(RuntimeError("unexpected pos 1 vs 2")), storage=probe)
    assert diagnose(blind).kind == "no_access"
    # A generic error names the error, not DCP's wrapper with every rank's traceback.
    generic = diagnose(CheckpointSaveError(8, tmp_path / "s", _dcp(ValueError("bad state"))))
    assert generic.kind == "error" and generic.detail == "ValueError: bad state"


def test_short_error():
    assert short_error(MemoryError()) == "MemoryError"
    assert short_error(ValueError("a\nb")) == "ValueError: a"
    assert len(short_error(ValueError("x" * 1000), 50)) == 50


def _report(tmp_path: Path, **kw) -> FailureReport:
    return FailureReport(diagnose(_raised(MemoryError("boom")), cfg=CFG), where="in step 7", step=7,
                         kept="checkpoint step 4 is intact (r/checkpoints/step_00000004)", resume="kiln train ...",
                         summary="records status failed and the error", log_dir=tmp_path,
                         exc=_raised(MemoryError("boom")), **kw)


def test_report_lines_and_log(tmp_path, capsys):
    report = _report(tmp_path, notes=["while closing the metric sinks after the failure:\nOSError: nope"])
    emit(report)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines == [
        "kiln: failed in step 7: out of host memory (MemoryError: boom)",
        "kiln: kept: checkpoint step 4 is intact (r/checkpoints/step_00000004); resume with `kiln train ...`",
        f"kiln: summary.json records status failed and the error; traceback in {tmp_path / 'error.log'}",
        f"kiln: to do: {report.diagnosis.advice}",
    ]
    log = (tmp_path / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "MemoryError: boom" in log and "OSError: nope" in log
    emit(_report(tmp_path))  # a second failure appends
    assert (tmp_path / "error.log").read_text().count("==== kiln failed") == 2


def test_modes_and_rank_prefix(tmp_path, capsys):
    report = _report(tmp_path, rank=3)
    report.log_name = "error.rank3.log"
    emit(report, mode="brief")
    line = capsys.readouterr().err.strip()
    assert line.startswith("kiln[rank 3]: failed in step 7: out of host memory") and "\n" not in line
    assert line.endswith(f"traceback in {tmp_path / 'error.rank3.log'}")
    emit(report, mode="quiet")
    assert capsys.readouterr().err == ""
    emit(report, verbose=True)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and "traceback above and in" in err


def test_log_falls_back_to_a_temporary_file(tmp_path, monkeypatch, capsys):
    import kiln.failure.report as report_module

    def no_access(path, text):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(report_module, "append_text", no_access)
    report = _report(tmp_path)
    emit(report)
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert report.log_path is not None and report.log_path.name.startswith("kiln-error-")
    assert f"traceback in {report.log_path} ({tmp_path} is not writable: Permission denied)" in err
    assert "MemoryError: boom" in report.log_path.read_text()
    report.log_path.unlink()


def test_generic_report_names_the_rank_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    report = generic_report(_raised(OSError(errno.ENOSPC, "No space left on device")), output_dir=tmp_path)
    assert report.rank == 2 and report.log_name == "error.rank2.log" and report.diagnosis.kind == "disk_full"
    monkeypatch.delenv("RANK")
    assert generic_report(_raised(ValueError("x"))).rank is None


def test_a_damaged_records_line_names_the_file_and_line_not_the_users_code():
    from kiln.monitor.records import BrokenRecordsError

    path = Path("/runs/a b/metrics.jsonl")
    wrapped = RuntimeError("resume failed")
    wrapped.__cause__ = BrokenRecordsError(f"{path}:7 is not a JSON record (x)", path=path, line=7)
    d = diagnose(wrapped, cfg=CFG)
    assert (d.kind, d.what, d.path) == ("broken_records", "line 7 of metrics.jsonl is damaged", str(path))
    assert "head -n 6 '/runs/a b/metrics.jsonl'" in d.advice and "mv '/runs/a b/metrics.jsonl'" in d.advice
    assert "your model" not in d.advice
    assert diagnose(BrokenRecordsError("x.jsonl:3 is not a JSON record")).kind == "broken_records"
