"""FSDP2 (`fully_shard`): mixed precision, which modules become units, resharding, CPU offload.

Consecutive repeated blocks become units (a unit's parameters are gathered just before it runs
and, for models too large to keep gathered, freed after), then the root takes what is left
(embeddings, head). This is torchtitan's layout with blocks grouped (see UNIT_TARGET_BYTES).

With `distributed.replicate_degree=R` > 1 (HSDP) the units are sharded over a 2-D device mesh
("replicate", "shard"): each of R replicas shards the model over world / R ranks (one node, its
fast links), and FSDP2 all-reduces the reduce-scattered gradient shards across the replicas.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from kiln.config.schema import DistributedConfig
from kiln.distributed.fsdp_one_rank import install_one_rank_unshard
from kiln.errors import ConfigError
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
# work every step, on every rank (hooks, stream events, one reduce per unit), and a step that waits
# for its host waits for all of it, so fewer, larger units make such a step faster
# (the fsdp_host_overhead results: fsdp-zero2 vs fsdp-unit6-auto). Larger units cost
# overlap instead: the first all-gather and the last reduce-scatter run beside no compute;
# kiln.bench.scale.predict puts that below one unit's host work for ViT-B-sized blocks from 8 to 64 GPUs.
# Blocks of >= 64 MiB (most LLMs in bf16) stay one per unit. Units are balanced (6+6, not
# 5+5+2), so every unit gathers at least this much.
UNIT_TARGET_BYTES = 64 * 2**20

# `fsdp_reshard_after_forward=auto` keeps the units gathered from forward to backward when the
# whole model gathers at most this much (about 0.5 B parameters in bf16): the memory resharding
# would save is ~1 % of an 80 GB GPU, while resharding costs, at every world size, one all-gather
# more per unit and step (+33 % of FSDP2's bytes with fp32 reduce-scatters, +50 % with bf16) and
# the host work of re-gathering in backward (fsdp-unit3 vs fsdp-zero2 and fsdp-unit6 vs
# fsdp-unit6-auto in the fsdp_host_overhead results). Larger models are resharded (ZeRO-3), all units
# but the last, unless the run's memory plan keeps them gathered (kiln.train.gpu_plan.KEEP_SHARE).
KEEP_GATHERED_BYTES = 2**30


def unit_blocks(blocks: list[torch.nn.Module], cfg: DistributedConfig, param_bytes: int) -> int:
    """Blocks per FSDP unit: the configured count, or (0) the fewest whose gathered parameters
    reach UNIT_TARGET_BYTES, judged by the largest block (fsdp_units then balances the units)."""
    if cfg.fsdp_unit_blocks > 0 or not blocks:
        return max(1, cfg.fsdp_unit_blocks)
    largest = max(sum(p.numel() for p in b.parameters()) for b in blocks) * param_bytes
    return max(1, min(len(blocks), -(-UNIT_TARGET_BYTES // max(1, largest))))


def _balanced(blocks: list[torch.nn.Module], k: int) -> list[list[torch.nn.Module]]:
    """As many groups of >= k consecutive blocks as fit, the blocks spread evenly over them."""
    if not blocks:
        return []
    n = max(1, len(blocks) // k)
    size, extra = divmod(len(blocks), n)
    groups, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        groups.append(list(blocks[start:end]))
        start = end
    return groups


def reshards_after_forward(cfg: DistributedConfig, gathered_bytes: int) -> bool:
    """Whether FSDP units free their gathered parameters after forward; `gathered_bytes`: all the
    model's parameters as gathered (param dtype)."""
    if cfg.fsdp_reshard_after_forward is None:  # auto
        return gathered_bytes > KEEP_GATHERED_BYTES
    return cfg.fsdp_reshard_after_forward


def fsdp_units(model: torch.nn.Module, blocks: list[torch.nn.Module], cfg: DistributedConfig,
               param_bytes: int = 2) -> list:
    """The FSDP units in forward order: a module, or a list of consecutive blocks sharded as one
    group (fully_shard accepts a list since torch 2.5). `param_bytes`: bytes per gathered element."""
    rule = cfg.fsdp_wrap
    if rule == "auto":
        k = unit_blocks(blocks, cfg, param_bytes)
        if cfg.fsdp_unit_blocks > 0:  # as configured: k per unit, the rest in the last
            groups = [list(blocks[i:i + k]) for i in range(0, len(blocks), k)]
        else:
            groups = _balanced(blocks, k)
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


