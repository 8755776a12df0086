"""The in-process rows of `kiln bench train-llm`: a kiln recipe (built by kiln train's own build and
apply path; `KILN_ROWS`, its row kind) and the plain transformers loop (its peer,
kiln.bench.peers.plain), each trained for the bench's steps from the same weights on the same
batches, timed step by step.

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

from kiln.bench.llm_train_result import RowRun, TrainRow, set_figures
from kiln.bench.peers.base import Bench, NothingPrepared, PeerDefaults
from kiln.compile_cache import compile_cache_dir
from kiln.compile_defaults import apply_measured_defaults
from kiln.config import load_config
from kiln.config.schema import Config
from kiln.distributed.strategy import resolve_strategy
from kiln.models import build_model
from kiln.precision import apply_precision, resolve_precision, tf32_enabled
from kiln.timing import StepClock, synchronize, time_calls
from kiln.train.assemble import build_train_step
from kiln.train.attention import attention_backend
from kiln.train.features import resolve_features
from kiln.train.runtime import deterministic_mode, resolve_device, seed_everything


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


def _process_group(device: torch.device, stack: contextlib.ExitStack) -> None:
    """A one-rank process group for a recipe that names a DDP/FSDP2 wrapper (as `kiln train` run by
    torchrun with one process has), on a free local port, destroyed when the row ends (later rows
    run without one, as a plain `kiln train` does)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    stack.callback(dist.destroy_process_group)


@dataclass(frozen=True)
class _Shape:
    """What the feature checks read from a data source: the bench feeds its own batches."""

    samples_per_batch: int
    tokens_per_batch: int


def kiln_step(overrides: list[str] | Config, stack: contextlib.ExitStack):
    """kiln's training step for a config (or overrides on the default config), built the way
    `kiln train` builds it (precision, measured compile defaults, model, strategy, features,
    `build_train_step`), with the contexts the trainer runs its loop under entered on `stack`;
    returns the step, the resolved config (as a dict, with the strategy and features chosen) and
    the parameter count."""
    import copy
    import dataclasses

    cfg = copy.deepcopy(overrides) if isinstance(overrides, Config) else load_config(None, overrides)
    device = resolve_device(cfg.training.device)
    policy = resolve_precision(cfg.precision.policy, device)
    wrapped = cfg.distributed.strategy in ("ddp", "fsdp")
    if wrapped:
        _process_group(device, stack)
    note = apply_measured_defaults(cfg, device.type, 1, launched=wrapped)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model, device=device)
    model = apply_precision(built.module.to(device), policy)
    num_params = sum(p.numel() for p in model.parameters())
    param_bytes = torch.finfo(policy.param_dtype).bits // 8
    strategy, reason = resolve_strategy(cfg, 1, num_params, param_bytes, device, launched=wrapped)
    shape = _Shape(cfg.data.batch_size, cfg.data.batch_size * cfg.data.seq_len)
    features = resolve_features(cfg, built, model, policy, device, shape)
    stack.enter_context(tf32_enabled(cfg.precision.tf32))
    stack.enter_context(deterministic_mode(cfg.training.deterministic))
    stack.enter_context(compile_cache_dir(cfg.compile.cache_dir if cfg.compile.enabled else "torch"))
    stack.enter_context(attention_backend(cfg.model.attention))
    step_fn = build_train_step(model, built.task, built.blocks, cfg, policy, device, strategy=strategy,
                               ce_kernel=features["ce_kernel"], swiglu_kernel=features["swiglu_kernel"])

    def step(x: Tensor, y: Tensor) -> Tensor:
        return step_fn([(x, y)])[0]

    resolved = {"config": dataclasses.asdict(cfg), "strategy": strategy, "strategy_reason": reason,
                "compile_note": note, "features": features, "capture": getattr(step_fn, "capture_status", None)}
    return step, resolved, num_params


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
    if spec.kind == "kiln":
        row.overrides = list(spec.overrides)
    steps: StepRun | None = result["run"]
    if steps is not None:
        set_figures(row, steps.step_s, ctx, run.opts.warmup)
        row.first_step_s, row.losses = steps.first_step_s, steps.losses
        row.loss_first, row.loss_last, row.peak_mem_bytes = steps.losses[0], steps.losses[-1], steps.peak_mem_bytes
        if not all(np.isfinite(steps.losses)):
            row.status, row.reason = "error", "non-finite loss"
    return row


class KilnRecipeRows(PeerDefaults):
    """kiln's recipes as a row kind of `kiln bench train-llm`, shaped as a peer (kiln.bench.peers.base):
    the bench's base config plus the recipe's overrides, built by kiln train's own path. The recipes
    are checked as kiln train's configs while the options are built."""

    name = "kiln"
    bench: Bench = "train-llm"

    def run(self, prepared: NothingPrepared, run: RowRun) -> list[TrainRow]:
        overrides = [*run.ctx.base_overrides, *run.spec.overrides]
        return [in_process_row(run, lambda stack: kiln_step(overrides, stack))]


KILN_ROWS = KilnRecipeRows()
