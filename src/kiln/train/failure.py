"""The report of a failed training run: what failed, in which step, what was kept, how to resume.

One process (or one rank) builds it from `RunFacts`, what its trainer knows once `Trainer.fit`
cleaned up; the launcher of several ranks builds one for the whole job from the ranks' reports
(`group_report`), names the rank that failed first, and makes summary.json say so. It lives here,
not in kiln.failure, because it reads the checkpoint layout and summary.json (rooms above that one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint.storage import CheckpointSaveError, kept, remove_partial
from kiln.config.schema import Config
from kiln.failure.classify import Diagnosis, causes, diagnose, reason, short_error
from kiln.failure.report import FailureReport, error_log_name, resume_command
from kiln.monitor.records import read_records
from kiln.monitor.summary import read_summary, write_summary


def where_it_failed(exc: BaseException, step: int, steps_done: int, start: int = 1, *,
                    asynchronous: bool = False) -> str:
    """"saving checkpoint step 10 (path)", "in step 7" (the step began, did not finish), "after
    step 6" (logging, eval or saving after it), "before step 1" (building, compiling, resuming).
    `asynchronous`: the error is news from elsewhere (a DataLoader worker's death arrives by signal
    wherever the main thread is), so a checkpoint save it interrupted is not where it failed."""
    for e in causes(exc):
        if isinstance(e, CheckpointSaveError):
            if asynchronous:
                return f"after step {steps_done} (it interrupted saving checkpoint step {e.step})"
            return f"saving checkpoint step {e.step} ({e.path})"
    if step > steps_done:
        return f"in step {step}"
    return f"before step {start}" if steps_done < start else f"after step {steps_done}"


@dataclass(frozen=True)
class RunFacts:
    """What a failed run's report needs to know of it (kiln.train.trainer.Trainer.facts)."""

    cfg: Config
    run_dir: Path
    rank: int | None
    """This process's rank in a job; None for one plain process."""
    launched: bool
    """Under torchrun (kiln's launcher or a plain one)."""
    is_main: bool
    device: torch.device
    num_params: int | None
    step: int
    """The step begun."""
    steps_done: int
    start: int
    """The first step of this segment."""
    failed_at: float | None = None
    removed_partial: tuple[Path, ...] = ()
    """Partial checkpoint directories this process removed."""
    summary_error: Exception | None = None
    cleanup_errors: tuple[tuple[str, BaseException], ...] = ()


def training_report(exc: BaseException, facts: RunFacts, *, final: bool = True) -> FailureReport:
    """The report of a failed `fit` (or of a failure before it started training).
    `final=False`: what is known the moment the error is caught (what, where), before cleanup."""
    rank, run_dir = facts.rank, Path(facts.run_dir)
    step, done, start = facts.step, facts.steps_done, facts.start
    diagnosis = diagnose(exc, cfg=facts.cfg, run_dir=run_dir, model_params=facts.num_params)
    report = FailureReport(diagnosis, where=where_it_failed(exc, step, done, start,
                                                            asynchronous=diagnosis.kind == "worker_killed"), rank=rank, step=max(step, done), exc=exc,
                           log_dir=run_dir if run_dir.is_dir() else None, log_name=error_log_name(rank))
    report.time = facts.failed_at or report.time
    if not final:
        return report
    if run_dir.is_dir():
        report.removed = list(facts.removed_partial)
        report.kept, resumable = kept(run_dir / "checkpoints", report.removed)
        if resumable:
            command = resume_command(run_dir)
            # Under torchrun the ranks cannot know its flags; the kiln launcher prints its own command.
            report.resume = command.replace("kiln train", "torchrun ... -m kiln train", 1) if facts.launched else command
    if facts.is_main:
        report.summary = (f"could not be written ({reason(facts.summary_error)})"
                          if facts.summary_error is not None
                          else "records status failed and the error" if (run_dir / "summary.json").exists()
                          else "was not written (the failure came before training started)")
    for label, error in facts.cleanup_errors:
        report.notes.append(f"while {label} after the failure:\n{_format(error)}")
    if report.diagnosis.kind == "cuda_oom":
        report.notes.append(_cuda_memory(facts.device))
    return report


