"""The training loop: one optimizer step after another, with what happens around each step.

`TrainLoop(parts)` trains one process's share of a run from the `RunParts` the trainer built
and checked (kiln.train.build_run), and owns the run's `Progress` (the step begun, the last one
finished, the first of this segment): only the loop moves it; the trainer reads it for the
summary and a failure's report. `prepare` assembles the step function (kiln.train.assemble:
precision, compile, DDP/FSDP2 applied from outside the model), the metrics meter, the
non-finite guard and the checkpointable state, and resumes from a checkpoint if there is one.
`one_step` is one iteration: fetch the micro-batches, run the training step
(kiln.train.step.TrainStep: forward, backward, clip, optimizer, scheduler), observe the loss,
and at log steps read the figures, evaluate, write a record; then a checkpoint at the checkpoint
interval, or a stop agreed by every rank on a signal. Nothing reads a device value on the host
outside log steps, so the CPU runs ahead of the GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint import AppState, NonFiniteGuard, StopOnSignal, any_rank
from kiln.compile import compile_counters
from kiln.compile_cache import RunCompileCache
from kiln.distributed.local_optim import update_paths
from kiln.distributed.sync_timing import SyncTimer
from kiln.distributed.world import barrier
from kiln.failure.faults import inject
from kiln.monitor.flops import count_step_flops, fake_copy, peak_flops
from kiln.monitor.gpu_health import GpuHealthSampler
from kiln.monitor.memory import memory_stats, reset_peak
from kiln.monitor.sinks import first_step_message
from kiln.monitor.stragglers import StragglerDetector
from kiln.precision import PrecisionPolicy, apply_precision, with_precision
from kiln.timing import synchronize
from kiln.train.assemble import build_train_step
from kiln.train.build_run import RunParts
from kiln.train.gpu_plan import measured_peak, plan_record, planned_reshard
from kiln.train.losses import build_eval_fn, build_forward_loss
from kiln.train.memory_plan import meta_model
from kiln.train.meter import IntervalMeter
from kiln.train.optim import lr_snapshot
from kiln.train.step import evaluate

log = logging.getLogger("kiln.train")


@dataclass
class Progress:
    """Where a run (segment) is. The loop moves it; the trainer reads it for summary.json and for a
    failure's report ("in step 7", "after step 6", "before step 1")."""

    start: int
    """The first step of this segment (1, or the step after the checkpoint it resumed from)."""
    resumed_from: Path | None
    """The checkpoint it resumed from (an older one when the newest could not be read)."""
    step: int = 0
    """The step begun."""
    done: int = 0
    """The last step finished."""


def count_flops(model: torch.nn.Module, batch, *, task: str, ce_kernel: str, policy: PrecisionPolicy,
                device: torch.device, accum: int, spare: torch.nn.Module | None = None) -> int | None:
    """FLOPs of one optimizer step (`accum` micro-batches like `batch`) on one device, counted on the
    eager, unwrapped model (with the run's cross-entropy kernel, whose matmuls are those of plain
    logits + cross-entropy). The FLOPs of a causal LM or a classifier are per sample: one sequence
    (two samples for a classifier, so batch norm still trains) is counted and scaled by the batch.

    `spare`: the same model built on the meta device (given away): the step is counted on it made of
    fake tensors on `device` (kiln.monitor.flops.fake_copy), the same count without touching the
    device's memory. A real eager step of `model` would hold its gradients and an un-checkpointed
    forward at full length before sharding and checkpointing apply (an 8B at seq 8192 filled an
    80 GB GPU there). Without a spare, or where fake tensors cannot run the step (a Triton loss), it
    runs for real on `model`; None when `model` has no data yet (FSDP2's meta build) and no spare ran."""
    inputs, targets = batch
    batch_size = inputs.shape[0]
    counted = {"causal_lm": 1, "classification": 2}.get(task, batch_size)
    counted = min(counted, batch_size)
    inputs, targets = inputs[:counted], targets[:counted]
    flops = None
    if spare is not None:
        try:
            flops = _count_fake(spare, inputs, targets, task=task, ce_kernel=ce_kernel, policy=policy, device=device)
        except Exception as exc:  # noqa: BLE001  (any failure of the fake step: count for real, or skip)
            log.debug("FLOPs not counted on fake tensors (%s: %s)", type(exc).__name__, exc)
    if flops is None:
        if any(p.is_meta for p in model.parameters()):
            return None
        forward_loss = with_precision(build_forward_loss(model, task, ce_kernel), policy, device)
        try:
            flops = count_step_flops(lambda: forward_loss(inputs, targets).backward(), device=device, module=model)
        finally:
            model.zero_grad(set_to_none=True)
    return flops * batch_size // counted * accum


