"""The profiler window: a Trainer step hook that profiles steps of the run kiln train runs.

Steps: 1 (the first, compiling one, never profiled) -> `warmup` (>= 1; the last is the
profiler's own warm-up) -> `steps` timed with
torch.profiler (CPU + CUDA activity, no shapes or stacks: those add host time per op and would
widen the very gaps being measured) -> `memory_steps` with memory profiling and the CUDA
allocator history -> one last step, where the trainer logs and finishes. The device is
synchronised at the window's edges so every kernel of the window lands in the trace.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from kiln.noise import filtered_fds
from kiln.profile.memory_window import CudaMemoryHistory, memory_by_category, na
from kiln.timing import synchronize


def activities(device: torch.device) -> list:
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def recorded_window(device: torch.device, label: str, body, trace_path: Path) -> float:
    """`body()` under torch.profiler inside a `label` range, the device synchronised before and after
    (every kernel of the window lands in the trace); the trace goes to `trace_path`. Returns the
    window's wall seconds. The inference windows of `kiln bench llm` (decode steps, prefills)."""
    from torch.profiler import profile, record_function

    synchronize(device)
    with profile(activities=activities(device)) as prof:
        started = time.perf_counter()
        with record_function(label):
            body()
        synchronize(device)
        wall = time.perf_counter() - started
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))
    return wall


def _quiet(call) -> None:
    """Start or stop the profiler with its native `USDT:` probe lines sent to dependencies.log, not
    the console (kiln.noise); other output passes through."""
    with filtered_fds():
        call()


class ProfilerWindow:
    def __init__(self, out: Path, device: torch.device, *, warmup: int, steps: int, memory_steps: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.out = out
        self.device = device
        self.first_active = 2 + warmup
        self.last_active = 1 + warmup + steps
        self.last_memory = self.last_active + memory_steps
        self.steps = steps
        suffix = f"_rank{rank}" if world_size > 1 else ""
        self.trace_path = out / f"trace{suffix}.pt.trace.json.gz"
        self.snapshot_path = out / f"memory_snapshot{suffix}.pickle"
        why = "memory_steps is 0" if memory_steps == 0 else "the run stopped before the memory window"
        self.memory: dict[str, Any] = {"by_category": na(why), "cuda_snapshot": na(why)}
        self.window_s: float | None = None
        self._prof: Any = None
        self._history = CudaMemoryHistory(device)
        self._started = 0.0

    @property
    def total_steps(self) -> int:
        return self.last_memory + 1

    def __call__(self, step: int) -> None:
        """Runs after optimizer step `step` (kiln.train.Trainer's step_hook)."""
        from torch.profiler import profile, schedule

        if step == self.first_active - 2:
            # One profiler warm-up step (CUPTI's start-up cost stays out of the window), then the
            # window; the schedule also marks ProfilerStep#N boundaries in the trace.
            self._prof = profile(activities=activities(self.device),
                                 schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1),
                                 on_trace_ready=lambda p: p.export_chrome_trace(str(self.trace_path)))
            _quiet(self._prof.start)
        elif step == self.first_active - 1:
            synchronize(self.device)
            _quiet(self._prof.step)  # the schedule starts recording here (a native `USDT:` line)
            self._started = time.perf_counter()
        elif self.first_active <= step < self.last_active:
            self._prof.step()
        elif step == self.last_active:
            synchronize(self.device)
            self.window_s = time.perf_counter() - self._started
            _quiet(self._prof.step)  # the window's last step: the schedule saves the trace
            _quiet(self._prof.stop)
            self._prof = None
            if self.last_memory > self.last_active:
                try:
                    self._history.start()
                    self._prof = profile(activities=activities(self.device), profile_memory=True,
                                         record_shapes=True, with_stack=True)
                    _quiet(self._prof.start)
                except Exception as exc:  # the timing results stand; memory is reported as missing
                    self._memory_failed(exc)
        elif step == self.last_memory and self._prof is not None:
            synchronize(self.device)
            try:
                _quiet(self._prof.stop)
                self.memory = {"by_category": memory_by_category(self._prof, self.device),
                               "cuda_snapshot": self._history.stop(self.snapshot_path)}
            except Exception as exc:
                self._memory_failed(exc)
            self._prof = None

    def _memory_failed(self, exc: Exception) -> None:
        reason = f"memory window failed ({type(exc).__name__}: {exc})"
        self.memory = {"by_category": na(reason), "cuda_snapshot": na(reason)}
        if self._history.active:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._history.active = False
        if self._prof is not None:
            with contextlib.suppress(Exception):  # already failed; stopping is best effort
                _quiet(self._prof.stop)
            self._prof = None

    def close(self) -> None:
        """Stops a profiler left running by a failed run (nothing is exported then)."""
        if self._prof is not None:
            _quiet(self._prof.stop)
            self._prof = None
