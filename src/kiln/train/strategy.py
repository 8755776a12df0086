"""Which strategy a run uses, and why: `auto` picks FSDP when one device could not hold the
model's training state comfortably, DDP otherwise. A decision of the run's plan (kiln.train.plan,
build_run, the launcher's checks); kiln.distributed applies the wrapper it names."""

from __future__ import annotations

import torch

from kiln.config.schema import Config
from kiln.errors import ConfigError

# Share of device memory the training state (params + grads + optimizer) may take before `auto`
# shards it; the rest is for activations, workspace and fragmentation.
STATE_BUDGET = 0.5


def training_state_bytes(num_params: int, param_bytes: int, optimizer: str) -> int:
    """Parameters + gradients (param dtype) + optimizer state (fp32: AdamW 2 moments, SGD 1)."""
    moments = 2 if optimizer == "adamw" else 1
    return num_params * (2 * param_bytes + 4 * moments)


def device_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def check_mesh(replicate_degree: int, world_size: int) -> None:
    """ConfigError unless `distributed.replicate_degree` replicas split `world_size` ranks evenly."""
    if replicate_degree > 1 and world_size % replicate_degree:
        raise ConfigError("distributed.replicate_degree", f"{replicate_degree} replicas cannot split {world_size} "
                          f"ranks evenly; use a divisor of the world size",
                          [str(d) for d in range(1, world_size + 1) if world_size % d == 0])


def wraps_one_rank(cfg: Config, world_size: int, launched: bool) -> bool:
    """A one-rank job that still applies a DDP/FSDP wrapper: launched by torchrun (kiln's launcher
    or plain) with `distributed.strategy` ddp or fsdp named."""
    return world_size == 1 and launched and cfg.distributed.strategy in ("ddp", "fsdp")


def resolve_strategy(cfg: Config, world_size: int, num_params: int, param_bytes: int,
                     device: torch.device, *, launched: bool = False) -> tuple[str, str]:
    """(strategy, reason). One process is `none`, except a 1-rank torchrun job that names `ddp` or
    `fsdp`: it applies the wrapper, which is how `kiln bench scale` measures a strategy's own cost
    at one rank (the reference its N-rank points are compared with)."""
    chosen = cfg.distributed.strategy
    check_mesh(cfg.distributed.replicate_degree, world_size)
    if world_size == 1:
        if wraps_one_rank(cfg, world_size, launched):
            return chosen, f"distributed.strategy={chosen} on one rank (the wrapper's own cost, no peers)"
        if chosen in ("ddp", "fsdp"):
            return "none", f"distributed.strategy={chosen} with one process: nothing to parallelise"
        return "none", "one process"
    if chosen == "none":
        raise ConfigError("distributed.strategy", f"'none' runs one process, but the job has {world_size}",
                          ("ddp", "fsdp", "auto"))
    state = training_state_bytes(num_params, param_bytes, cfg.optim.name)
    if chosen != "auto":
        return chosen, f"distributed.strategy={chosen}"
    mem = device_memory_bytes(device)
    gib = state / 2**30
    if mem is None:
        return "ddp", f"auto: training state {gib:.2f} GiB; device memory unknown (CPU), replicating with DDP"
    if state > STATE_BUDGET * mem:
        return "fsdp", (f"auto: training state {gib:.1f} GiB > {STATE_BUDGET:.0%} of {mem / 2**30:.0f} GiB per device, "
                        "sharding with FSDP2")
    return "ddp", f"auto: training state {gib:.2f} GiB fits in {STATE_BUDGET:.0%} of {mem / 2**30:.0f} GiB, DDP"