def _count_fake(spare: torch.nn.Module, inputs, targets, *, task: str, ce_kernel: str, policy: PrecisionPolicy,
                device: torch.device) -> int:
    model, mode = fake_copy(apply_precision(spare, policy), device)  # cast on meta: free
    with mode:
        inputs, targets = mode.from_tensor(inputs), mode.from_tensor(targets)
    forward_loss = with_precision(build_forward_loss(model, task, ce_kernel), policy, device)

    def step() -> None:
        with mode:
            forward_loss(inputs, targets).backward()

    return count_step_flops(step, device=device)


class TrainLoop:
    """The steps of one run (segment). `prepare` builds what the steps need; `run()` trains from the
    start (or resumed) step to `training.steps` and returns the run's figures for the summary."""

    def __init__(self, parts: RunParts) -> None:
        self.parts, self.cfg, self.device = parts, parts.cfg, parts.device
        self.progress = Progress(start=parts.resume.first_step, resumed_from=parts.resume.path)

    def prepare(self, sinks, health: GpuHealthSampler | None = None,
                step_hook: Callable[[int], None] | None = None) -> None:
        """The step function, meter, guard and checkpointable state; then the checkpoint, if any.
        `sinks`: the run's metric sinks; `health`: its GPU health sampler; `step_hook(step)` runs
        after every optimizer step (kiln profile's profiler window)."""
        p, cfg, device = self.parts, self.cfg, self.device
        tcfg = cfg.training
        self.sinks, self.health, self.step_hook = sinks, health, step_hook
        self.accum = tcfg.grad_accum_steps
        p.model.train()
        self.data_iter = iter(p.train_data)
        self.pending = [next(self.data_iter)]
        flops_per_step = None
        if cfg.metrics.mfu:  # an eager step of a sample or two under torch's FLOP counter: seconds on a CPU
            sinks.waiting("counting the training step's FLOPs (for MFU; metrics.mfu=false skips it)")
            spare = meta_model(cfg)
            flops_per_step = count_flops(p.model, self.pending[0], task=p.built.task, ce_kernel=p.features.ce_kernel,
                                         policy=p.policy, device=device, accum=self.accum,
                                         spare=spare.module if spare is not None else None)
            if flops_per_step is None and p.dist.is_main:
                log.warning("the training step's FLOPs could not be counted without allocating the unsharded "
                            "model: no MFU in this run's records")
        sinks.waiting("building the training step (precision, parallelism, optimizer)")
        peak, self.peak_source = peak_flops(device, cfg.precision.policy, cfg.metrics.peak_tflops,
                                            tf32=cfg.precision.tf32)
        self.guard = NonFiniteGuard(tcfg.nonfinite, tcfg.nonfinite_max_skips, device=device, window=tcfg.log_interval)
        self.multi = p.dist.world_size > 1
        self.sync_timer = SyncTimer(device) if self.multi and cfg.metrics.sync_timing else None
        initial = p.built.initial_values
        seed = torch.initial_seed()  # the seed build_run gave torch (later draws do not change it)
        self.step_fn = build_train_step(p.model, p.built.task, p.built.blocks, cfg, p.policy, device,
                                        strategy=p.strategy, guard=self.guard, sync_timer=self.sync_timer,
                                        ce_kernel=p.features.ce_kernel, swiglu_kernel=p.features.swiglu_kernel,
                                        initial_values=None if initial is None else lambda: initial(device, seed),
                                        reshard_after_forward=planned_reshard(p.memory_plan, p.strategy),
                                        activation_checkpointing=p.features.activation_checkpointing)
        self.model = self.step_fn.model
        self.eval_fn = with_precision(build_eval_fn(self.model, p.built.task), p.policy, device)
        self.samples_per_step = p.train_data.samples_per_batch * self.accum
        self.tokens_per_step = (p.train_data.tokens_per_batch or 0) * self.accum or None
        # Rank 0 names stragglers (it logs the records); every rank has the gathered values.
        self.stragglers = (StragglerDetector(cfg.metrics.straggler_margin, cfg.metrics.straggler_intervals)
                           if self.multi and p.dist.is_main else None)
        self.meter = IntervalMeter(device, samples_per_step=self.samples_per_step,
                                   tokens_per_step=self.tokens_per_step, world_size=p.dist.world_size,
                                   flops_per_step=flops_per_step, peak_flops=peak, sync_timer=self.sync_timer,
                                   health=health, stragglers=self.stragglers)
        self.app = AppState(self.model, self.step_fn.optimizer, self.step_fn.scheduler, self.step_fn.scaler,
                            data=p.train_data, guard=self.guard, rank=p.dist.rank, world_size=p.dist.world_size,
                            device=device)
        self.compile_cache = RunCompileCache(p.run_dir, cfg.compile, is_main=p.dist.is_main)
        if p.resume.path is not None:
            self._resume()
        self.record: dict[str, Any] = {}
        self.evals: dict[str, float] = {}
        self.stopped_by: str | None = None

    def _resume(self) -> None:
        """Load the compile cache (before the first step compiles: a warm start) and the checkpoint."""
        p, progress = self.parts, self.progress
        self.compile_cache.load()
        report = p.checkpointer.load_readable(p.resume.path, self.app, fall_back=not p.resume.branching)
        if report.path != p.resume.path:  # a newer one could not be read: its steps run again
            progress.resumed_from = report.path
            self.sinks.cut_after(report.step)
        progress.start = int(self.app.progress.get("step", report.step)) + 1
        progress.step = progress.done = progress.start - 1
        self.pending = []  # the data position was restored: batches fetched before it are not ours
        if p.dist.is_main:
            log.info("resumed from %s at step %d", report.path, progress.start - 1)

    def run(self) -> dict[str, Any]:
        cfg, tcfg = self.cfg, self.cfg.training
        reset_peak(self.device)
        barrier()
        synchronize(self.device)
        if cfg.compile.enabled or cfg.compile.cudagraphs:  # else minutes of silence before the first record
            self.sinks.waiting(first_step_message(cfg.compile, self.progress.start, tcfg.steps))
        self.meter.restart_clock()
        # Several ranks agree on a stop at log steps only (the vote is a collective), so say when.
        when = (f"at the next log step (training.log_interval={tcfg.log_interval}: the ranks agree on a stop there)"
                if self.parts.dist.world_size > 1 else "after this step")
        with StopOnSignal(when=when) as stop:
            for step in range(self.progress.start, tcfg.steps + 1):
                if not self.one_step(step, stop):
                    break
            else:
                if cfg.checkpoint.save_final:
                    self.parts.checkpointer.save(tcfg.steps, self.app, final=True)
                    self.compile_cache.save()
        if self.stopped_by is not None and self.parts.dist.is_main and cfg.checkpoint.resume == "never":
            log.warning("stopped by %s after step %d", self.stopped_by, self.app.progress["step"])  # nothing resumes
        elif self.stopped_by is not None and self.parts.dist.is_main:  # every rank saved; one line says so
            log.warning("stopped by %s after step %d; checkpoint saved: the same command continues the run in %s "
                        "(as does adding --run-dir %s; checkpoint.resume=auto, the default)", self.stopped_by,
                        self.app.progress["step"], self.parts.run_dir, self.parts.run_dir)
        return self.summary()

    def one_step(self, step: int, stop: StopOnSignal) -> bool:
        """Step `step` of the run and what follows it; False when a signal stops the run here
        (after a blocking checkpoint save on every rank)."""
        p, tcfg, meter = self.parts, self.cfg.training, self.meter
        self.progress.step = step
        t_data = time.perf_counter()
        while len(self.pending) < self.accum:
            self.pending.append(next(self.data_iter))
        meter.add_data_wait(time.perf_counter() - t_data)
        is_log = step == self.progress.start or step % tcfg.log_interval == 0 or step == tcfg.steps
        lr = lr_snapshot(self.step_fn.optimizer) if is_log else 0.0  # the LR this step uses
        loss, grad_norm, flag = self.step_fn(self.pending, want_grad_norm=is_log)
        self.pending = []
        if not self.step_fn.observes_guard:  # a captured step records it inside its graph
            # Under a GradScaler an inf gradient is a routine overflow it skips, not divergence.
            self.guard.observe(loss, None if self.step_fn.scaler is not None else grad_norm, step, flag=flag)
        meter.add_step(loss)
        world = p.dist.world_size
        self.app.progress.update(step=step, samples_seen=step * self.samples_per_step * world,
                                 tokens_seen=step * (self.tokens_per_step or 0) * world)
        inject(p.fault, step)
        self.progress.done = step
        if is_log:
            self._log(step, lr, grad_norm)
        interval = self.cfg.checkpoint.interval
        if step == self.progress.start and interval and (step // interval + 1) * interval < tcfg.steps:
            # An interval save lies ahead: pin its host copy now, outside every step record (the clock restarts below).
            prepared = p.checkpointer.prepare_async(self.app)
            if prepared is not None and p.dist.is_main:
                log.info("checkpoint: the state staged once into page-locked host memory in %.1f s, so async "
                         "saves hold their step only for the copy", prepared)
        # A signal on one rank must stop all ranks at the same step; agreeing costs a
        # collective, so multi-rank jobs agree at log steps only.
        want_stop = stop.stop_requested()
        if world > 1:
            want_stop = any_rank(want_stop) if is_log else False
        if want_stop:
            p.checkpointer.save(step, self.app, block=True)
            self.stopped_by = stop.signal_name or "signal"
            return False
        if self.cfg.checkpoint.interval and step % self.cfg.checkpoint.interval == 0 and step != tcfg.steps:
            p.checkpointer.save(step, self.app)
            self.compile_cache.save()
        if is_log:
            synchronize(self.device)
            self.meter.restart_clock()
        if self.step_hook is not None:
            self.step_hook(step)
        return True

    def _log(self, step: int, lr: float, grad_norm) -> None:
        """A log step's record (the interval's figures, the guard's verdict, an eval pass when due)."""
        p, tcfg = self.parts, self.cfg.training
        self.record = self.meter.record(step, float(lr), grad_norm)
        self.record.update(self.guard.check())  # NonFiniteError: exit 1 naming the step
        self.record.update(p.checkpointer.times.fresh())  # the newest finished save's stall and total time
        if p.eval_data is not None and (step % tcfg.eval_interval == 0 or step == tcfg.steps):
            p.eval_data.reset()  # every eval pass sees the same batches
            self.evals = evaluate(self.model, self.eval_fn, p.eval_data, tcfg.eval_steps, device=self.device,
                                  perplexity=p.built.task == "causal_lm")
            self.record.update(self.evals)
        self.sinks.log(self.record)

    def summary(self) -> dict[str, Any]:
        """The run's figures for summary.json: throughput and utilization, memory, what ran where."""
        p, cfg, device = self.parts, self.cfg, self.device
        result: dict[str, Any] = {
            "steps": self.app.progress.get("step", cfg.training.steps),
            "stopped_by": self.stopped_by,
            "resumed_from": str(self.progress.resumed_from) if self.progress.resumed_from else None,
            **self.meter.summary(self.record),
            "peak_mem_bytes": memory_stats(device).get("peak_mem_bytes"),
            "memory": memory_stats(device),
            "memory_plan": plan_record(p.memory_plan, measured_peak(device)),
            "num_params": p.num_params,
            "world_size": p.dist.world_size,
            "strategy": p.strategy,
            "strategy_reason": p.strategy_reason,
            "optimizer_update_steps": update_paths(self.step_fn.optimizer),
            "fsdp_layout": getattr(p.model, "kiln_fsdp_layout", None),
            "checkpoint_saves": p.checkpointer.times.summary(),
            "global_batch": p.train_data.samples_per_batch * self.accum * p.dist.world_size,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": cfg.precision.policy,
            "compile": {"enabled": cfg.compile.enabled, "mode": cfg.compile.mode or "default",
                        "backend": cfg.compile.backend, "scope": cfg.compile.scope,
                        "regional": cfg.compile.regional,
                        "cudagraphs": getattr(self.step_fn, "capture_status", "off"), **compile_counters()},
            "task": p.built.task,
            "features": p.features.as_dict(),
            "torch": torch.__version__,
            "peak_flops_source": self.peak_source,
            "cpu": p.cpu_plan.describe() if p.cpu_plan is not None else None,
            "gpu_health": self.health.summary() if self.health is not None else None,
        }
        if self.multi:
            result["sync_timing"] = ("ddp_hook+log_gather" if self.sync_timer is not None and self.sync_timer.hooked
                                     else "log_gather")
            result["stragglers_seen"] = sorted(self.stragglers.ever) if self.stragglers is not None else []
        result.update(self.evals)
        return result
