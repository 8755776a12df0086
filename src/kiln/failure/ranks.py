"""Which rank failed first, and why: the ranks' reports, read back by the launcher.

Each failing rank publishes its report twice: into the kiln launcher's report directory
(`$KILN_LAUNCH_REPORT_DIR/rank_<R>.json`, first as soon as the error is caught, then complete) and
into the error file torchelastic gives it (`$TORCHELASTIC_ERROR_FILE`, the format
`torch.distributed.elastic.multiprocessing.errors.record` writes, plus a `kiln` entry), which plain
`torchrun` reads. torchrun's agent lists only the ranks that had exited when it noticed the first
failure; it then stops the rest with SIGTERM. A rank whose own error came first may still be
cleaning up at that moment (its peers' echoes end sooner), so the launcher reads the report
directory too: `kiln.distributed.agent` adds the agent's list (exit code or signal per failed rank).

The first failure is not simply the earliest: torchelastic stamps failures in whole seconds, and
a rank whose peer died raises its own error ("Connection closed by peer") within the same second.
So a rank's own error (disk full, OOM, an exception) ranks before a native death (a signal other
than SIGTERM; SIGABRT last, as NCCL's watchdog aborts the survivors that way), then an exit with no
report, then errors that only echo a peer's failure, then ranks the launcher stopped (SIGTERM);
the earliest wins within a class.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.failure.classify import Diagnosis, killed_by_signal
from kiln.failure.report import FailureReport
from kiln.safe_io import LinkRefused, write_atomic

REPORT_ENV = "KILN_LAUNCH_REPORT_DIR"
"""Set by the kiln launcher: the directory where ranks and the agent leave their reports; its
presence tells a rank that the launcher will print the job's message, so the rank keeps to one line."""
AGENT_FILE = "failures.json"


def under_kiln_launcher() -> bool:
    return bool(os.environ.get(REPORT_ENV))


def console_mode(report: FailureReport) -> str:
    """`full`, `brief` (one line) or `quiet` for this process's message. One process: full. A rank
    under the kiln launcher: one line for its own error, nothing when it only echoes a peer's (the
    launcher names the first failure). A rank under plain torchrun: full for its own error, one
    line for an echo."""
    if report.rank is None:
        return "full"
    secondary = report.diagnosis.secondary
    if under_kiln_launcher():
        return "quiet" if secondary else "brief"
    return "brief" if secondary else "full"


def publish(report: FailureReport) -> None:
    """This rank's report where the launchers read it (no-op in a plain one-process run)."""
    d = report.diagnosis
    stack = "".join(traceback.format_exception(report.exc)) if report.exc is not None else ""
    kiln = {"rank": report.rank, "time": report.time, "kind": d.kind, "what": d.what, "detail": d.detail,
            "advice": d.advice, "secondary": d.secondary, "where": report.where, "step": report.step,
            "log": str(report.log_path) if report.log_path else None, "summary": report.summary,
            "removed": [str(p) for p in report.removed]}
    report_dir = os.environ.get(REPORT_ENV)
    if report_dir and report.rank is not None:
        _write_json(Path(report_dir) / f"rank_{report.rank}.json", {"kiln": kiln, "callstack": stack})
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        _write_json(Path(error_file), {"message": {"message": report.headline(), "extraInfo": {
            "py_callstack": stack, "timestamp": str(int(report.time)), "kiln": kiln}}})


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data))  # the reader sees the early report or the complete one, never half
    except (OSError, LinkRefused):  # the launcher then knows the exit code alone; the console line still says it all
        return