def device_mesh(cfg: DistributedConfig, device_type: str):
    """The 2-D ("replicate", "shard") mesh of HSDP, or None for FSDP2's default 1-D mesh over all
    ranks. The world size was checked to split evenly (`check_mesh` of the run's strategy decision)."""
    replicas = cfg.replicate_degree
    if replicas <= 1 or not dist.is_initialized():
        return None
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    return init_device_mesh(device_type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))


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
    device: torch.device,
    reshard_after_forward: bool | None = None,
) -> torch.nn.Module:
    """Shard `model` (on `device`, or still on the meta device when its weights are filled after
    sharding: kiln.distributed.materialise) in FSDP2 units over the ranks, or HSDP's 2-D mesh.
    `reshard_after_forward`: what the run's memory plan decided (kiln.train.gpu_plan), the same on
    every rank; None: `reshards_after_forward`'s rule."""
    if not fsdp_available():
        raise ConfigError("distributed.strategy", f"FSDP2 (fully_shard) is not in torch {torch.__version__}",
                          ("ddp", "none"))
    from torch.distributed.fsdp import fully_shard

    kwargs: dict = {"mp_policy": mixed_precision(cfg, policy)}
    mesh = device_mesh(cfg, device.type)  # the run's device: a meta-built model's parameters say `meta`
    if mesh is not None:
        kwargs["mesh"] = mesh
    if cfg.fsdp_cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs["offload_policy"] = CPUOffloadPolicy()
    mp = kwargs["mp_policy"]
    param_bytes = torch.finfo(mp.param_dtype or policy.param_dtype).bits // 8
    units = fsdp_units(model, blocks, cfg, param_bytes)
    if not units:
        log.warning("FSDP: the model has no repeated blocks (distributed.fsdp_wrap=%s); sharding the root as one "
                    "unit, so all parameters are gathered at once", cfg.fsdp_wrap)
    resharded = reshards_after_forward(cfg, sum(p.numel() for p in model.parameters()) * param_bytes) \
        if reshard_after_forward is None else _agreed(reshard_after_forward, device)
    sharded = []
    for i, unit in enumerate(units):
        # The last unit runs first in backward: resharding it after forward would only add an
        # all-gather right away (torchtitan keeps its last layers gathered for the same reason).
        reshard = resharded and i < len(units) - 1
        sharded.append(fully_shard(unit, reshard_after_forward=reshard, **kwargs))
    # The root's own parameters (embeddings, head) stay gathered after forward: they are used
    # again first in backward, so resharding them would only add an all-gather.
    fully_shard(model, reshard_after_forward=not units and resharded, **kwargs)
    _set_forward_prefetch(sharded, cfg.fsdp_forward_prefetch)
    _set_backward_prefetch(sharded, cfg.fsdp_backward_prefetch)
    # One rank: the units' parameters filled by one fused copy each (kiln.distributed.fsdp_one_rank).
    fused = cfg.fsdp_one_rank_fused_copy and install_one_rank_unshard(model) > 0
    # What was chosen, for the run's summary.json (the config's 0 / auto say only how to choose).
    model.kiln_fsdp_layout = {"unit_blocks": [len(u) if isinstance(u, list) else 1 for u in units],
                              "reshard_after_forward": resharded, "forward_prefetch": cfg.fsdp_forward_prefetch,
                              "backward_prefetch": cfg.fsdp_backward_prefetch,
                              "mesh": _mesh_shape(mesh), "param_dtype": _dtype_name(mp.param_dtype),
                              "reduce_dtype": _dtype_name(mp.reduce_dtype), "one_rank_fused_copy": fused}
    return model


def _agreed(reshard: bool, device: torch.device) -> bool:
    """A plan's reshard decision made the same on every rank (resharding if any rank's plan does):
    ranks of different GPU models can plan differently, and FSDP2 units resharded on some ranks
    only would leave the others waiting in backward for their all-gathers."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return reshard
    flag = torch.tensor([int(reshard)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else {v: k for k, v in _DTYPES.items()}.get(dtype, str(dtype))


def _mesh_shape(mesh) -> dict[str, int]:
    """{"replicate": R, "shard": S}: how the ranks hold the model (R = 1 without HSDP)."""
    if mesh is not None:
        return dict(zip(mesh.mesh_dim_names, mesh.shape))
    return {"replicate": 1, "shard": dist.get_world_size() if dist.is_initialized() else 1}


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


def _set_backward_prefetch(units: list, depth: int) -> None:
    """Explicit backward prefetch: each unit issues the all-gathers of the `depth` units that run
    after it in backward (the ones before it in forward), so they overlap its gradient compute."""
    if depth <= 0:
        return
    modules = [_first_module(u) for u in units]
    for i in range(len(modules) - 1, 0, -1):
        module = modules[i]
        module.set_modules_to_backward_prefetch(modules[max(0, i - depth):i][::-1])


def set_gradient_sync(model: torch.nn.Module, enabled: bool) -> None:
    """FSDP2's equivalent of DDP.no_sync for gradient accumulation."""
    model.set_requires_gradient_sync(enabled)