def _format(error: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(error))


def _cuda_memory(device: Any) -> str:
    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return "CUDA memory summary: not a CUDA device in this process"
    try:
        return "CUDA memory at the failure (torch.cuda.memory_summary):\n" + torch.cuda.memory_summary(device)
    except Exception as exc:  # the summary is an aid; a broken context must not hide the OOM
        return f"CUDA memory summary unavailable: {short_error(exc)}"


def record_group_failure(run_dir: Path, error: str, failed_rank: int | None,
                         rank_errors: dict[int, str]) -> str:
    """Make summary.json name the job's first failure (rank 0 wrote its own, possibly secondary,
    error; a killed rank 0 wrote none). Returns the phrase for the message."""

    path = run_dir / "summary.json"
    try:
        summary: dict[str, Any] = read_summary(run_dir) or {}
    except (OSError, ValueError):
        summary = {}
    if summary.get("status") not in (None, "running", "failed", "interrupted"):
        return f"says {summary.get('status')}"  # an elastic restart got further; leave its record alone
    summary.setdefault("steps", 0)
    summary.update(status="failed", error=error, failed_rank=failed_rank, run_dir=str(run_dir),
                   rank_errors={str(r): e for r, e in sorted(rank_errors.items())})
    try:
        write_summary(path, summary)
    except OSError as exc:
        return f"could not be written ({reason(exc)})"
    who = f"rank {failed_rank}'s error" if failed_rank is not None else "the error"
    return f"records status failed and {who}"


def group_report(run_dir: Path, first, failures: list, launcher: list[str], *, owner: bool = True) -> FailureReport:
    """The job's report from its ranks' failures (`first`, a RankFailure, failed first; None when
    torchrun failed without any rank reporting, e.g. in the rendezvous). Only the `owner` (node
    rank 0's launcher) touches the run dir: it removes partial checkpoints and updates
    summary.json; another node's launcher sees only its own ranks and may not share the storage."""
    if first is None:
        diagnosis = Diagnosis("error", "torchrun failed", "no rank reported an error",
                              "torchrun's output above says why (rendezvous, ports, a rank that could not start)")
        where = ""
    else:
        diagnosis = first.diagnosis()
        near = first.where or _where_of_peers(failures) or _where_of_metrics(run_dir)
        where = f"on rank {first.rank}" + f" {near}".rstrip()
    # Rank 0 removed the partial directory of a save that failed; a killed rank's is removed here.
    removed = [p for f in failures for p in f.removed()]
    removed += remove_partial(run_dir / "checkpoints") if owner else []
    kept_now, resumable = kept(run_dir / "checkpoints", removed) if run_dir.is_dir() else (None, False)
    resume = resume_command(run_dir, launcher) if resumable else None
    summary = None
    if run_dir.is_dir() and owner:
        summary = record_group_failure(
            run_dir, f"rank {first.rank}: {diagnosis.detail}" if first is not None else diagnosis.what,
            first.rank if first is not None else None, {f.rank: f.diagnosis().detail for f in failures})
    report = FailureReport(diagnosis, where=where, log_dir=run_dir if run_dir.is_dir() else None, kept=kept_now,
                           resume=resume, summary=summary, removed=removed)
    report.notes += [f.log_section() for f in failures]
    return report


def _where_of_peers(failures: list) -> str:
    steps = [f.step for f in failures if f.step is not None]
    return f"near step {max(steps)}" if steps else ""


def _where_of_metrics(run_dir: Path) -> str:
    """"after step N" from the run's newest metrics record: where a rank that died without a word
    (SIGKILL) stopped, when no peer published a report either (the agent may stop them first)."""
    try:
        records = read_records(run_dir / "metrics.jsonl", warn=False)
    except (OSError, ValueError):
        return ""
    for record in reversed(records):
        step = record.get("step")
        if isinstance(step, int):
            return f"after step {step} (the last logged)"
    return ""