@dataclass
class RankFailure:
    rank: int
    exitcode: int | None
    """None: the rank reported its error but the agent stopped it before it exited."""
    timestamp: float
    message: str = ""
    callstack: str = ""
    kiln: dict[str, Any] = field(default_factory=dict)

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def step(self) -> int | None:
        return self.kiln.get("step")

    @property
    def where(self) -> str:
        return self.kiln.get("where") or ""

    def diagnosis(self) -> Diagnosis:
        k = self.kiln
        if k.get("kind"):
            return Diagnosis(k["kind"], k.get("what", ""), k.get("detail", ""), k.get("advice", ""),
                             secondary=bool(k.get("secondary")))
        if self.signal_name:
            return killed_by_signal(self.signal_name)
        return Diagnosis("error", f"exited with code {self.exitcode}", self.message.splitlines()[0][:200]
                         if self.message else "", "that rank's output above shows why")

    def ended_by(self, signal_name: str) -> bool:
        """Whether this rank only ended because of the stop signal `signal_name`: killed by it, or
        exiting as kiln does on a second one (KeyboardInterrupt: 130, SystemExit: 128 + the signal)."""
        if self.kiln.get("kind"):
            return False  # the rank reported an error of its own
        return self.signal_name == signal_name or self.exitcode == 128 + signal.Signals[signal_name].value

    def removed(self) -> list[Path]:
        return [Path(p) for p in self.kiln.get("removed", [])]

    def order(self) -> tuple[int, float, int]:
        sig = self.signal_name
        if self.kiln.get("kind"):
            cls = 3 if self.kiln.get("secondary") else 0
        elif sig == "SIGTERM":
            cls = 4
        elif sig == "SIGABRT":
            cls = 2
        elif sig:
            cls = 1
        else:
            cls = 2
        return cls, float(self.kiln.get("time", self.timestamp)), self.rank

    def log_section(self) -> str:
        d = self.diagnosis()
        how = (f"signal {self.signal_name}" if self.signal_name else "stopped by the launcher" if self.exitcode is None
               else f"exit code {self.exitcode}")
        lines = [f"---- rank {self.rank} ({how}): {d.what}" + (f" ({d.detail})" if d.detail else "")]
        if self.where:
            lines.append(f"where: {self.where}")
        if self.kiln.get("log"):
            lines.append(f"its log: {self.kiln['log']}")
        if self.callstack:
            lines.append(self.callstack.rstrip())
        return "\n".join(lines)


def dump_failures(report_dir: str, failures: dict[int, Any]) -> None:
    """Agent side: ChildFailedError.failures (global rank -> ProcessFailure) as JSON."""
    rows = []
    for rank, f in sorted(failures.items()):
        data = f.error_file_data if isinstance(getattr(f, "error_file_data", None), dict) else {}
        message = data.get("message") if isinstance(data.get("message"), dict) else {}
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        rows.append({"rank": int(rank), "exitcode": int(f.exitcode), "timestamp": float(f.timestamp),
                     "message": str(getattr(f, "message", "")), "callstack": extra.get("py_callstack", ""),
                     "kiln": extra.get("kiln") or {}})
    _write_json(Path(report_dir) / AGENT_FILE, {"failures": rows})


def load_failures(report_dir: Path) -> list[RankFailure]:
    """Launcher side: the agent's failed ranks, each with its own report where it left one, plus
    ranks that reported an error but were stopped before they exited. [] when nobody reported."""
    report_dir = Path(report_dir)
    try:
        rows = json.loads((report_dir / AGENT_FILE).read_text())["failures"]
    except (OSError, ValueError, KeyError, TypeError):
        rows = []
    failures = {row["rank"]: RankFailure(**row) for row in rows if isinstance(row, dict)}
    for path in sorted(report_dir.glob("rank_*.json")):
        try:
            data = json.loads(path.read_text())
            own = data["kiln"]
            rank = int(own["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        known = failures.get(rank)
        if known is None:
            failures[rank] = RankFailure(rank=rank, exitcode=None, timestamp=float(own.get("time", 0)),
                                         callstack=data.get("callstack", ""), kiln=own)
        else:  # the rank's own channel is written first and completely: it wins over the error file
            known.kiln, known.callstack = own, data.get("callstack") or known.callstack
    return [failures[r] for r in sorted(failures)]


def first_failure(failures: list[RankFailure]) -> RankFailure | None:
    return min(failures, key=RankFailure.order) if failures else None
