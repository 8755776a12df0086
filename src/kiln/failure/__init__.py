"""Failing well: one clear message per failure, the traceback in a log file, the run dir clean.

    diagnose(exc, cfg=..., run_dir=...) -> Diagnosis     what failed, in words, and what to do
    FailureReport(...).lines()                           the few lines a user reads
    emit(report, verbose=...)                            writes the log, prints the message
    RunFailed(report)                                    raised by commands, mapped to exit 1 by the CLI

kiln.failure.ranks reads a job's rank reports back (which rank failed first); kiln.failure.faults
injects the faults (KILN_FAULT) that test all of this. A training run's own report (what was kept,
how to resume) needs the checkpoint layout, a room above this one: kiln.train.failure.
"""

from __future__ import annotations

from kiln.failure.classify import Diagnosis, diagnose, killed_by_signal, short_error
from kiln.failure.report import FailureReport, RunFailed, emit, generic_report, quiet_child_signals, write_log

__all__ = [
    "Diagnosis",
    "FailureReport",
    "RunFailed",
    "diagnose",
    "emit",
    "generic_report",
    "killed_by_signal",
    "quiet_child_signals",
    "short_error",
    "write_log",
]
