"""The trainer: build and check -> open the run -> the loop -> finish, for one process or N ranks.

Read top to bottom: `Trainer.__init__` builds and checks everything that can fail on bad input
(so a typo costs no compute and writes nothing); `fit` joins the process group, opens the run dir
(rank 0), runs the loop (kiln.train.loop: one optimizer step after another, the step itself in
kiln.train.step) and finishes the run however it ends (kiln.train.finish: status, cleanup,
summary.json). One process and N torchrun ranks run the same code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint import Checkpointer, config_digest
from kiln.checkpoint.hf_export import save_model_files, tokenizer_dir_of
from kiln.checkpoint.layout import checkpoint_step
from kiln.checkpoint.signals import SignalExit
from kiln.checkpoint.timeline import branch
from kiln.compile import cuda_graph_mode_note
from kiln.compile_cache import compile_cache_dir
from kiln.compile_defaults import apply_measured_defaults
from kiln.config.errors import ConfigError
from kiln.config.load import save_config
from kiln.config.schema import Config
from kiln.cpu.threads import configure_cpu
from kiln.data import build_data
from kiln.data.special_tokens import align_config
from kiln.distributed.env import (
    DistEnv,
    backend_for,
    destroy_process_group,
    device_for,
    init_process_group,
)
from kiln.distributed.numa import bind_to_gpu_numa_node
from kiln.distributed.strategy import resolve_strategy
from kiln.failure.faults import planned_fault
from kiln.failure.report import quiet_child_signals
from kiln.models import build_model
from kiln.monitor.gpu_health import start_gpu_health
from kiln.monitor.prometheus import check_bindable
from kiln.monitor.sinks import build_sinks
from kiln.monitor.trackers import check_tracker
from kiln.outputs import RunDirLock, held_for_me
from kiln.precision import apply_precision, resolve_precision, tf32_enabled
from kiln.runtime import (
    deterministic_mode,
    resolve_device,
    seed_everything,
)
from kiln.train.attention import attention_backend
from kiln.train.features import describe_features, resolve_features
from kiln.train.finish import finish_run, record_end
from kiln.train.loop import TrainLoop
from kiln.train.memory_plan import check_run_fits
from kiln.train.rundir import (
    already_complete_summary,
    check_run_dir,
    choose_run_dir,
    continue_schedule,
    no_checkpoint_decision,
    trim_metrics,
)
from kiln.train.segments import RunHistory, read_history

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
            self.cpu_plan = configure_cpu(cfg.cpu, local_rank=self.dist.local_rank,
                                          local_world=self.dist.local_world_size)
        self.policy = resolve_precision(cfg.precision.policy, self.device)
        note = apply_measured_defaults(cfg, self.device.type, self.dist.world_size,  # before the run-dir check
                                       launched=self.dist.launched,
                                       device_name=torch.cuda.get_device_name(self.device)
                                       if self.device.type == "cuda" else None)
        if note and self.dist.is_main:
            log.info(note)
        if multi and run_dir is None:
            raise ConfigError("--run-dir", "several ranks need one run dir chosen up front; pass --run-dir")
        self.run_dir, continuing = choose_run_dir(cfg, run_dir)
        if continuing and self.dist.is_main:
            log.info("continuing the unfinished run of this config in %s (pass --run-dir NEW_DIR to start a new "
                     "run instead)", self.run_dir)
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
        check_run_fits(cfg, self.device.type)  # before building a model (or a batch) the host cannot hold
        seed_everything(cfg.training.seed)  # same seed on every rank: identical initial weights
        built = build_model(cfg.model, device=self.device)
        if built.hf_config is not None and cfg.data.source == "tokens":  # the data's BOS/EOS, not a preset's
            built.hf_config, changed = align_config(built.hf_config, tokenizer_dir_of(cfg.data.path),
                                                    explicit=cfg.model.kwargs)
            if changed and self.dist.is_main:
                log.info("special tokens from the data's tokenizer: %s",
                         ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))
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
        if (mode_note := cuda_graph_mode_note(cfg.compile, self.device.type)) and self.dist.is_main:
            log.warning(mode_note)
        check_tracker(cfg.metrics.tracker)  # a tracker that is not installed: exit 2 before any work
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
        if note in ("same config", "longer", "restart"):  # the run's LR schedule continues, never restarts
            said = continue_schedule(self.run_dir, self.cfg)
            self.checkpointer.digest = config_digest(self.cfg)
            if said and self.dist.is_main:
                log.info(said)
        path = self.checkpointer.resolve_resume(resume)
        if path is not None and resume == "auto" and checkpoint_step(path) >= self.cfg.training.steps:
            return path, True
        if note in ("same config", "longer"):
            if path is None:
                log.warning(no_checkpoint_decision(self.run_dir))
            elif note == "longer":
                log.info("%s holds this run with fewer steps: continuing it from %s", self.run_dir, path.name)
            else:
                log.info("%s holds an unfinished run of this config: continuing it", self.run_dir)
        return path, False

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
            log.info(bind_to_gpu_numa_node(self.device))
        lock = contextlib.ExitStack()
        lock.callback(self._lock.release)
        if main:
            self._open_run_dir()
        sinks = build_sinks(cfg.metrics, self.run_dir, cfg.training.steps, is_main=main,
                            run_config=dataclasses.asdict(cfg))
        self._health = start_gpu_health(cfg.metrics.gpu_health, self.device, cfg.metrics.gpu_health_period_s)
        summary: dict[str, Any] = {"status": "running", "steps": 0, "run_dir": str(self.run_dir)}
        started = time.perf_counter()
        try:
            with tf32_enabled(cfg.precision.tf32), deterministic_mode(cfg.training.deterministic), \
                    compile_cache_dir(cfg.compile.cache_dir if cfg.compile.enabled else "torch"), \
                    attention_backend(cfg.model.attention):
                try:
                    summary.update(TrainLoop(self, sinks).run())
                except SystemExit as exc:
                    if isinstance(exc, SignalExit):
                        raise
                    raise RuntimeError(f"user code called sys.exit({exc.code!r}) during step {self._step}; kiln "
                                       "treats that as a failure (raise an exception to report a problem)") from exc
            self.checkpointer.close()  # completes an in-flight async save: its failure fails the run
            summary["status"] = "stopped" if summary.get("stopped_by") else "completed"
        except BaseException as exc:
            record_end(self, summary, exc)
            raise
        finally:
            failing = summary["status"] not in ("completed", "stopped")
            with quiet_child_signals() if failing else contextlib.nullcontext():
                finish_run(self, summary, sinks, started, lock, failing)
        return summary

    def _open_run_dir(self) -> None:
        """Rank 0: the run dir with this run's config and model files, its metrics cut back to the
        checkpoint a resumed run continues from (or removed for a fresh start)."""
        cfg = self.cfg
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
