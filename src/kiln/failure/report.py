"""The failure message a user reads, and the log file that keeps the full story.

A failure while running ends with a few lines on stderr: what failed and where, what was kept
(and how to resume), whether summary.json records it, where the traceback went, what to do. The
traceback (every chained error, DCP's per-rank traces, errors met while cleaning up) goes to a log
file in the run's directory (`error.log`; `error.rank<N>.log` for a rank of a torchrun job), or to a
temporary file, named in the message, when that directory is not writable. `--verbose` also prints
it on stderr.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kiln.failure.classify import Diagnosis, diagnose, reason
from kiln.safe_io import LinkRefused, append_text


@dataclass
class FailureReport:
    diagnosis: Diagnosis
    where: str = ""
    """"in step 7", "saving checkpoint step 10 (path)", "before step 1"; empty when unknown."""
    rank: int | None = None
    """The failing rank in a job of several processes; None for one process."""
    step: int | None = None
    kept: str | None = None
    """What survived: "checkpoint step 5 is intact (path)"; None when nothing is worth saying."""
    resume: str | None = None
    """The command that continues the run, when there is something to continue from."""
    summary: str | None = None
    """"records status failed and the error" or why summary.json could not be written."""
    log_dir: Path | None = None
    """Where the log belongs (run or output directory); None or unwritable: a temporary file."""
    log_name: str = "error.log"
    exc: BaseException | None = None
    removed: list[Path] = field(default_factory=list)
    """Partial checkpoint directories of failed saves that were removed."""
    notes: list[str] = field(default_factory=list)
    """Extra text for the log only: errors met while cleaning up, memory summaries."""
    log_path: Path | None = None
    log_problem: str | None = None
    time: float = field(default_factory=time.time)
    """When the failure was caught (orders the ranks' failures)."""

    @property
    def prefix(self) -> str:
        return "kiln" if self.rank is None else f"kiln[rank {self.rank}]"

    def headline(self) -> str:
        d = self.diagnosis
        where = f" {self.where}" if self.where else ""
        detail = f" ({d.detail})" if d.detail and d.detail != d.what else ""
        return f"failed{where}: {d.what}{detail}"

    def log_line(self, verbose: bool) -> str:
        if self.log_path is not None:
            where = f"traceback {'above and ' if verbose else ''}in {self.log_path}"
            if self.log_problem:
                where += f" ({self.log_problem})"
            return where
        return "traceback above" if verbose else f"no log file ({self.log_problem}); rerun with --verbose to see it"

    def lines(self, *, verbose: bool = False, log: bool = True) -> list[str]:
        p = self.prefix
        out = [f"{p}: {self.headline()}"]
        if self.kept:
            out.append(f"{p}: kept: {self.kept}" + (f"; resume with `{self.resume}`" if self.resume else ""))
        files = [f"summary.json {self.summary}"] if self.summary else []
        files += [self.log_line(verbose)] if log else []
        if files:
            out.append(f"{p}: " + "; ".join(files))
        out.append(f"{p}: to do: {self.diagnosis.advice}")
        return out

    def brief(self, *, verbose: bool = False) -> str:
        """One line, for a rank whose launcher prints the whole message."""
        return f"{self.prefix}: {self.headline()}; {self.log_line(verbose)}"


@contextlib.contextmanager
def quiet_child_signals() -> Iterator[None]:
    """While a failure is cleaned up and reported: torch's DataLoader raises "DataLoader worker
    (pid N) is killed by signal" from its SIGCHLD handler (torch/utils/data/_utils/signal_handling.py)
    wherever the main thread happens to be, so a dead worker would interrupt the cleanup and
    replace the error being reported with the same news. SIGCHLD's default action is restored
    for the duration (it ignores the signal without reaping children)."""
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)


def error_log_name(rank: int | None) -> str:
    return "error.log" if rank is None else f"error.rank{rank}.log"


class RunFailed(Exception):
    """A command failed while running; `report` says what, where, what was kept, what to do."""

    def __init__(self, report: FailureReport, *, after_report: Callable[[], None] | None = None) -> None:
        super().__init__(report.headline())
        self.report = report
        self.after_report = after_report  # cleanup that waits until the report is out (kiln train: the group)


def generic_report(exc: BaseException, *, output_dir: str | os.PathLike[str] | None = None,
                   cfg=None) -> FailureReport:
    """The report of a command that knows no more than its output directory (bench, export)."""
    out = Path(output_dir) if output_dir else None
    rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() and "MASTER_ADDR" in os.environ else None
    return FailureReport(diagnose(exc, cfg=cfg, run_dir=out), rank=rank, log_dir=out, exc=exc,
                         log_name=error_log_name(rank))


def resume_command(run_dir: Path, launcher: list[str] | None = None) -> str:
    """`kiln train` with the run's own resolved config (so every override the failed run had is
    kept), its run dir and `checkpoint.resume=auto`; `launcher` holds --nproc-per-node and friends."""
    config = run_dir / "config.toml"
    parts = ["kiln", "train", *(launcher or []), "--config", str(config), "--run-dir", str(run_dir),
             "checkpoint.resume=auto"]
    return shlex.join(parts)


def log_text(report: FailureReport, argv: list[str] | None = None) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rank = f", rank {report.rank}" if report.rank is not None else ""
    head = [f"==== kiln failed at {stamp} (host {socket.gethostname()}, pid {os.getpid()}{rank})",
            f"command: {shlex.join(argv if argv is not None else ['kiln', *sys.argv[1:]])}",
            *report.lines(log=False), ""]
    body = "".join(traceback.format_exception(report.exc)) if report.exc is not None else ""
    return "\n".join(head) + "\n" + body + "".join(f"\n{note.rstrip()}\n" for note in report.notes) + "\n"


def write_log(report: FailureReport, argv: list[str] | None = None) -> None:
    """Append the log to `log_dir/log_name`, else to a new temporary file; sets `log_path` (None when
    nothing could be written) and `log_problem` (why not the run's directory)."""
    text = log_text(report, argv)
    if report.log_dir is not None and report.log_dir.is_dir():
        target = report.log_dir / report.log_name
        try:
            append_text(target, text)
            report.log_path = target
            return
        except LinkRefused as exc:  # never append a traceback to a file outside the run dir
            report.log_problem = f"{target} {exc.message.split(';')[0]}: not written through"
        except OSError as exc:
            report.log_problem = f"{report.log_dir} is not writable: {reason(exc)}"
    try:
        fd, name = tempfile.mkstemp(prefix="kiln-error-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        report.log_path = Path(name)
    except OSError as exc:
        report.log_problem = (report.log_problem or "") + f"; nor a temporary file: {reason(exc)}"


def emit(report: FailureReport, *, verbose: bool = False, mode: str = "full") -> None:
    """Write the log, then tell the user on stderr: the whole message (`full`), one line (`brief`),
    or nothing (`quiet`, for a rank whose failure only echoes another's). `--verbose` adds the
    traceback."""
    write_log(report)
    if verbose and report.exc is not None:
        traceback.print_exception(report.exc, file=sys.stderr)
    if mode == "quiet":
        return
    text = report.brief(verbose=verbose) if mode == "brief" else "\n".join(report.lines(verbose=verbose))
    with contextlib.suppress(OSError):  # stderr gone (closed pipe): the log holds it all
        print(text, file=sys.stderr, flush=True)
