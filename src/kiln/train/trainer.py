"""The trainer: one training run, read top to bottom, for one process or N ranks.

`Trainer.__init__` sets up the process: its device, the run's plan (kiln.train.plan: measured
compile defaults, run dir, precision), CPU threads and the run dir's lock; then it builds and checks
everything that can fail on bad input (kiln.train.build_run: the resume decision, model, data,
features), so a typo costs no compute and writes nothing. `fit` joins the process group, opens
the run dir (rank 0: kiln.train.run_files), opens the metric sinks, runs the loop
(kiln.train.loop, which owns the run's progress; the step itself in kiln.train.step) and ends the
run however it ends (kiln.train.finish: status, cleanup, summary.json). A failure's report
(kiln.train.failure) is built from `facts()`. One process and N torchrun ranks run the same code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint.signals import SignalExit
from kiln.compile_cache import compile_cache_dir
from kiln.config.schema import Config
from kiln.cpu.threads import configure_cpu
from kiln.distributed.numa import bind_to_gpu_numa_node
from kiln.distributed.world import DistEnv, backend_for, destroy_process_group, device_for, init_process_group
from kiln.errors import ConfigError
from kiln.failure.faults import planned_fault
from kiln.failure.report import FailureReport, quiet_child_signals
from kiln.monitor.gpu_health import start_gpu_health
from kiln.monitor.sinks import build_sinks
from kiln.outputs import RunDirLock
from kiln.precision import tf32_enabled
from kiln.runtime import deterministic_mode, resolve_device
from kiln.train.attention import attention_backend
from kiln.train.build_run import build_run
from kiln.train.failure import RunFacts, training_report
from kiln.train.finish import call_failure_hook, finish_run, record_end, release_run
from kiln.train.loop import TrainLoop
from kiln.train.plan import Placement, plan_train
from kiln.train.run_files import open_run_dir
from kiln.train.segments import RunHistory

log = logging.getLogger("kiln.train")


class Trainer:
    def __init__(self, cfg: Config, run_dir: str | Path | None = None,
                 step_hook: Callable[[int], None] | None = None, *,
                 on_failure: Callable[[BaseException], None] | None = None,
                 keep_group_on_failure: bool = False) -> None:
        """`step_hook(step)` runs after every optimizer step (kiln profile's profiler window).
        `on_failure(exc)` is called as soon as `fit` catches an error, before cleaning up (the CLI
        publishes the rank's report there: a launcher may stop this process during cleanup).
        `keep_group_on_failure`: a failed `fit` leaves the process group open until `leave_group()`,
        so the CLI prints this rank's message first (leaving frees the peers blocked in a
        collective; torchrun may then stop this rank mid-message)."""
        self.cfg = cfg
        self.step_hook = step_hook
        self.on_failure = on_failure
        self.keep_group_on_failure = keep_group_on_failure
        self.dist = DistEnv.from_env()
        fault = planned_fault(self.dist.rank)  # a malformed KILN_FAULT is bad input, before any work
        multi = self.dist.world_size > 1
        self.device = device_for(self.dist, cfg.training.device) if multi else resolve_device(cfg.training.device)
        if multi and run_dir is None:
            raise ConfigError("--run-dir", "several ranks need one run dir chosen up front; pass --run-dir")
        where = Placement(self.device.type, self.dist.world_size, launched=self.dist.launched,
                          device_name=torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                          is_main=self.dist.is_main)
        plan = plan_train(cfg, run_dir, where, self.device)
        if plan.compile_note and self.dist.is_main:
            log.info(plan.compile_note)
        if plan.continuing and self.dist.is_main:
            log.info(plan.continuing_line())
        if plan.graph_note and self.dist.is_main:
            log.warning(plan.graph_note)
        self.run_dir = plan.run_dir
        cpu_plan = None
        if self.device.type == "cpu":  # threads and pinning before anything runs in parallel or compiles
            cpu_plan = configure_cpu(cfg.cpu, local_rank=self.dist.local_rank, local_world=self.dist.local_world_size)
        # The run dir's lock before any look at the dir, held until `fit` ends: two kiln processes
        # never both decide a dir is theirs. Rank 0 holds it (or its launcher, for it).
        self._lock = RunDirLock(self.run_dir)
        try:
            with self._lock.released_on_error():  # bad input: the dir is as it was
                if self.dist.is_main:
                    self._lock.acquire()
                self.parts = build_run(plan, where, self.dist, self.device, cpu_plan=cpu_plan, fault=fault)
        except SystemExit as exc:  # a factory's sys.exit(0) must not end kiln silently with success
            raise ConfigError("model.name", f"user code called sys.exit({exc.code!r}) while kiln built the model "
                              "and data; raise an exception to report a problem") from None
        self.loop = TrainLoop(self.parts)  # it owns the run's progress (read here for the summary and a report)
        # How the end went, for a failure's report (kept here, written by `fit` and `leave_group` only).
        self.failed_at: float | None = None
        self.summary_error: Exception | None = None
        self.cleanup_errors: list[tuple[str, BaseException]] = []

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        parts, cfg, main = self.parts, self.cfg, self.dist.is_main
        if parts.resume.already_complete:  # nothing to train, nothing written
            self._lock.release()
            return dict(parts.resume.summary)
        if self.dist.world_size > 1 or self.dist.launched:
            init_process_group(self.dist, self.device, backend_for(self.device, cfg.distributed.backend),
                               cfg.distributed.timeout_s, run_dir=self.run_dir)
        if cfg.distributed.bind_numa:
            log.info(bind_to_gpu_numa_node(self.device))
        lock = contextlib.ExitStack()
        lock.callback(self._lock.release)
        history = open_run_dir(parts) if main else RunHistory()
        sinks = build_sinks(cfg.metrics, self.run_dir, cfg.training.steps, is_main=main,
                            run_config=dataclasses.asdict(cfg))
        health = start_gpu_health(cfg.metrics.gpu_health, self.device, cfg.metrics.gpu_health_period_s)
        summary: dict[str, Any] = {"status": "running", "steps": 0, "run_dir": str(self.run_dir)}
        started = time.perf_counter()
        progress = self.loop.progress
        try:
            with tf32_enabled(cfg.precision.tf32), deterministic_mode(cfg.training.deterministic), \
                    compile_cache_dir(cfg.compile.cache_dir if cfg.compile.enabled else "torch"), \
                    attention_backend(cfg.model.attention):
                try:
                    self.loop.prepare(sinks, health, self.step_hook)
                    summary.update(self.loop.run())
                except SystemExit as exc:
                    if isinstance(exc, SignalExit):
                        raise
                    raise RuntimeError(f"user code called sys.exit({exc.code!r}) during step {progress.step}; "
                                       "kiln treats that as a failure (raise an exception to report a problem)") from exc
            parts.checkpointer.close()  # completes an in-flight async save: its failure fails the run
            summary["checkpoint_saves"] = parts.checkpointer.times.summary()  # with that save's total
            summary["status"] = "stopped" if summary.get("stopped_by") else "completed"
        except BaseException as exc:
            if record_end(summary, exc) == "failed":
                self.failed_at = time.time()
                self.cleanup_errors += call_failure_hook(self.on_failure, exc)
            raise
        finally:
            failing = summary["status"] not in ("completed", "stopped")
            with quiet_child_signals() if failing else contextlib.nullcontext():
                end = finish_run(summary, sinks=sinks, health=health, checkpointer=parts.checkpointer,
                                 started=started, failing=failing, steps_done=progress.done,
                                 first_step=progress.start, resumed_from=progress.resumed_from, history=history,
                                 summary_path=self.run_dir / "summary.json" if main else None)
                self.cleanup_errors += end.errors
                self.summary_error = end.summary_error
                self.cleanup_errors += release_run(lock, self.leave_group, failing=failing,
                                                   keep_group_on_failure=self.keep_group_on_failure)
            if end.first is not None:
                raise end.first
        return summary

    def facts(self) -> RunFacts:
        """What a failure's report needs to know of this run, now."""
        dist, progress = self.dist, self.loop.progress
        return RunFacts(cfg=self.cfg, run_dir=Path(self.run_dir),
                        rank=dist.rank if dist.world_size > 1 or dist.launched else None,
                        launched=dist.launched, is_main=dist.is_main, device=self.device,
                        num_params=self.parts.num_params, step=progress.step, steps_done=progress.done,
                        start=progress.start, failed_at=self.failed_at,
                        removed_partial=tuple(self.parts.checkpointer.removed_partial),
                        summary_error=self.summary_error, cleanup_errors=tuple(self.cleanup_errors))

    def report(self, exc: BaseException, *, final: bool = True) -> FailureReport:
        """The report of a failed `fit` (kiln.train.failure.training_report); `final=False`: before cleanup."""
        return training_report(exc, self.facts(), final=final)

    def leave_group(self) -> None:
        """Leave the process group if one is open and release the run dir; an error doing so is
        kept in `cleanup_errors`."""
        try:
            destroy_process_group()
        except Exception as exc:
            self.cleanup_errors.append(("leaving the process group", exc))
        self._lock.release()


def train(cfg: Config, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Build, train and return the summary (also written to `run_dir/summary.json` by rank 0)."""
    return Trainer(cfg, run_dir).fit()
