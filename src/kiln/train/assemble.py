"""The `apply_*` chain after the model is built and cast: compile -> optimizer -> schedule -> step.

`kiln train` and `kiln bench` both call `build_train_step`, so a benchmark times exactly the step
that training runs.
"""

from __future__ import annotations

import torch

from kiln.compile import apply_compile
from kiln.config.schema import Config
from kiln.precision import PrecisionPolicy, make_grad_scaler, with_precision
from kiln.train.losses import build_forward_loss
from kiln.train.optim import build_optimizer, build_scheduler
from kiln.train.step import TrainStep


def build_train_step(
    model: torch.nn.Module,
    task: str,
    blocks: list[torch.nn.Module],
    cfg: Config,
    policy: PrecisionPolicy,
    device: torch.device,
) -> TrainStep:
    """Compile `model` per cfg.compile (in place for scope `model`), then build the optimizer,
    LR schedule, grad scaler and the step function around it."""
    apply_compile(model, cfg.compile, blocks)
    forward_loss = with_precision(build_forward_loss(model, task), policy, device)
    # A compiled optimizer step reads the LR from a tensor, so the schedule causes no recompiles.
    lr_as_tensor = cfg.compile.enabled and cfg.compile.scope == "step"
    optimizer = build_optimizer(model, cfg.optim, device, lr_as_tensor=lr_as_tensor, param_dtype=policy.param_dtype)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.training.steps)
    return TrainStep(
        model,
        forward_loss,
        optimizer,
        scheduler,
        grad_clip=cfg.training.grad_clip,
        scaler=make_grad_scaler(policy, device),
        compile_cfg=cfg.compile,
    )
