"""`kiln train --nproc-per-node N` (or several nodes): the launcher's side of a job of N ranks.

`launch_job` makes the run's plan as its ranks will (kiln.train.plan), locks the run dir (node rank
0's launcher holds it for its ranks until the job's report is written), runs the checks of
kiln.train.preflight once for the job, starts torchrun (kiln.distributed.launch), and says how the
job ended (`job_outcome`): its summary line, what a stop signal kept, or the rank that failed first
(kiln.failure.ranks, kiln.train.failure.group_report; raised as RunFailed, exit 1). Every rank
runs `kiln train` itself, as one process of kiln.train.trainer.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kiln.checkpoint.signals import stopped_line
from kiln.config.schema import Config
from kiln.cpu.threads import launcher_env
from kiln.distributed.launch import LaunchResult, LaunchSpec, check_launch, launch, launcher_flags, uses_gpu
from kiln.failure import RunFailed
from kiln.failure.faults import planned_fault
from kiln.failure.ranks import first_failure
from kiln.failure.report import resume_command
from kiln.monitor.summary import read_summary, summary_line
from kiln.outputs import LOCK_ENV, RunDirLock
from kiln.train.failure import group_report
from kiln.train.plan import Placement, TrainPlan, plan_train
from kiln.train.preflight import preflight
from kiln.train.strategy import check_mesh


@dataclass(frozen=True)
class Outcome:
    """How `kiln train` ends: its exit code and the lines it prints (stdout)."""

    code: int
    lines: list[str] = field(default_factory=list)


def launch_job(cfg: Config, spec: LaunchSpec, *, run_dir: str | Path | None, rank_args: list[str],
               on_run_dir: Callable[[Path], None]) -> Outcome:
    """Run the job; `rank_args`: the `kiln train` arguments every rank gets (--config, overrides),
    `on_run_dir(dir)`: told the run dir once it is checked (the CLI's dependencies.log goes there)."""
    device = cfg.training.device
    device_type = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device).type
    where = Placement(device_type, spec.nproc_per_node * spec.nnodes, launched=True)
    # The plan as the ranks will make it, so the run dir is chosen and checked with what they train.
    plan = plan_train(cfg, run_dir, where, torch.device("meta"))
    if plan.continuing:
        print(f"kiln: {plan.continuing_line()}", file=sys.stderr)
    check_mesh(cfg.distributed.replicate_degree, where.world_size)  # HSDP: exit 2 before any rank
    check_launch(spec, cfg.training.device)
    # CPU ranks: threads per rank, not torchrun's 1
    env = {} if uses_gpu(cfg.training.device) else launcher_env(cfg.cpu, spec.nproc_per_node)
    planned_fault(0)  # a malformed KILN_FAULT is bad input, before the run dir is created
    # Node rank 0's launcher holds the run dir's lock for its ranks from before the checks until the
    # job's report is written: a refused launcher starts nothing and touches nothing there.
    owner = (spec.node_rank or 0) == 0
    lock = RunDirLock(plan.run_dir)
    if owner:
        lock.acquire()
    try:
        outcome = _launch_locked(plan, where, spec, rank_args, env, on_run_dir, owns_lock=owner)
    except RunFailed as exc:  # the report (error.log) is written into the run dir under the lock
        exc.after_report = lock.release
        raise
    except BaseException:
        lock.release(remove_if_created=True)
        raise
    lock.release()
    return outcome


def _launch_locked(plan: TrainPlan, where: Placement, spec: LaunchSpec, rank_args: list[str], env: dict[str, str],
                   on_run_dir: Callable[[Path], None], *, owns_lock: bool) -> Outcome:
    cfg = plan.cfg
    run_dir = plan.run_dir
    preflight(plan, where, locked=owns_lock)
    on_run_dir(run_dir)  # checked under the lock: the run's dir
    passthrough = list(rank_args)
    if spec.max_restarts > 0 and cfg.checkpoint.resume == "never":
        # A restarted group must continue from the last checkpoint, not start over (the parent
        # checked the run dir above; an elastic restart skips that check).
        passthrough.append("checkpoint.resume=auto")
    if owns_lock:
        env = {**env, LOCK_ENV: f"{os.getpid()}:{os.path.abspath(run_dir)}"}
    result = launch(spec, run_dir, passthrough, env)
    return job_outcome(result, run_dir, launcher_flags(spec), owner=owns_lock)


def job_outcome(result: LaunchResult, run_dir: Path, flags: list[str], *, owner: bool) -> Outcome:
    """How the job ended: the first failure, raised as RunFailed; or, when the ranks died of a stop
    signal itself, what is kept; or its summary line (and what a stop signal kept). `flags`: those
    that launch this job again, for the resume command; `owner`: this launcher holds the run dir."""
    died_of_signal = result.stopped_by is not None and all(f.ended_by(result.stopped_by) for f in result.failures)
    if result.code != 0 and not died_of_signal:
        # The ranks said one line each at most; name the first failure, what was kept, what to do.
        report = group_report(run_dir, first_failure(result.failures), result.failures, flags, owner=owner)
        raise RunFailed(report)
    summary = read_summary(run_dir) if result.code == 0 else None
    stop = None
    if result.stopped_by is not None:  # what the stop kept, and the command that continues the run
        stop = stopped_line(result.stopped_by, summary, run_dir, resume_command(run_dir, flags),
                            saved=result.code == 0)
    if result.code != 0:
        # The ranks died of the signal itself: it came before they trained (nothing of this run to
        # save yet) or a second one said "now". Not a failure: say what is kept.
        return Outcome(128 + signal.Signals[result.stopped_by].value, [stop])
    lines = [summary_line(summary, run_dir) if summary else f"kiln: completed; run dir {run_dir}"]
    return Outcome(0, lines + ([stop] if stop else []))
