"""Parallelism and compilation together, in the order current PyTorch recommends:

- DDP: wrap first, then compile the wrapped model; dynamo's DDPOptimizer splits the graph at
  bucket boundaries so gradient all-reduce overlaps backward (torch._dynamo.config.optimize_ddp).
- FSDP2: compile each block, then `fully_shard` each block and the root (torchtitan's order);
  the all-gathers stay outside the compiled regions, which keeps graphs small and reusable.
`distributed.compile_strategy` overrides the choice (`whole` or `per_block`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from kiln.compile import apply_compile, compile_kwargs
from kiln.config.schema import Config
from kiln.distributed.ddp import apply_ddp
from kiln.distributed.fsdp import apply_fsdp, set_gradient_sync
from kiln.distributed.sync_timing import SyncTimer
from kiln.precision import PrecisionPolicy

GradSync = Callable[[bool], contextlib.AbstractContextManager]


def _no_grad_sync(_: bool) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _compile_blocks(blocks: list[torch.nn.Module], cfg: Config) -> None:
    kwargs = compile_kwargs(cfg.compile)
    for block in blocks:
        block.compile(**kwargs)


def apply_parallel(
    model: torch.nn.Module,
    blocks: list[torch.nn.Module],
    cfg: Config,
    policy: PrecisionPolicy,
    device: torch.device,
    strategy: str,
    sync_timer: SyncTimer | None = None,
    reshard_after_forward: bool | None = None,
) -> tuple[torch.nn.Module, GradSync]:
    """Returns the model to call and a `grad_sync(is_last_micro_step)` context factory that
    skips gradient communication on all but the last micro-step of an accumulation. Under DDP a
    `sync_timer` times the wait in the gradient all-reduce (kiln.distributed.sync_timing); under
    FSDP2 `reshard_after_forward` is the memory plan's decision (None: kiln.distributed.fsdp's rule)."""
    module_compile = cfg.compile.enabled and cfg.compile.scope == "model"
    choice = cfg.distributed.compile_strategy
    per_block = module_compile and blocks and (
        cfg.compile.regional or choice == "per_block" or (choice == "auto" and strategy == "fsdp")
    )
    if strategy == "none":
        apply_compile(model, cfg.compile, blocks)
        return model, _no_grad_sync
    if per_block:
        _compile_blocks(blocks, cfg)
    if strategy == "ddp":
        wrapped = apply_ddp(model, cfg.distributed, device, cfg.training.grad_accum_steps, sync_timer)
        if module_compile and not per_block:
            wrapped.compile(**compile_kwargs(cfg.compile))

        def ddp_sync(is_last: bool) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext() if is_last else wrapped.no_sync()

        return wrapped, ddp_sync
    if strategy == "fsdp":
        sharded = apply_fsdp(model, blocks, cfg.distributed, policy, device, reshard_after_forward)
        if module_compile and not per_block:
            sharded.compile(**compile_kwargs(cfg.compile))

        # set_requires_gradient_sync walks every submodule (model.modules()) on each call; without
        # accumulation it would set True on every step, so it is called only when the value changes
        # (kiln is its only caller; FSDP2 starts with gradient sync on).
        synced = [True]

        @contextlib.contextmanager
        def fsdp_sync(is_last: bool):
            if is_last != synced[0]:
                set_gradient_sync(sharded, is_last)
                synced[0] = is_last
            yield

        return sharded, fsdp_sync
    raise ValueError(f"unknown strategy {strategy!r}")
