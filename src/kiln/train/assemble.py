"""The `apply_*` chain after the model is built and cast: compile -> optimizer -> schedule -> step.

`kiln train` and `kiln bench` both call `build_train_step`, so a benchmark times exactly the step
that training runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from kiln.config.schema import Config
from kiln.distributed.apply import apply_parallel
from kiln.distributed.materialise import materialise
from kiln.precision import PrecisionPolicy, make_grad_scaler, with_precision
from kiln.train.activation_checkpoint import apply_activation_checkpointing, without_plan
from kiln.train.capture import CapturedStep, capture_problem, scaler_problem
from kiln.train.float8 import apply_float8, check_float8, install_scale_precompute
from kiln.train.losses import build_forward_loss
from kiln.train.optim import DeviceSchedule, build_optimizer, build_scheduler, schedule_steps
from kiln.train.step import TrainStep
from kiln.train.swiglu import apply_swiglu_kernel


def build_train_step(
    model: torch.nn.Module,
    task: str,
    blocks: list[torch.nn.Module],
    cfg: Config,
    policy: PrecisionPolicy,
    device: torch.device,
    strategy: str = "none",
    *,
    loss_builder: Callable[[torch.nn.Module], Callable[[Tensor, Tensor], Tensor]] | None = None,
    guard=None,
    sync_timer=None,
    ce_kernel: str = "plain",
    swiglu_kernel: str = "plain",
    initial_values: Callable[[], Iterable[tuple[str, Tensor]]] | None = None,
    reshard_after_forward: bool | None = None,
    activation_checkpointing: str | None = None,
) -> TrainStep | CapturedStep:
    """Compile and parallelise `model` (see kiln.distributed.apply for the order), then build the
    optimizer, LR schedule, grad scaler and the step function around it. `step.model` is the
    model to call (a DDP wrapper under DDP; FSDP2 shards in place).

    `loss_builder(model) -> forward_loss(inputs, targets)` replaces the task's loss (kiln bench
    compile's distillation loss); it gets the model after compile/parallel wrapping. `guard` (a
    kiln.checkpoint.NonFiniteGuard) flags non-finite steps and, in `skip` mode, drops them.
    `sync_timer` (kiln.distributed.sync_timing.SyncTimer) times the DDP gradient all-reduce wait.
    `ce_kernel`, `swiglu_kernel`: the resolved `training.ce_kernel` and `training.swiglu_kernel`
    (kiln.train.features). `initial_values()`: `model` is on the meta device (an FSDP2 run of kiln's
    decoder, kiln.train.build_run): once sharded, each rank's shards are allocated on `device` and
    filled from these full tensors (kiln.distributed.materialise), before the optimizer sees them.
    `reshard_after_forward`: FSDP2's choice as the run's memory plan made it (None: the size rule).
    `activation_checkpointing`: the mode as the memory plan resolved `auto` (None: the config's, `auto`
    there meaning none).

    Before compile and parallelism (torchtitan's order): the SwiGLU kernel (kiln.train.swiglu),
    float8 linear layers in the blocks
    (`precision.float8`, kiln.train.float8), then activation checkpointing of each block
    (`training.activation_checkpointing`, kiln.train.activation_checkpoint)."""
    check_float8(cfg.precision.float8, device, cfg.precision.policy)  # the trainer checked; other callers too
    apply_swiglu_kernel(model, swiglu_kernel)
    apply_float8(model, blocks, cfg.precision.float8, fsdp=strategy == "fsdp")  # tensorwise: float8 all-gathers
    ac = activation_checkpointing or without_plan(cfg.training.activation_checkpointing)
    apply_activation_checkpointing(blocks, ac)
    model, grad_sync = apply_parallel(model, blocks, cfg, policy, device, strategy, sync_timer, reshard_after_forward)
    if initial_values is not None:
        materialise(model, device, initial_values())
    build = loss_builder if loss_builder is not None else (lambda m: build_forward_loss(m, task, ce_kernel))
    reason = capture_problem(device, strategy) if cfg.compile.cudagraphs else None
    captured = cfg.compile.cudagraphs and reason is None
    forward_loss = with_precision(build(model), policy, device, cache=not captured)
    # The optimizer implementation follows what runs the update (see build_optimizer): traced by
    # torch.compile (scope step), recorded into kiln's CUDA graph, or called eagerly.
    compiled_update = cfg.compile.enabled and cfg.compile.scope == "step"
    purpose = "compiled" if compiled_update else "captured" if captured else "eager"
    shard_local = strategy == "fsdp" and cfg.distributed.fsdp_local_update
    optimizer = build_optimizer(model, cfg.optim, device, param_dtype=policy.param_dtype, purpose=purpose,
                                shard_local=shard_local, master_weights=policy.master_weights)
    if cfg.precision.float8 != "none" and purpose == "eager":  # the scales of float8 all-gathers, once per step
        install_scale_precompute(model, optimizer)
    horizon = schedule_steps(cfg)
    scheduler = build_scheduler(optimizer, cfg.optim, horizon)
    scaler = make_grad_scaler(policy, device)
    step = TrainStep(
        model,
        forward_loss,
        optimizer,
        scheduler,
        grad_clip=cfg.training.grad_clip,
        scaler=scaler,
        compile_cfg=cfg.compile,
        grad_sync=grad_sync,
        guard=guard,
    )
    if not cfg.compile.cudagraphs:
        return step
    reason = reason or scaler_problem(optimizer, scaler)
    schedule = DeviceSchedule(optimizer, scheduler, cfg.optim, horizon) if reason is None else None
    return CapturedStep(step, schedule, reason=reason)
