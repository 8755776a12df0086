"""Optimizer (AdamW fused on CUDA, SGD) and the warm-up + decay learning-rate schedule."""

from __future__ import annotations

import math

import torch

from kiln.config.schema import Config, OptimConfig
from kiln.distributed.local_optim import ShardLocalAdamW, ShardLocalSGD
from kiln.train.master_adamw import MasterAdamW


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
    if cfg.fused is not None:
        return cfg.fused
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
    purpose: str = "eager",
    shard_local: bool = False,
    master_weights: bool = False,
) -> torch.optim.Optimizer:
    """The implementation follows what runs the update (`purpose`):

    - `eager`: fused AdamW on CUDA (one kernel for all parameters), foreach/for-loop elsewhere;
    - `compiled`: the update is traced by torch.compile (compile.scope=step): foreach with
      `capturable=True` and the LR in a tensor, which dynamo traces without graph breaks and
      inductor fuses (PyTorch recipe "compiling the optimizer"); a fused kernel is opaque to it;
    - `captured`: the update is recorded into a CUDA graph (compile.cudagraphs): `capturable=True`
      (step counts and LR on the device), fused where it would be in eager.

    `lr_as_tensor` keeps the LR in a tensor, so a compiled update does not recompile when the
    schedule changes it and a captured one reads it from the device. `shard_local` (FSDP2, eager
    update): the same optimizer whose step runs on the local shards (kiln.distributed.local_optim).
    `master_weights` (precision.policy=bf16-master): AdamW over fp32 masters of the bf16
    parameters (kiln.train.master_adamw), eager only; config validation refuses the rest. Under
    FSDP2 it updates the local shards itself (`shard_local` is implied)."""
    shard_local = shard_local and purpose == "eager"
    groups = param_groups(model, cfg.weight_decay)
    if master_weights:
        if cfg.name != "adamw" or purpose != "eager":
            raise ValueError("fp32 master weights run kiln's eager AdamW only (see kiln.config.validate)")
        return MasterAdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    lr_as_tensor = lr_as_tensor or purpose != "eager"
    lr: float | torch.Tensor = torch.tensor(cfg.lr, device=device) if lr_as_tensor else cfg.lr
    capturable = purpose != "eager" and device.type == "cuda"
    fused = purpose != "compiled" and _use_fused(cfg, device, param_dtype)
    if cfg.name == "adamw":
        extra: dict = {"fused": True} if fused else {"foreach": capturable or not lr_as_tensor}
        if capturable:
            extra["capturable"] = True
        adamw = ShardLocalAdamW if shard_local else torch.optim.AdamW
        return adamw(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, **extra)
    if cfg.name == "sgd":
        # SGD has no capturable flag; a tensor LR stays on the device only in the fused kernel
        # (foreach turns it into a host scalar) or when compiled.
        on_graph = purpose == "captured" and device.type == "cuda"
        extra = {"fused": True} if on_graph else {"foreach": purpose == "compiled" or not lr_as_tensor}
        sgd = ShardLocalSGD if shard_local else torch.optim.SGD
        return sgd(groups, lr=lr, momentum=cfg.momentum, **extra)
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


def lr_factor_tensor(step: torch.Tensor, total_steps: int, cfg: OptimConfig) -> torch.Tensor:
    """`lr_factor` computed on the device from a float64 step tensor (0-based), so a captured CUDA
    graph can advance the schedule itself: same formula, same float64 arithmetic."""
    one = torch.ones_like(step)
    if cfg.schedule == "constant":
        after = one
    else:
        decay_steps = max(1, total_steps - cfg.warmup_steps)
        progress = ((step - cfg.warmup_steps) / decay_steps).clamp(max=1.0)
        floor = cfg.min_lr_ratio
        if cfg.schedule == "cosine":
            after = floor + (1 - floor) * 0.5 * (1 + torch.cos(math.pi * progress))
        else:
            after = floor + (1 - floor) * (1 - progress)
    if not cfg.warmup_steps:
        return after
    return torch.where(step < cfg.warmup_steps, (step + 1) / cfg.warmup_steps, after)


class DeviceSchedule:
    """The LR schedule advanced on the device: the optimizer's LR tensors are rewritten from a
    device step counter, with no host value involved, so it can live inside a CUDA graph. The
    host-side LambdaLR only keeps its step count (for checkpoints); `sync_from_host` sets the
    device counter from it (at start and after a resume)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler, cfg: OptimConfig, total_steps: int) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler
        self.cfg, self.total_steps = cfg, total_steps
        self.lrs = [group["lr"] for group in optimizer.param_groups]
        if not all(isinstance(lr, torch.Tensor) for lr in self.lrs):
            raise ValueError("DeviceSchedule needs the optimizer's LR in tensors (build_optimizer(lr_as_tensor=True))")
        self.base = [float(b) for b in scheduler.base_lrs]
        self.step = torch.zeros((), dtype=torch.float64, device=self.lrs[0].device)

    def sync_from_host(self) -> None:
        self.step.fill_(float(self.scheduler.last_epoch))

    def advance(self) -> None:
        """Device ops only: step += 1, then each group's LR = base * factor(step)."""
        self.step.add_(1)
        factor = lr_factor_tensor(self.step, self.total_steps, self.cfg)
        for lr, base in zip(self.lrs, self.base):
            lr.copy_(factor * base)

    def host_step(self) -> None:
        """Keep the host scheduler's count in step with the device (no device work)."""
        self.scheduler.last_epoch += 1


def schedule_steps(cfg: Config) -> int:
    """The steps the LR schedule spans: `optim.decay_steps`, or `training.steps` when it is 0."""
    return cfg.optim.decay_steps or cfg.training.steps


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))


def lr_snapshot(optimizer: torch.optim.Optimizer) -> float | torch.Tensor:
    """The LR the next optimizer step will use, taken before it (the step's scheduler update then
    sets the following step's). An LR held in a device tensor is copied on its device, queued
    before the step, so taking it costs no sync: `float()` it when the record is read anyway."""
    lr = optimizer.param_groups[0]["lr"]
    return lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr)
