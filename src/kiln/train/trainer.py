"""The trainer: build -> apply (precision, compile, DDP/FSDP2) -> loop with log-interval hooks.

Read top to bottom: `Trainer.__init__` builds and checks everything that can fail on bad input
(so a typo costs no compute and writes nothing), `fit` joins the process group, creates the run
dir (rank 0) and trains. One process and N torchrun ranks run the same code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint import AppState, Checkpointer, NonFiniteGuard, StopOnSignal, any_rank, config_digest
from kiln.checkpoint.hf_export import save_model_files
from kiln.checkpoint.signals import SignalExit, interruption
from kiln.checkpoint.timeline import branch
from kiln.compile import compile_counters
from kiln.compile_cache import RunCompileCache, compile_cache_dir
from kiln.compile_defaults import apply_measured_defaults
from kiln.config.errors import ConfigError
from kiln.config.load import save_config
from kiln.config.schema import Config
from kiln.data import build_data
from kiln.distributed.env import (
    DistEnv,
    backend_for,
    barrier,
    destroy_process_group,
    device_for,
    init_process_group,
)
from kiln.distributed.local_optim import update_paths
from kiln.distributed.strategy import resolve_strategy
from kiln.distributed.sync_timing import SyncTimer
from kiln.failure.classify import short_error
from kiln.failure.report import quiet_child_signals
from kiln.models import build_model
from kiln.models.host_memory import check_model_fits
from kiln.monitor.flops import count_step_flops, peak_flops
from kiln.monitor.gpu_health import start_gpu_health
from kiln.monitor.memory import memory_stats, reset_peak
from kiln.monitor.prometheus import check_bindable
from kiln.monitor.sinks import build_sinks, first_step_message
from kiln.monitor.stragglers import StragglerDetector
from kiln.monitor.summary import write_summary
from kiln.outputs import RunDirLock, held_for_me
from kiln.precision import apply_precision, resolve_precision, tf32_enabled, with_precision
from kiln.timing import synchronize
from kiln.train.assemble import build_train_step
from kiln.train.attention import attention_backend
from kiln.train.faults import inject, planned_fault
from kiln.train.features import describe_features, resolve_features
from kiln.train.losses import build_eval_fn, build_forward_loss
from kiln.train.meter import IntervalMeter
from kiln.train.optim import lr_snapshot
from kiln.train.rundir import (
    already_complete_summary,
    check_run_dir,
    checkpoint_step,
    no_checkpoint_decision,
    trim_metrics,
)
from kiln.train.runtime import (
    default_run_dir,
    deterministic_mode,
    resolve_device,
    seed_everything,
)
from kiln.train.segments import RunHistory, read_history, whole_run
from kiln.train.step import evaluate

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
        self.fault = planned_fault(self.dist.rank)  # a malformed KILN_FAULT is bad input, before any work
        multi = self.dist.world_size > 1
        self.device = device_for(self.dist, cfg.training.device) if multi else resolve_device(cfg.training.device)
        self.cpu_plan = None
        if self.device.type == "cpu":  # threads and pinning before anything runs in parallel or compiles
            from kiln.cpu.threads import configure_cpu

            self.cpu_plan = configure_cpu(cfg.cpu, local_rank=self.dist.local_rank,
                                          local_world=self.dist.local_world_size)
        self.policy = resolve_precision(cfg.precision.policy, self.device)
        note = apply_measured_defaults(cfg, self.device.type, self.dist.world_size,  # before the run-dir check
                                       launched=self.dist.launched,
                                       device_name=torch.cuda.get_device_name(self.device)
                                       if self.device.type == "cuda" else None)
        if note and self.dist.is_main:
            log.info(note)
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg.model.name)
        if multi and run_dir is None:
            raise ConfigError("--run-dir", "several ranks need one run dir chosen up front; pass --run-dir")
        # The run dir's lock before any look at the dir, held until `fit` ends: two kiln processes
        # never both decide a dir is theirs. Rank 0 holds it (or its launcher, for it).
        self._lock = RunDirLock(self.run_dir)
        if self.dist.is_main and not held_for_me(self.run_dir):
            self._lock.acquire()
        try:
            self._build(cfg)
        except SystemExit as exc:  # a factory's sys.exit(0) must not end kiln silently with success
            self._lock.release(remove_if_created=True)
            raise ConfigError("model.name", f"user code called sys.exit({exc.code!r}) while kiln built the model "
                              "and data; raise an exception to report a problem") from None
        except BaseException:
            self._lock.release(remove_if_created=True)  # bad input: the dir is as it was
            raise

    def _build(self, cfg: Config) -> None:
        """Everything that can fail on bad input, under the run dir's lock (see __init__)."""
        self.checkpointer = Checkpointer(self.run_dir, cfg.checkpoint, rank=self.dist.rank,
                                         world_size=self.dist.world_size, config_digest=config_digest(cfg))
        self.resume_path, self.already_complete = self._resolve_run_dir()
        check_model_fits(cfg.model, self.device.type, cfg.optim)  # before building a model the host cannot hold
        seed_everything(cfg.training.seed)  # same seed on every rank: identical initial weights
        built = build_model(cfg.model, device=self.device)
        self.built = built
        if self.resume_path is not None:  # a checkpoint of another model is bad input: exit 2, nothing written
            self.checkpointer.check_model(self.resume_path, built.module)
        self.model = apply_precision(built.module.to(self.device), self.policy)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        param_bytes = torch.finfo(self.policy.param_dtype).bits // 8
        self.strategy, self.strategy_reason = resolve_strategy(
            cfg, self.dist.world_size, self.num_params, param_bytes, self.device, launched=self.dist.launched
        )
        shard = {"rank": self.dist.rank, "world_size": self.dist.world_size}
        self.train_data = build_data(cfg.data, built.input_spec, device=self.device, seed=cfg.training.seed, **shard)
        self.eval_data = None
        if cfg.training.eval_interval > 0:
            self.eval_data = build_data(
                cfg.data, built.input_spec, device=self.device, seed=cfg.training.seed, split="eval", **shard
            )
            if self.eval_data is None:
                log.warning("training.eval_interval is set but data has no eval split (data.eval_path); eval is off")
        if cfg.compile.enabled and cfg.compile.regional and not built.blocks:
            raise ConfigError("compile.regional", f"{cfg.model.name} has no repeated blocks to compile one by one")
        self.features = resolve_features(cfg, built, self.model, self.policy, self.device, self.train_data)
        if cfg.metrics.prometheus and self.dist.is_main:
            check_bindable(cfg.metrics.prometheus_host, cfg.metrics.prometheus_port)
        # Where a failure happened, for its report: step `_step` began, `_steps_done` finished.
        self._step = self._steps_done = 0
        self._start = checkpoint_step(self.resume_path) + 1 if self.resume_path is not None else 1
        self._history = RunHistory()  # the run's earlier segments (rank 0 reads them in `fit`)
        self.summary_error: Exception | None = None
        self.cleanup_errors: list[tuple[str, BaseException]] = []
        self.failed_at: float | None = None

    def _resolve_run_dir(self) -> tuple[Path | None, bool]:
        """(checkpoint to resume from or None, whether the run is already complete), deciding what
        to do with a run dir that holds a run (kiln.train.rundir). Every rank decides (read-only),
        so bad input stops all of them before the process group forms."""
        resume = self.cfg.checkpoint.resume
        # An elastic restart continues the group's own run: nothing to compare, and it continues
        # from the newest checkpoint (or the branch point), not from a `checkpoint.resume=PATH` again.
        restarting = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        if restarting and resume != "never":
            resume = "auto"
        self.branching = resume not in ("auto", "never")
        note = "restart" if restarting else check_run_dir(self.run_dir, self.cfg, resume, locked=True)
        if resume == "auto" and note is None:
            return None, False  # nothing there yet: a fresh start
        path = self.checkpointer.resolve_resume(resume)
        if path is not None and resume == "auto" and checkpoint_step(path) >= self.cfg.training.steps:
            return path, True
        if note == "same config":
            if path is None:
                log.warning(no_checkpoint_decision(self.run_dir))
            else:
                log.info("%s holds an unfinished run of this config: continuing it", self.run_dir)
        return path, False

    # -- one-time measurements --------------------------------------------------------------
    def _count_flops(self, batch) -> int | None:
        """FLOPs of one optimizer step on one device, counted on the eager, unwrapped model (with the
        run's cross-entropy kernel, whose matmuls are those of plain logits + cross-entropy). A causal
        LM's FLOPs are all per sequence: one is counted and scaled by the batch, so counting needs no
        more memory than a step of one sequence (a run may fit only thanks to checkpointing)."""
        if not self.cfg.metrics.mfu:
            return None
        task = self.built.task
        forward_loss = with_precision(build_forward_loss(self.model, task, self.features["ce_kernel"]),
                                      self.policy, self.device)
        inputs, targets = batch
        per_sequence = task == "causal_lm" and inputs.shape[0] > 1
        scale = inputs.shape[0] if per_sequence else 1
        if per_sequence:
            inputs, targets = inputs[:1], targets[:1]
        try:
            flops = count_step_flops(lambda: forward_loss(inputs, targets).backward(),
                                     device=self.device, module=self.model)
        finally:
            self.model.zero_grad(set_to_none=True)
        return flops * scale * self.cfg.training.grad_accum_steps

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        cfg, main = self.cfg, self.dist.is_main
        if self.already_complete:  # nothing to train, nothing written
            self._lock.release()
            return already_complete_summary(self.run_dir, self.resume_path)
        if self.dist.world_size > 1 or self.dist.launched:
            init_process_group(self.dist, self.device, backend_for(self.device, cfg.distributed.backend),
                               cfg.distributed.timeout_s, run_dir=self.run_dir)
        if cfg.distributed.bind_numa:
            from kiln.distributed.numa import bind_to_gpu_numa_node

            log.info(bind_to_gpu_numa_node(self.device))
        lock = contextlib.ExitStack()
        lock.callback(self._lock.release)
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if self.branching and self.resume_path is not None:  # one timeline per run dir
                branch(self.run_dir, self.resume_path)
            save_config(cfg, self.run_dir / "config.toml")
            if self.built.hf_config is not None:  # what `kiln export --out DIR` needs besides the weights
                save_model_files(self.run_dir, self.built.hf_config,
                                 cfg.data.path if cfg.data.source == "tokens" else None)
            if self.resume_path is None:  # a fresh start (or a restart with no checkpoint yet)
                (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)
            else:  # the earlier segments, from the summary.json this segment will replace; records
                # past the checkpoint run again, so they are cut before the sink opens the file
                self._history = read_history(self.run_dir, checkpoint_step(self.resume_path))
                trim_metrics(self.run_dir / "metrics.jsonl", checkpoint_step(self.resume_path))
            log.info("strategy: %s (%s)", self.strategy, self.strategy_reason)
            if self.built.task == "causal_lm":
                log.info(describe_features(self.features))
        sinks = build_sinks(cfg.metrics, self.run_dir, cfg.training.steps, is_main=main)
        self._health = start_gpu_health(cfg.metrics.gpu_health, self.device, cfg.metrics.gpu_health_period_s)
        summary: dict[str, Any] = {"status": "running", "steps": 0, "run_dir": str(self.run_dir)}
        started = time.perf_counter()
        try:
            with tf32_enabled(cfg.precision.tf32), deterministic_mode(cfg.training.deterministic), \
                    compile_cache_dir(cfg.compile.cache_dir if cfg.compile.enabled else "torch"), \
                    attention_backend(cfg.model.attention):
                try:
                    summary.update(self._train(sinks))
                except SystemExit as exc:
                    if isinstance(exc, SignalExit):
                        raise
                    raise RuntimeError(f"user code called sys.exit({exc.code!r}) during step {self._step}; kiln "
                                       "treats that as a failure (raise an exception to report a problem)") from exc
            self.checkpointer.close()  # completes an in-flight async save: its failure fails the run
            summary["status"] = "stopped" if summary.get("stopped_by") else "completed"
        except BaseException as exc:
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit)) or interruption(exc) is not None
            summary["status"] = "interrupted" if interrupted else "failed"
            if not interrupted:
                self.failed_at = time.time()
                summary["error"] = short_error(exc, 2000)
                if self.on_failure is not None:
                    try:
                        self.on_failure(exc)
                    except Exception as hook_error:  # a report that cannot be published must not hide the error
                        self.cleanup_errors.append(("publishing the failure", hook_error))
            raise
        finally:
            failing = summary["status"] not in ("completed", "stopped")
            with quiet_child_signals() if failing else contextlib.nullcontext():
                self._finish(summary, sinks, started, lock, failing)
        return summary

    def _finish(self, summary: dict[str, Any], sinks, started: float, lock: contextlib.ExitStack,
                failing: bool) -> None:
        """Close everything and write summary.json. On the failure path nothing here may hide the
        error being raised: each step's own error is kept in `cleanup_errors` (for the log) and the
        next step still runs; partial checkpoint directories are removed. After a clean run the
        first error here is the run's failure."""
        summary["wall_s"] = round(time.perf_counter() - started, 3)
        summary["steps"] = self._steps_done  # also when the loop failed
        steps = [("closing the metric sinks", sinks.close)]
        if self._health is not None:
            steps.append(("stopping the GPU health sampler", self._health.close))
        if failing:
            # Complete (or fail) an in-flight async save without collectives: peers may be gone.
            steps += [("waiting for the in-flight checkpoint save", lambda: self.checkpointer.close(collective=False)),
                      ("removing partial checkpoints", self.checkpointer.remove_partial)]
        first: BaseException | None = None
        for label, action in steps:
            try:
                action()
            except Exception as exc:
                self.cleanup_errors.append((label, exc))
                if not failing and first is None:
                    first = exc
                    summary.update(status="failed", error=short_error(exc, 2000))
        if self.dist.is_main:
            try:
                summary.update(whole_run(summary, self._history, self._start,
                                          str(self.resume_path) if self.resume_path else None))
                write_summary(self.run_dir / "summary.json", summary)
            except Exception as exc:
                self.summary_error = exc
                self.cleanup_errors.append(("writing summary.json", exc))
                if not failing and first is None:
                    first = exc
        # Never the run's failure: a lock file that cannot be removed stays behind harmlessly, and a
        # group broken by a dead peer may refuse a clean shutdown. After a failure the CLI still
        # writes error.log into the run dir: the lock is then kept until `leave_group()`.
        if not (failing and self.keep_group_on_failure):
            try:
                lock.close()
            except Exception as exc:
                self.cleanup_errors.append(("releasing the run dir", exc))
            self.leave_group()
        if first is not None:
            raise first

    def leave_group(self) -> None:
        """Leave the process group if one is open and release the run dir; an error doing so is
        kept in `cleanup_errors`."""
        try:
            destroy_process_group()
        except Exception as exc:
            self.cleanup_errors.append(("leaving the process group", exc))
        self._lock.release()

    def _train(self, sinks) -> dict[str, Any]:
        cfg, device = self.cfg, self.device
        tcfg = cfg.training
        accum = tcfg.grad_accum_steps
        self.model.train()
        data_iter = iter(self.train_data)
        pending = [next(data_iter)]
        flops_per_step = self._count_flops(pending[0])
        peak, peak_source = peak_flops(device, cfg.precision.policy, cfg.metrics.peak_tflops, tf32=cfg.precision.tf32)

        guard = NonFiniteGuard(tcfg.nonfinite, tcfg.nonfinite_max_skips, device=device, window=tcfg.log_interval)
        multi = self.dist.world_size > 1
        sync_timer = SyncTimer(device) if multi and cfg.metrics.sync_timing else None
        step_fn = build_train_step(self.model, self.built.task, self.built.blocks, cfg, self.policy, device,
                                   strategy=self.strategy, guard=guard, sync_timer=sync_timer,
                                   ce_kernel=self.features["ce_kernel"])
        model = step_fn.model
        eval_fn = with_precision(build_eval_fn(model, self.built.task), self.policy, device)
        samples_per_step = self.train_data.samples_per_batch * accum
        tokens_per_step = (self.train_data.tokens_per_batch or 0) * accum or None
        # Rank 0 names stragglers (it logs the records); every rank has the gathered values.
        stragglers = (StragglerDetector(cfg.metrics.straggler_margin, cfg.metrics.straggler_intervals)
                      if multi and self.dist.is_main else None)
        meter = IntervalMeter(device, samples_per_step=samples_per_step, tokens_per_step=tokens_per_step,
                              world_size=self.dist.world_size, flops_per_step=flops_per_step, peak_flops=peak,
                              sync_timer=sync_timer, health=self._health, stragglers=stragglers)
        ck = self.checkpointer
        app = AppState(model, step_fn.optimizer, step_fn.scheduler, step_fn.scaler, data=self.train_data,
                       guard=guard, rank=self.dist.rank, world_size=self.dist.world_size, device=device)
        start = 1
        compile_cache = RunCompileCache(self.run_dir, cfg.compile, is_main=self.dist.is_main)
        if self.resume_path is not None:
            compile_cache.load()  # before the first step compiles: a warm start
        if self.resume_path is not None:
            report = ck.load(self.resume_path, app)
            start = int(app.progress.get("step", report.step)) + 1
            self._step = self._steps_done = start - 1
            self._start = start
            pending = []  # the data position was restored: batches fetched before it are not ours
            if self.dist.is_main:
                log.info("resumed from %s at step %d", report.path, start - 1)
        fault = self.fault
        reset_peak(device)
        record: dict[str, Any] = {}
        evals: dict[str, float] = {}
        stopped_by = None
        barrier()
        synchronize(device)
        if cfg.compile.enabled or cfg.compile.cudagraphs:  # else minutes of silence before the first record
            sinks.waiting(first_step_message(cfg.compile, start, tcfg.steps))
        meter.restart_clock()
        with StopOnSignal() as stop:
            for step in range(start, tcfg.steps + 1):
                self._step = step
                t_data = time.perf_counter()
                while len(pending) < accum:
                    pending.append(next(data_iter))
                meter.add_data_wait(time.perf_counter() - t_data)
                is_log = step == start or step % tcfg.log_interval == 0 or step == tcfg.steps
                lr = lr_snapshot(step_fn.optimizer) if is_log else 0.0  # the LR this step uses
                loss, grad_norm, flag = step_fn(pending, want_grad_norm=is_log)
                pending = []
                if not step_fn.observes_guard:  # a captured step records it inside its graph
                    # Under a GradScaler an inf gradient is a routine overflow it skips, not divergence.
                    guard.observe(loss, None if step_fn.scaler is not None else grad_norm, step, flag=flag)
                meter.add_step(loss)
                app.progress.update(step=step, samples_seen=step * samples_per_step * self.dist.world_size,
                                    tokens_seen=step * (tokens_per_step or 0) * self.dist.world_size)
                inject(fault, step)
                self._steps_done = step
                if is_log:
                    record = meter.record(step, float(lr), grad_norm)
                    record.update(guard.check())  # NonFiniteError: exit 1 naming the step
                    if self.eval_data is not None and (step % tcfg.eval_interval == 0 or step == tcfg.steps):
                        self.eval_data.reset()  # every eval pass sees the same batches
                        evals = evaluate(model, eval_fn, self.eval_data, tcfg.eval_steps, device=device,
                                         perplexity=self.built.task == "causal_lm")
                        record.update(evals)
                    sinks.log(record)
                # A signal on one rank must stop all ranks at the same step; agreeing costs a
                # collective, so multi-rank jobs agree at log steps only.
                want_stop = stop.stop_requested()
                if self.dist.world_size > 1:
                    want_stop = any_rank(want_stop) if is_log else False
                if want_stop:
                    ck.save(step, app, block=True)
                    stopped_by = stop.signal_name or "signal"
                    break
                if cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0 and step != tcfg.steps:
                    ck.save(step, app)
                    compile_cache.save()
                if is_log:
                    synchronize(device)
                    meter.restart_clock()
                if self.step_hook is not None:
                    self.step_hook(step)
            else:
                if cfg.checkpoint.save_final:
                    ck.save(tcfg.steps, app, final=True)
                    compile_cache.save()
        if stopped_by is not None and self.dist.is_main:  # every rank saved; one line says so
            log.warning("stopped by %s after step %d; checkpoint saved, resume with checkpoint.resume=auto",
                        stopped_by, app.progress["step"])

        result: dict[str, Any] = {
            "steps": app.progress.get("step", tcfg.steps),
            "stopped_by": stopped_by,
            "resumed_from": str(self.resume_path) if self.resume_path else None,
            **meter.summary(record),
            "peak_mem_bytes": memory_stats(device).get("peak_mem_bytes"),
            "memory": memory_stats(device),
            "num_params": self.num_params,
            "world_size": self.dist.world_size,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "optimizer_update_steps": update_paths(step_fn.optimizer),
            "fsdp_layout": getattr(self.model, "kiln_fsdp_layout", None),
            "global_batch": self.train_data.samples_per_batch * accum * self.dist.world_size,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": cfg.precision.policy,
            "compile": {"enabled": cfg.compile.enabled, "mode": cfg.compile.mode or "default",
                        "backend": cfg.compile.backend, "scope": cfg.compile.scope,
                        "regional": cfg.compile.regional,
                        "cudagraphs": getattr(step_fn, "capture_status", "off"), **compile_counters()},
            "task": self.built.task,
            "features": self.features,
            "torch": torch.__version__,
            "peak_flops_source": peak_source,
            "cpu": self.cpu_plan.describe() if self.cpu_plan is not None else None,
            "gpu_health": self._health.summary() if self._health is not None else None,
        }
        if multi:
            result["sync_timing"] = ("ddp_hook+log_gather" if sync_timer is not None and sync_timer.hooked
                                     else "log_gather")
            result["stragglers_seen"] = sorted(stragglers.ever) if stragglers is not None else []
        result.update(evals)
        return result


def train(cfg: Config, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Build, train and return the summary (also written to `run_dir/summary.json` by rank 0)."""
    return Trainer(cfg, run_dir).fit()
