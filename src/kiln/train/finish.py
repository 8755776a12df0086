"""The end of a training run, however it ends: status, cleanup and summary.json.

A run ends `completed`, `stopped` (a signal; a checkpoint was saved), `interrupted` (Ctrl-C, a
launcher's stop) or `failed`. `record_end` sets the status when an error ends the run and hands
a failure to the trainer's `on_failure` hook at once (a launcher may stop the process during
cleanup). `finish_run` then closes everything and writes summary.json; on the failure path
nothing there may hide the error being raised, so each cleanup step's own error is kept (for the
log) and the next step still runs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from kiln.checkpoint.signals import interruption
from kiln.failure.classify import short_error
from kiln.monitor.summary import write_summary
from kiln.train.segments import whole_run


def record_end(trainer, summary: dict[str, Any], exc: BaseException) -> None:
    """The status of a run `exc` ends: `interrupted`, or `failed` with the error (and the
    trainer's `on_failure` hook called; a hook that fails is kept in `cleanup_errors`)."""
    interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit)) or interruption(exc) is not None
    summary["status"] = "interrupted" if interrupted else "failed"
    if interrupted:
        return
    trainer.failed_at = time.time()
    summary["error"] = short_error(exc, 2000)
    if trainer.on_failure is not None:
        try:
            trainer.on_failure(exc)
        except Exception as hook_error:  # a report that cannot be published must not hide the error
            trainer.cleanup_errors.append(("publishing the failure", hook_error))


def finish_run(trainer, summary: dict[str, Any], sinks, started: float, lock: contextlib.ExitStack,
               failing: bool) -> None:
    """Close everything and write summary.json. On the failure path each step's error is kept in
    `trainer.cleanup_errors` and partial checkpoint directories are removed; after a clean run the
    first error here is the run's failure (raised)."""
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    summary["steps"] = trainer._steps_done  # also when the loop failed
    steps = [("closing the metric sinks", sinks.close)]
    if trainer._health is not None:
        steps.append(("stopping the GPU health sampler", trainer._health.close))
    if failing:
        # Complete (or fail) an in-flight async save without collectives: peers may be gone.
        steps += [("waiting for the in-flight checkpoint save", lambda: trainer.checkpointer.close(collective=False)),
                  ("removing partial checkpoints", trainer.checkpointer.remove_partial)]
    first: BaseException | None = None
    for label, action in steps:
        try:
            action()
        except Exception as exc:
            trainer.cleanup_errors.append((label, exc))
            if not failing and first is None:
                first = exc
                summary.update(status="failed", error=short_error(exc, 2000))
    if trainer.dist.is_main:
        try:
            summary.update(whole_run(summary, trainer._history, trainer._start,
                                     str(trainer.resume_path) if trainer.resume_path else None))
            write_summary(trainer.run_dir / "summary.json", summary)
        except Exception as exc:
            trainer.summary_error = exc
            trainer.cleanup_errors.append(("writing summary.json", exc))
            if not failing and first is None:
                first = exc
    # Never the run's failure: a lock file that cannot be removed stays behind harmlessly, and a
    # group broken by a dead peer may refuse a clean shutdown. After a failure the CLI still
    # writes error.log into the run dir: the lock is then kept until `leave_group()`.
    if not (failing and trainer.keep_group_on_failure):
        try:
            lock.close()
        except Exception as exc:
            trainer.cleanup_errors.append(("releasing the run dir", exc))
        trainer.leave_group()
    if first is not None:
        raise first
