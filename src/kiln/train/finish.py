"""The end of a training run, however it ends: status, cleanup and summary.json.

A run ends `completed`, `stopped` (a signal; a checkpoint was saved), `interrupted` (Ctrl-C, a
launcher's stop) or `failed`. `record_end` sets the status when an error ends the run, and
`call_failure_hook` hands a failure on at once (a launcher may stop the process during cleanup).
`finish_run` then closes everything and writes summary.json, and `release_run` lets go of the run
dir and the process group; on the failure path nothing there may hide the error being raised, so
each cleanup step's own error is kept (for the failure's report) and the next step still runs.
Each returns what went wrong instead of raising; the trainer keeps it and raises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kiln.checkpoint import Checkpointer
from kiln.checkpoint.signals import interruption
from kiln.failure.classify import short_error
from kiln.monitor.gpu_health import GpuHealthSampler
from kiln.monitor.summary import write_summary
from kiln.train.segments import RunHistory, whole_run

CleanupErrors = list[tuple[str, BaseException]]
"""(what was being done, its error), in order: notes of a failure's report."""


def record_end(summary: dict[str, Any], exc: BaseException) -> Literal["interrupted", "failed"]:
    """The status of a run `exc` ends, set in `summary`: `interrupted`, or `failed` with the error."""
    interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit)) or interruption(exc) is not None
    summary["status"] = "interrupted" if interrupted else "failed"
    if not interrupted:
        summary["error"] = short_error(exc, 2000)
    return summary["status"]


def call_failure_hook(on_failure: Callable[[BaseException], None] | None, exc: BaseException) -> CleanupErrors:
    """Hand a failure to `on_failure` (the CLI publishes the rank's report there, before cleanup); a
    hook that fails is returned, not raised: a report that cannot be published must not hide the error."""
    if on_failure is None:
        return []
    try:
        on_failure(exc)
    except Exception as hook_error:
        return [("publishing the failure", hook_error)]
    return []


@dataclass
class Finished:
    """What closing a run went through."""

    errors: CleanupErrors = field(default_factory=list)
    summary_error: Exception | None = None
    """summary.json could not be written (rank 0)."""
    first: BaseException | None = None
    """After a clean run: the first cleanup error, the run's failure (the caller raises it)."""


def finish_run(summary: dict[str, Any], *, sinks, health: GpuHealthSampler | None, checkpointer: Checkpointer,
               started: float, failing: bool, steps_done: int, first_step: int, resumed_from: Path | None,
               history: RunHistory, summary_path: Path | None) -> Finished:
    """Close everything and write summary.json (`summary_path`: rank 0's; None on other ranks).
    On the failure path each step's error is kept and partial checkpoint directories are removed;
    after a clean run the first error here is the run's failure (`Finished.first`)."""
    end = Finished()
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    summary["steps"] = steps_done  # also when the loop failed
    steps = [("closing the metric sinks", sinks.close)]
    if health is not None:
        steps.append(("stopping the GPU health sampler", health.close))
    if failing:
        # Complete (or fail) an in-flight async save without collectives: peers may be gone.
        steps += [("waiting for the in-flight checkpoint save", lambda: checkpointer.close(collective=False)),
                  ("removing partial checkpoints", checkpointer.remove_partial)]
    for label, action in steps:
        try:
            action()
        except Exception as exc:
            end.errors.append((label, exc))
            if not failing and end.first is None:
                end.first = exc
                summary.update(status="failed", error=short_error(exc, 2000))
    if summary_path is not None:
        try:
            summary.update(whole_run(summary, history, first_step, str(resumed_from) if resumed_from else None))
            write_summary(summary_path, summary)
        except Exception as exc:
            end.summary_error = exc
            end.errors.append(("writing summary.json", exc))
            if not failing and end.first is None:
                end.first = exc
    return end


def release_run(lock: contextlib.ExitStack, leave_group: Callable[[], None], *, failing: bool,
                keep_group_on_failure: bool) -> CleanupErrors:
    """Release the run dir and leave the process group. Never the run's failure: a lock file that
    cannot be removed stays behind harmlessly, and a group broken by a dead peer may refuse a clean
    shutdown. After a failure the CLI still writes error.log into the run dir: with
    `keep_group_on_failure` both are then kept until the trainer's `leave_group()`."""
    if failing and keep_group_on_failure:
        return []
    errors: CleanupErrors = []
    try:
        lock.close()
    except Exception as exc:
        errors.append(("releasing the run dir", exc))
    leave_group()
    return errors
