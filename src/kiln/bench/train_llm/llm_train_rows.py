"""How `kiln bench train-llm` measures a row in this process (kiln's recipes,
kiln.bench.train_llm.llm_train_kiln, and the plain transformers loop, kiln.bench.peers.plain): each trained
for the bench's steps from the same weights on the same batches, timed step by step.

A row is one short training run: the first step (it compiles) is timed on its own, then every
later step is bracketed by CUDA events in stream order (kiln.timing.StepClock), so the host
never waits on the device mid-run, as in a real training loop. Losses stay on the device until
the run ends. Step times exclude the first `warmup` steps; the figure is their median.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow, set_figures
from kiln.timing import StepClock, synchronize, time_calls


@dataclass
class StepRun:
    losses: list[float]
    step_s: list[float]
    """Seconds of each step after the first."""
    first_step_s: float
    peak_mem_bytes: int | None
    extra: dict[str, Any] = field(default_factory=dict)


def run_steps(step: Callable[[Tensor, Tensor], Tensor], batches: list[tuple[Tensor, Tensor]],
              device: torch.device, base_mem: int) -> StepRun:
    """Train on every batch in order; the loss of each step (read at the end), the seconds of each
    step after the first, and the peak memory above `base_mem` over the whole run."""
    losses: list[Tensor] = []

    def first() -> None:
        losses.append(step(*batches[0]).detach().clone())

    first_s = time_calls(first, calls=1, device=device)
    clock = StepClock(device)
    clock.start()
    for x, y in batches[1:]:
        # A copy: an output of a captured CUDA graph is overwritten by the next replay.
        losses.append(step(x, y).detach().clone())
        clock.mark()
    marks = clock.marks_s()
    synchronize(device)
    step_s = [b - a for a, b in zip([0.0, *marks[:-1]], marks, strict=True)]
    peak = int(torch.cuda.max_memory_allocated(device)) - base_mem if device.type == "cuda" else None
    return StepRun([float(v) for v in torch.stack(losses).float().cpu()], step_s, first_s, peak)


def memory_base(device: torch.device) -> int:
    gc.collect()
    if device.type != "cuda":
        return 0
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def release(device: torch.device) -> None:
    """Free what a row left: garbage, dynamo's compiled code, the CUDA cache."""
    import torch._dynamo

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()


def measure_row(build: Callable[[contextlib.ExitStack], tuple[Callable, dict, int]],
                batches: list[tuple[Tensor, Tensor]], device: torch.device) -> dict[str, Any]:
    """Build a row (`build(stack)` may enter contexts the run needs on `stack`) and train it;
    {status, reason, run: StepRun | None, config, params}. Out of memory is `oom`, any other failure
    `error`; the row's memory is released either way."""
    base = memory_base(device)
    out: dict[str, Any] = {"status": "ok", "reason": None, "run": None, "config": None, "params": None}
    stack = contextlib.ExitStack()
    try:
        step, config, params = build(stack)
        out.update(config=config, params=params)
        out["run"] = run_steps(step, batches, device, base)
    except torch.OutOfMemoryError as exc:
        out.update(status="oom", reason=_short(exc))
    except Exception as exc:  # a row that fails is reported; the next row still runs
        out.update(status="error", reason=f"{type(exc).__name__}: {_short(exc)}")
    finally:
        step = None
        stack.close()
        release(device)
    return out


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]


def in_process_row(run: RowRun, build: Callable[[contextlib.ExitStack], tuple[Callable, dict, int]]) -> TrainRow:
    """One in-process row (`build` as for measure_row) trained on the run's batches, with its figures;
    a non-finite loss makes it an error."""
    spec, ctx = run.spec, run.ctx
    result = measure_row(build, run.batches, ctx.device)
    row = TrainRow(spec.name, spec.kind, status=result["status"], reason=result["reason"], params=result["params"],
                   config=result["config"])
    steps: StepRun | None = result["run"]
    if steps is not None:
        set_figures(row, steps.step_s, ctx, run.opts.warmup)
        row.first_step_s, row.losses = steps.first_step_s, steps.losses
        row.loss_first, row.loss_last, row.peak_mem_bytes = steps.losses[0], steps.losses[-1], steps.peak_mem_bytes
        if not all(np.isfinite(steps.losses)):
            row.status, row.reason = "error", "non-finite loss"
    return row
