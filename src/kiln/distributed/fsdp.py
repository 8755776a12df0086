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


# `fsdp_unit_blocks=0` groups blocks until a unit gathers this much. Each FSDP2 unit costs host
# work every step (hooks, stream events, per-parameter views): on a 12-block ViT, 13 units -> 5 cut
# the host time of a step by a sixth and 2 units by a third (benchmarks/results/cpu/
# fsdp_host_overhead); and each collective pays a latency that grows with the ring, which is what
# kiln.bench.predict charges at scale. The price is coarser overlap and one more unit gathered at a
# time: 32 MiB keeps that small next to DDP's 25 MiB buckets.
UNIT_TARGET_BYTES = 32 * 2**20


def unit_blocks(blocks: list[torch.nn.Module], cfg: DistributedConfig, param_bytes: int) -> int:
    """Blocks per FSDP unit: the configured count, or (0) the fewest whose gathered parameters
    reach UNIT_TARGET_BYTES, judged by the largest block."""
    if cfg.fsdp_unit_blocks > 0 or not blocks:
        return max(1, cfg.fsdp_unit_blocks)
    largest = max(sum(p.numel() for p in b.parameters()) for b in blocks) * param_bytes
    return max(1, min(len(blocks), -(-UNIT_TARGET_BYTES // max(1, largest))))


def fsdp_units(model: torch.nn.Module, blocks: list[torch.nn.Module], cfg: DistributedConfig,
               param_bytes: int = 2) -> list:
    """The FSDP units in forward order: a module, or a list of consecutive blocks sharded as one
    group (fully_shard accepts a list since torch 2.5). `param_bytes`: bytes per gathered element."""
    rule = cfg.fsdp_wrap
    if rule == "auto":
        k = unit_blocks(blocks, cfg, param_bytes)
        groups = [list(blocks[i:i + k]) for i in range(0, len(blocks), k)]
        return [g[0] if len(g) == 1 else g for g in groups]
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

    kwargs: dict = {"mp_policy": mixed_precision(cfg, policy)}
    if cfg.fsdp_cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs["offload_policy"] = CPUOffloadPolicy()
    mp = kwargs["mp_policy"]
    units = fsdp_units(model, blocks, cfg, torch.finfo(mp.param_dtype or policy.param_dtype).bits // 8)
    if not units:
        log.warning("FSDP: the model has no repeated blocks (distributed.fsdp_wrap=%s); sharding the root as one "
                    "unit, so all parameters are gathered at once", cfg.fsdp_wrap)
    sharded = []
    for i, unit in enumerate(units):
        # The last unit runs first in backward: resharding it after forward would only add an
        # all-gather right away (torchtitan keeps its last layers gathered for the same reason).
        reshard = cfg.fsdp_reshard_after_forward and i < len(units) - 1
        sharded.append(fully_shard(unit, reshard_after_forward=reshard, **kwargs))
    # The root's own parameters (embeddings, head) stay gathered after forward: they are used
    # again first in backward, so resharding them would only add an all-gather.
    fully_shard(model, reshard_after_forward=not units and cfg.fsdp_reshard_after_forward, **kwargs)
    _set_forward_prefetch(sharded, cfg.fsdp_forward_prefetch)
    return model


def _first_module(unit) -> torch.nn.Module:
    """The module that carries a unit's FSDP state (fully_shard on a list returns a list)."""
    return unit[0] if isinstance(unit, list) else unit


def _set_forward_prefetch(units: list, depth: int) -> None:
    """Explicit forward prefetch: each unit issues the all-gathers of the next `depth` units before
    its own forward, so they overlap its compute even when the CPU does not run ahead of the GPU."""
    if depth <= 0:
        return
    modules = [_first_module(u) for u in units]
    for i, module in enumerate(modules[:-1]):
        module.set_modules_to_forward_prefetch(modules[i + 1:i + 1 + depth])


def set_gradient_sync(model: torch.nn.Module, enabled: bool) -> None:
    """FSDP2's equivalent of DDP.no_sync for gradient accumulation."""
    model.set_requires_gradient_sync(enabled)
