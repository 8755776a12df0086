"""What one training step sends over the network under DDP or FSDP2, collective by collective.

Computed from the model built on the meta device (no memory, no compute) with the same rules the
wrappers use, so `kiln bench comm` measures bandwidth at the sizes the run really communicates and
`kiln.bench.scale.predict` can cost each collective:

- DDP: gradient buckets as DDP forms them once it has seen a backward (its own
  `_compute_bucket_assignment_by_size` over the parameters in gradient-ready order, capped at
  `distributed.ddp_bucket_cap_mb`), all-reduced in that order; the bytes are the gradient dtype's
  (the parameter dtype), or 2 per element under a bf16/fp16 hook.
- FSDP2: per unit (kiln.distributed.fsdp.fsdp_units) one all-gather of the parameters in the
  compute dtype before forward, another before backward unless the unit stays gathered (the root
  and the last unit, or every unit when `fsdp_reshard_after_forward` resolves to false), and one
  reduce-scatter of the gradients in `fsdp_reduce_dtype`.

Sizes follow nccl-tests' convention: all-reduce counts the buffer, all-gather its output and
reduce-scatter its input, i.e. the full unsharded bytes in all three cases (FSDP2's per-rank padding
to a multiple of the world size is ignored: at most world_size - 1 elements per parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.config.schema import Config
from kiln.distributed.fsdp import fsdp_units, mixed_precision, reshards_after_forward
from kiln.models import build_model
from kiln.precision import resolve_precision

_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Collective:
    op: str
    """`all_reduce`, `all_gather` or `reduce_scatter`."""
    nbytes: int
    """nccl-tests size: the full (unsharded) buffer in bytes."""
    phase: str
    """`forward` (needed before the unit's forward), `backward` (needed before the unit's backward,
    or produced by it: a bucket's all-reduce / a unit's reduce-scatter)."""
    share: float
    """The share of all parameters this collective carries: the model's compute is apportioned to
    units and buckets by it (a dense layer's FLOPs are proportional to its parameters)."""
    label: str


@dataclass(frozen=True)
class StepTraffic:
    strategy: str
    collectives: tuple[Collective, ...]
    num_params: int

    def bytes_of(self, op: str) -> int:
        return sum(c.nbytes for c in self.collectives if c.op == op)

    def sizes(self) -> dict[tuple[str, int], int]:
        """{(op, nbytes): how many such collectives per step}."""
        out: dict[tuple[str, int], int] = {}
        for c in self.collectives:
            out[(c.op, c.nbytes)] = out.get((c.op, c.nbytes), 0) + 1
        return out


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def ddp_traffic(model: torch.nn.Module, cfg: Config, grad_bytes: int) -> StepTraffic:
    import torch.distributed as dist

    params = _trainable(model)
    total = sum(p.numel() for p in params) or 1
    wire = 2 if cfg.distributed.ddp_comm_hook in ("bf16", "fp16") else grad_bytes
    cap = int(cfg.distributed.ddp_bucket_cap_mb * 2**20)
    # After its first backward DDP rebuilds its buckets in the order gradients became ready
    # (backward: the last parameters first), every one capped at bucket_cap_mb since kiln passes it
    # explicitly (DDP's 1 MiB first bucket applies only to its default). A bucket closes once it
    # reaches the cap. DDP sizes buckets on the gradient dtype; a comm hook only changes the wire.
    backward = list(reversed(params))
    sized = [torch.empty(p.shape, dtype={4: torch.float32, 2: torch.bfloat16}[grad_bytes], device="meta")
             for p in backward]
    buckets, _ = dist._compute_bucket_assignment_by_size(sized, [cap], [False] * len(sized))
    collectives = []
    for i, indices in enumerate(buckets):
        numel = sum(backward[j].numel() for j in indices)
        collectives.append(Collective("all_reduce", numel * wire, "backward", numel / total,
                                      f"bucket {i + 1}/{len(buckets)}"))
    return StepTraffic("ddp", tuple(collectives), total)


def fsdp_traffic(model: torch.nn.Module, blocks: list[torch.nn.Module], cfg: Config, param_bytes: int) -> StepTraffic:
    d = cfg.distributed
    reduce_bytes = _DTYPE_BYTES[d.fsdp_reduce_dtype]
    units = fsdp_units(model, blocks, cfg.distributed, param_bytes)
    counted: set[int] = set()
    sizes = []
    for unit in units:
        members = unit if isinstance(unit, list) else [unit]
        numel = 0
        for m in members:
            for p in m.parameters():
                if p.requires_grad and id(p) not in counted:
                    counted.add(id(p))
                    numel += p.numel()
        sizes.append(numel)
    params = _trainable(model)
    total = sum(p.numel() for p in params) or 1
    root = sum(p.numel() for p in params if id(p) not in counted)
    fwd, bwd = [], []
    if root:
        fwd.append(Collective("all_gather", root * param_bytes, "forward", root / total, "root"))
    for i, numel in enumerate(sizes):
        label = f"unit {i + 1}/{len(sizes)}"
        fwd.append(Collective("all_gather", numel * param_bytes, "forward", numel / total, label))
    reshards = reshards_after_forward(d, sum(p.numel() for p in model.parameters()) * param_bytes)
    for i in reversed(range(len(sizes))):
        label = f"unit {i + 1}/{len(sizes)}"
        resharded = reshards and i < len(sizes) - 1
        if resharded:
            bwd.append(Collective("all_gather", sizes[i] * param_bytes, "backward", sizes[i] / total, label))
        bwd.append(Collective("reduce_scatter", sizes[i] * reduce_bytes, "backward", sizes[i] / total, label))
    if root:
        bwd.append(Collective("reduce_scatter", root * reduce_bytes, "backward", root / total, "root"))
    return StepTraffic("fsdp", tuple(fwd + bwd), total)


def step_traffic(cfg: Config, strategy: str) -> StepTraffic:
    """The collectives of one optimizer step of `cfg`'s model under `strategy` (`ddp` or `fsdp`),
    from a model built on the meta device."""
    policy = resolve_precision(cfg.precision.policy, torch.device("cpu"))
    try:
        with torch.device("meta"):
            built = build_model(cfg.model)
    except Exception:  # a user factory that cannot build on meta: build it for real, once
        built = build_model(cfg.model)
    param_bytes = torch.finfo(policy.param_dtype).bits // 8
    if strategy == "ddp":
        return ddp_traffic(built.module, cfg, param_bytes)
    if strategy == "fsdp":
        mp = mixed_precision(cfg.distributed, policy)
        gathered = torch.finfo(mp.param_dtype or policy.param_dtype).bits // 8
        return fsdp_traffic(built.module, built.blocks, cfg, gathered)
    raise ValueError(f"no traffic model for strategy {strategy!r}")
