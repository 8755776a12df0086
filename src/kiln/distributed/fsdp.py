"""FSDP2 (`fully_shard`): mixed precision, which modules become units, resharding, CPU offload.

Each repeated block becomes its own unit (its parameters are gathered just before it runs and
freed after), then the root takes what is left (embeddings, head). This is torchtitan's layout.
"""

from __future__ import annotations

import logging

import torch

from kiln.config.errors import ConfigError
from kiln.config.schema import DistributedConfig
from kiln.precision import PrecisionPolicy

log = logging.getLogger("kiln.distributed")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (public since torch 2.6)
    except ImportError:
        return False
    return True


def _units(model: torch.nn.Module, blocks: list[torch.nn.Module], cfg: DistributedConfig) -> list[torch.nn.Module]:
    rule = cfg.fsdp_wrap
    if rule == "auto":
        return list(blocks)
    if rule == "size":
        units = []
        for name, module in model.named_modules():
            if module is model:
                continue
            n = sum(p.numel() for p in module.parameters())
            # Take the outermost modules that pass the rule; their children are inside them.
            if n >= cfg.fsdp_min_params and not any(name.startswith(u + ".") for u, _ in units):
                units.append((name, module))
        return [m for _, m in units]
    names = {c.strip() for c in rule.split(",") if c.strip()}
    found = {type(m).__name__ for m in model.modules()}
    missing = names - found
    if missing:
        raise ConfigError("distributed.fsdp_wrap", f"no module of class {sorted(missing)} in the model",
                          sorted(found)[:30])
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def mixed_precision(cfg: DistributedConfig, policy: PrecisionPolicy):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.fsdp_param_dtype == "auto":
        param_dtype = policy.autocast_dtype or policy.param_dtype
    else:
        param_dtype = _DTYPES[cfg.fsdp_param_dtype]
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=_DTYPES[cfg.fsdp_reduce_dtype])


def apply_fsdp(
    model: torch.nn.Module,
    blocks: list[torch.nn.Module],
    cfg: DistributedConfig,
    policy: PrecisionPolicy,
) -> torch.nn.Module:
    if not fsdp_available():
        raise ConfigError("distributed.strategy", f"FSDP2 (fully_shard) is not in torch {torch.__version__}",
                          ("ddp", "none"))
    from torch.distributed.fsdp import fully_shard

    kwargs: dict = {"mp_policy": mixed_precision(cfg, policy), "reshard_after_forward": cfg.fsdp_reshard_after_forward}
    if cfg.fsdp_cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs["offload_policy"] = CPUOffloadPolicy()
    units = _units(model, blocks, cfg)
    if not units:
        log.warning("FSDP: the model has no repeated blocks (distributed.fsdp_wrap=%s); sharding the root as one "
                    "unit, so all parameters are gathered at once", cfg.fsdp_wrap)
    for unit in units:
        fully_shard(unit, **kwargs)
    # The root's own parameters (embeddings, head) stay gathered after forward: they are used
    # again first in backward, so resharding them would only add an all-gather.
    root_kwargs = {**kwargs, "reshard_after_forward": False} if units else kwargs
    fully_shard(model, **root_kwargs)
    return model


def set_gradient_sync(model: torch.nn.Module, enabled: bool) -> None:
    """FSDP2's equivalent of DDP.no_sync for gradient accumulation."""
    model.set_requires_gradient_sync(enabled)
