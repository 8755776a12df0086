"""Optimizer (AdamW fused on CUDA, SGD) and the warm-up + decay learning-rate schedule."""

from __future__ import annotations

import math

import torch

from kiln.config.schema import OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; leave biases and norm scales (1-D tensors) undecayed."""
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _use_fused(cfg: OptimConfig, device: torch.device, param_dtype: torch.dtype) -> bool:
    if cfg.fused == "true":
        return True
    if cfg.fused == "false":
        return False
    # Fused AdamW is one kernel for all parameters on CUDA; on CPU torch's fused path exists but
    # is not faster than foreach for small models, so `auto` keeps it for CUDA.
    return device.type == "cuda" and param_dtype in (torch.float32, torch.bfloat16, torch.float16)


def build_optimizer(
    model: torch.nn.Module,
    cfg: OptimConfig,
    device: torch.device,
    *,
    lr_as_tensor: bool = False,
    param_dtype: torch.dtype = torch.float32,
) -> torch.optim.Optimizer:
    """`lr_as_tensor` keeps the LR in a tensor so a compiled optimizer step does not recompile
    when the scheduler changes it."""
    groups = param_groups(model, cfg.weight_decay)
    lr: float | torch.Tensor = torch.tensor(cfg.lr, device=device) if lr_as_tensor else cfg.lr
    if cfg.name == "adamw":
        fused = _use_fused(cfg, device, param_dtype)
        extra: dict = {"fused": True} if fused else {"foreach": not lr_as_tensor}
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, **extra)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, foreach=not lr_as_tensor)
    raise ValueError(f"unknown optimizer {cfg.name!r}")


def lr_factor(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak LR at `step` (0-based): linear warm-up, then cosine/linear/constant."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    floor = cfg.min_lr_ratio
    if cfg.schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (1 - floor) * (1 - progress)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)
