"""The single-process trainer: build -> apply (precision, compile) -> loop with log-interval hooks.

Read top to bottom: `Trainer.__init__` builds and checks everything that can fail on bad input
(so a typo costs no compute and writes nothing), `fit` creates the run dir and trains.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from kiln.compile import compile_counters
from kiln.config.load import save_config
from kiln.config.schema import Config
from kiln.data import build_data
from kiln.models import build_model
from kiln.monitor.flops import count_step_flops, mfu, peak_flops
from kiln.monitor.memory import memory_stats, reset_peak
from kiln.monitor.sinks import build_sinks
from kiln.monitor.summary import write_summary
from kiln.precision import apply_precision, resolve_precision, tf32_enabled, with_precision
from kiln.train.assemble import build_train_step
from kiln.train.losses import build_eval_fn, build_forward_loss
from kiln.train.optim import current_lr
from kiln.train.runtime import (
    check_run_dir,
    default_run_dir,
    deterministic_mode,
    resolve_device,
    seed_everything,
    synchronize,
)
from kiln.train.step import evaluate

log = logging.getLogger("kiln.train")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Trainer:
    def __init__(self, cfg: Config, run_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.training.device)
        self.policy = resolve_precision(cfg.precision.policy, self.device)
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg.model.name)
        check_run_dir(self.run_dir)
        seed_everything(cfg.training.seed)
        built = build_model(cfg.model)
        self.built = built
        self.model = apply_precision(built.module.to(self.device), self.policy)
        self.train_data = build_data(cfg.data, built.input_spec, device=self.device, seed=cfg.training.seed)
        self.eval_data = None
        if cfg.training.eval_interval > 0:
            self.eval_data = build_data(
                cfg.data, built.input_spec, device=self.device, seed=cfg.training.seed, split="eval"
            )
            if self.eval_data is None:
                log.warning("training.eval_interval is set but data has no eval split (data.eval_path); eval is off")
        if cfg.compile.enabled and cfg.compile.regional and not built.blocks:
            from kiln.config.errors import ConfigError

            raise ConfigError("compile.regional", f"{cfg.model.name} has no repeated blocks to compile one by one")
        self.num_params = sum(p.numel() for p in self.model.parameters())

    # -- one-time measurements --------------------------------------------------------------
    def _count_flops(self, forward_loss, batch) -> int | None:
        if not self.cfg.metrics.mfu:
            return None
        inputs, targets = batch

        def fwd_bwd() -> None:
            forward_loss(inputs, targets).backward()

        try:
            flops = count_step_flops(fwd_bwd, device=self.device, module=self.model)
        finally:
            self.model.zero_grad(set_to_none=True)
        return flops * self.cfg.training.grad_accum_steps

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.toml")
        sinks = build_sinks(cfg.metrics, self.run_dir, cfg.training.steps, is_main=True)
        summary: dict[str, Any] = {"status": "running", "steps": 0, "run_dir": str(self.run_dir)}
        started = time.perf_counter()
        try:
            with tf32_enabled(cfg.precision.tf32), deterministic_mode(cfg.training.deterministic):
                summary.update(self._train(sinks))
            summary["status"] = "completed"
        except KeyboardInterrupt:
            summary["status"] = "interrupted"
            raise
        except Exception as exc:
            summary["status"] = "failed"
            summary["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            summary["wall_s"] = round(time.perf_counter() - started, 3)
            summary.update(getattr(self, "_progress", {}))
            sinks.close()
            write_summary(self.run_dir / "summary.json", summary)
        return summary

    def _train(self, sinks) -> dict[str, Any]:
        cfg, device = self.cfg, self.device
        tcfg = cfg.training
        accum = tcfg.grad_accum_steps
        model = self.model
        model.train()
        forward_loss = with_precision(build_forward_loss(model, self.built.task), self.policy, device)
        data_iter = iter(self.train_data)

        first_batch = next(data_iter)
        flops_per_step = self._count_flops(forward_loss, first_batch)
        peak, peak_source = peak_flops(
            device, cfg.precision.policy, cfg.metrics.peak_tflops, tf32=cfg.precision.tf32
        )

        step_fn = build_train_step(model, self.built.task, self.built.blocks, cfg, self.policy, device)
        optimizer = step_fn.optimizer
        eval_fn = with_precision(build_eval_fn(model, self.built.task), self.policy, device)

        samples_per_step = self.train_data.samples_per_batch * accum
        tokens_per_step = (self.train_data.tokens_per_batch or 0) * accum or None
        reset_peak(device)

        pending = [first_batch]
        interval_loss = torch.zeros((), device=device)
        interval_steps = 0
        interval_data_s = 0.0
        records: list[dict[str, Any]] = []
        step_ms_values: list[float] = []
        evals: dict[str, float] = {}
        first_loss = None
        synchronize(device)
        t_interval = t_run = time.perf_counter()
        first_step_s = None

        for step in range(1, tcfg.steps + 1):
            t_data = time.perf_counter()
            while len(pending) < accum:
                pending.append(next(data_iter))
            interval_data_s += time.perf_counter() - t_data
            is_log = step == 1 or step % tcfg.log_interval == 0 or step == tcfg.steps
            loss, grad_norm = step_fn(pending, want_grad_norm=is_log)
            pending = []
            interval_loss += loss
            interval_steps += 1
            self._progress = {"steps": step}

            if not is_log:
                continue
            # The only host reads of device values: once per log interval.
            loss_value = (interval_loss / interval_steps).item()
            now = time.perf_counter()
            elapsed = now - t_interval
            step_s = elapsed / interval_steps
            record: dict[str, Any] = {
                "step": step,
                "loss": loss_value,
                "lr": current_lr(optimizer),
                "grad_norm": float(grad_norm.item()) if grad_norm is not None else None,
                "samples_per_s": samples_per_step / step_s,
                "step_ms": step_s * 1e3,
                "data_wait_frac": min(1.0, interval_data_s / elapsed) if elapsed > 0 else 0.0,
            }
            if tokens_per_step:
                record["tokens_per_s"] = tokens_per_step / step_s
            if flops_per_step:
                record["tflops"] = flops_per_step / step_s / 1e12
                record["mfu"] = mfu(flops_per_step, step_s, peak)
            record.update({k: v for k, v in memory_stats(device).items() if v is not None})
            if step == 1:
                first_step_s = elapsed
                first_loss = loss_value
                record["first_step"] = True  # includes compilation and warm-up
            else:
                step_ms_values.append(record["step_ms"])
            if self.eval_data is not None and (step % tcfg.eval_interval == 0 or step == tcfg.steps):
                self.eval_data.reset()  # every eval pass sees the same batches
                evals = evaluate(model, eval_fn, self.eval_data, tcfg.eval_steps, device=device)
                record.update(evals)
            records.append(record)
            sinks.log(record)
            interval_loss = torch.zeros((), device=device)
            interval_steps = 0
            interval_data_s = 0.0
            synchronize(device)
            t_interval = time.perf_counter()

        total_s = time.perf_counter() - t_run
        steady = step_ms_values or [records[-1]["step_ms"]]
        step_ms_median = statistics.median(steady)
        mem = memory_stats(device)
        result: dict[str, Any] = {
            "steps": tcfg.steps,
            "first_loss": first_loss,
            "final_loss": records[-1]["loss"],
            "samples_per_s": samples_per_step / (step_ms_median / 1e3),
            "step_ms_median": step_ms_median,
            "step_ms_p10": _percentile(steady, 0.1),
            "step_ms_p90": _percentile(steady, 0.9),
            "first_step_s": first_step_s,
            "train_s": total_s,
            "peak_mem_bytes": mem.get("max_allocated_bytes") or mem.get("max_rss_bytes"),
            "memory": mem,
            "num_params": self.num_params,
            "world_size": 1,
            "global_batch": samples_per_step,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": cfg.precision.policy,
            "compile": {"enabled": cfg.compile.enabled, "mode": cfg.compile.mode or "default",
                        "backend": cfg.compile.backend, "scope": cfg.compile.scope,
                        "regional": cfg.compile.regional, **compile_counters()},
            "task": self.built.task,
            "torch": torch.__version__,
        }
        if tokens_per_step:
            result["tokens_per_s"] = tokens_per_step / (step_ms_median / 1e3)
        if flops_per_step:
            result["flops_per_step"] = flops_per_step
            result["mfu"] = mfu(flops_per_step, step_ms_median / 1e3, peak)
            result["peak_flops"] = peak
            result["peak_flops_source"] = peak_source
        result.update(evals)
        return result


def train(cfg: Config, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Build, train and return the summary (also written to `run_dir/summary.json`)."""
    return Trainer(cfg, run_dir).fit()
