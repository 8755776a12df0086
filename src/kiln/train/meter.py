"""Per-log-interval bookkeeping: device-side loss sums between logs, one host read per log.

At a log step every rank takes part in two small collectives (mean loss, and an all_gather of
each rank's interval time, peak memory, data wait, time blocked in collectives and GPU health),
so rank 0 can report global throughput, per-rank timing and stragglers without any per-step
synchronisation.

Time blocked in collectives per rank = the DDP gradient all-reduce waits (kiln.distributed.
sync_timing, when a hook feeds them) + the wait at the log step itself: each rank synchronises
its device, then enters the loss all-reduce; the time until that returns is how long it waited
for the slowest rank to arrive.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from kiln.distributed.sync_timing import SyncTimer
from kiln.distributed.world import all_reduce_mean, gather_floats
from kiln.monitor.flops import mfu
from kiln.monitor.gpu_health import RANK_KEYS, GpuHealthSampler
from kiln.monitor.memory import memory_stats
from kiln.monitor.stragglers import StragglerDetector
from kiln.monitor.summary import StepStats
from kiln.timing import synchronize


def scalar(value: torch.Tensor | None) -> float | None:
    """Host float of a device scalar; a sharded (DTensor) norm is reduced first."""
    if value is None:
        return None
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value.item())


class IntervalMeter:
    def __init__(self, device: torch.device, *, samples_per_step: int, tokens_per_step: int | None,
                 world_size: int, flops_per_step: int | None, peak_flops: float | None,
                 sync_timer: SyncTimer | None = None, health: GpuHealthSampler | None = None,
                 stragglers: StragglerDetector | None = None) -> None:
        self.device = device
        self.samples_per_step = samples_per_step  # per rank
        self.tokens_per_step = tokens_per_step
        self.world_size = world_size
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.sync_timer = sync_timer
        self.health = health
        self.stragglers = stragglers
        self.steady = StepStats()  # seconds per step of each interval after the first
        self.first_step_s: float | None = None
        self.first_loss: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._loss = torch.zeros((), device=self.device)
        self._steps = 0
        self._data_s = 0.0
        self._start = time.perf_counter()

    def restart_clock(self) -> None:
        self._start = time.perf_counter()

    def add_data_wait(self, seconds: float) -> None:
        self._data_s += seconds

    def add_step(self, loss: torch.Tensor) -> None:
        self._loss += loss  # device op: no host read
        self._steps += 1

    def _blocked_s(self) -> float:
        """Synchronise, then time the loss all-reduce: how long this rank waits for the slowest."""
        synchronize(self.device)
        arrived = time.perf_counter()
        self._mean_loss = float(all_reduce_mean(self._loss / self._steps).item())
        waited = time.perf_counter() - arrived
        return waited + (self.sync_timer.collect_s() if self.sync_timer is not None else 0.0)

    def record(self, step: int, lr: float, grad_norm: torch.Tensor | None) -> dict[str, Any]:
        """Close the interval ending at `step`: the only host reads of device values."""
        blocked = self._blocked_s()
        loss = self._mean_loss
        elapsed = time.perf_counter() - self._start
        mem = memory_stats(self.device)
        health = self.health.fold() if self.health is not None else {}
        local = [elapsed, float(mem.get("peak_mem_bytes") or 0), self._data_s, blocked]
        if self.world_size > 1:  # same length on every rank, with or without NVML
            local += self.health.rank_values(health) if self.health is not None else [math.nan] * len(RANK_KEYS)
        per_rank = gather_floats(local, self.device)
        times = [r[0] for r in per_rank]
        step_s = max(times) / self._steps  # the slowest rank sets the pace of a synchronous step
        record: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": scalar(grad_norm),
            "samples_per_s": self.samples_per_step * self.world_size / step_s,
            "step_ms": step_s * 1e3,
            "data_wait_frac": min(1.0, self._data_s / elapsed) if elapsed > 0 else 0.0,
        }
        if self.world_size > 1:
            record.update(self._per_rank(step, per_rank))
        if self.tokens_per_step:
            record["tokens_per_s"] = self.tokens_per_step * self.world_size / step_s
        if self.flops_per_step:
            record["tflops"] = self.flops_per_step / step_s / 1e12  # per device
            record["mfu"] = mfu(self.flops_per_step, step_s, self.peak_flops)
        record.update({k: v for k, v in mem.items() if v is not None})
        record.update(health)
        if self.first_step_s is None:
            self.first_step_s = elapsed
            self.first_loss = loss
            record["first_step"] = True  # step 1 alone: includes compilation and warm-up
        else:
            self.steady.add(step_s)
        self._reset()
        return record

    def _per_rank(self, step: int, per_rank: list[list[float]]) -> dict[str, Any]:
        n = self._steps
        step_ms = [r[0] / n * 1e3 for r in per_rank]
        sync_ms = [r[3] / n * 1e3 for r in per_rank]
        own_ms = [s - w for s, w in zip(step_ms, sync_ms)]
        out: dict[str, Any] = {
            "samples_per_s_per_device": self.samples_per_step / (max(step_ms) / 1e3),
            "step_ms_ranks": step_ms,
            "data_wait_ms_ranks": [r[2] / n * 1e3 for r in per_rank],
            "sync_wait_ms_ranks": sync_ms,
            "own_ms_ranks": own_ms,
            "sync_wait_ms": statistics.median(sync_ms),
            # Own time, not wall time: the waits in collectives make every rank's wall time equal.
            "straggler_ratio": max(own_ms) / statistics.median(own_ms) if statistics.median(own_ms) > 0 else 1.0,
            "peak_mem_bytes_max_rank": max(r[1] for r in per_rank),
        }
        if self.health is not None:
            for i, key in enumerate(RANK_KEYS):
                out[f"{key}_ranks"] = [r[4 + i] for r in per_rank]
        if self.stragglers is not None:
            named = self.stragglers.update(step, own_ms)
            out["stragglers"] = named
            out["straggler_count"] = len(named)
        return out

    def summary(self, last: dict[str, Any]) -> dict[str, Any]:
        if not len(self.steady):  # a run of one log interval: only the first (warm-up) one exists
            self.steady.add(last["step_ms"] / 1e3)
        times = self.steady.summary_ms()
        median_ms = times["step_ms_median"]
        out: dict[str, Any] = {
            "first_loss": self.first_loss,
            "final_loss": last["loss"],
            "first_step_s": self.first_step_s,
            **times,
            "samples_per_s": self.samples_per_step * self.world_size / (median_ms / 1e3),
            "samples_per_s_per_device": self.samples_per_step / (median_ms / 1e3),
        }
        if self.tokens_per_step:
            out["tokens_per_s"] = self.tokens_per_step * self.world_size / (median_ms / 1e3)
        if self.flops_per_step:
            out["flops_per_step"] = self.flops_per_step
            out["mfu"] = mfu(self.flops_per_step, median_ms / 1e3, self.peak_flops)
            out["peak_flops"] = self.peak_flops
        return out
