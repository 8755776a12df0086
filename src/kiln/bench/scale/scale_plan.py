"""`kiln bench scale`'s plan: which (variant, world size) points run, which are skipped and why.

Everything here checks input and decides; nothing launches. A variant is a strategy plus config
overrides (`ddp`, `fsdp`, or named ones from `--variant NAME=STRATEGY[,KEY=VALUE...]`); the
one-process run without any wrapper (`none` at one rank) is always planned: it is the baseline of
every efficiency when 1 is among the rank counts. Weak scaling keeps the per-rank batch
(`data.batch_size`); strong scaling keeps the global batch and, for the step-time breakdown, also
runs each variant at one rank with the smaller per-rank batch of each N (role `reference`).

Rank counts that start above 1 (`--nprocs 2,4` for a model one GPU cannot hold, such as an 8B)
plan no 1-rank point at all: each variant's efficiency is then against its own point at the
smallest rank count (kiln.bench.scale.scale_analysis).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kiln.config.schema import Config
from kiln.errors import ConfigError

STRATEGIES = ("ddp", "fsdp")
# The seed's validate_scaling_efficiency thresholds (2/4/8 GPUs: 85/80/75 %).
DEFAULT_THRESHOLDS = {2: 0.85, 4: 0.80, 8: 0.75}
DEFAULT_PREDICT_WORLDS = (16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Variant:
    name: str
    strategy: str
    overrides: tuple[str, ...] = ()

    def config_overrides(self) -> list[str]:
        return [*self.overrides, f"distributed.strategy={self.strategy}"]


BASELINE = Variant("none", "none")


@dataclass(frozen=True)
class Point:
    variant: Variant
    world: int
    batch: int
    """Per-rank micro-batch (data.batch_size)."""
    role: str = "point"
    """`baseline` (none at one rank), `point`, or `reference` (strong scaling: one rank, batch B/N)."""
    skip: str | None = None

    @property
    def name(self) -> str:
        suffix = f"_b{self.batch}" if self.role == "reference" else ""
        return f"{self.variant.name}_w{self.world}{suffix}"


@dataclass
class ScalePlan:
    cfg: Config
    variants: list[Variant]
    nprocs: list[int]
    mode: str
    thresholds: dict[int, float]
    points: list[Point] = field(default_factory=list)
    device_type: str = "cpu"
    slots: int = 1
    """Ranks this machine can host: visible GPUs, or CPU cores for gloo."""

    @property
    def comm_world(self) -> int:
        """The largest world size that runs here (>= 2), for the bandwidth step; 0 if none."""
        runnable = [n for n in self.nprocs if n >= 2 and n <= self.slots]
        return max(runnable, default=0)


def parse_nprocs(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ConfigError("--nprocs", f"expected comma-separated rank counts like 1,2,4,8, got {text!r}") from None
    if not values or values[0] < 1:
        raise ConfigError("--nprocs", f"rank counts must be >= 1, got {text!r}")
    return values


def parse_thresholds(text: str) -> dict[int, float]:
    """`2:85,4:80,8:75` (percent) -> {2: 0.85, ...}; fractions (0.85) are accepted too."""
    out: dict[int, float] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        world, sep, value = item.partition(":")
        try:
            n, v = int(world), float(value)
        except ValueError:
            raise ConfigError("--thresholds", f"expected WORLD:PERCENT items like 2:85,4:80, got {item!r}") from None
        if not sep or n < 1 or not 0 < v <= 100:
            raise ConfigError("--thresholds", f"expected WORLD:PERCENT with WORLD >= 1 and 0 < PERCENT <= 100, got {item!r}")
        out[n] = v / 100 if v > 1 else v
    return out


def threshold_for(world: int, thresholds: dict[int, float]) -> float | None:
    """The bar at `world`: its own, or beyond the largest given world that one (the seed's 75 % at
    8 holds for 16+ too); none below the smallest."""
    if world in thresholds:
        return thresholds[world]
    below = [n for n in thresholds if n < world]
    return thresholds[max(below)] if below and world > max(thresholds) else None


def parse_strategies(text: str) -> list[Variant]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise ConfigError("--strategies", f"unknown strategy {bad[0] if bad else text!r}", STRATEGIES)
    return [Variant(s, s) for s in dict.fromkeys(names)]


def parse_variant(text: str) -> Variant:
    """`NAME=STRATEGY[,KEY=VALUE...]`, e.g. `fsdp-zero2=fsdp,distributed.fsdp_reshard_after_forward=false`."""
    name, sep, rest = text.partition("=")
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    if not sep or not name.strip() or not parts:
        raise ConfigError("--variant", f"expected NAME=STRATEGY[,KEY=VALUE...], got {text!r}")
    if not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError("--variant", f"name {name!r} may hold letters, digits, '-', '_' and '.' only")
    strategy, overrides = parts[0], tuple(parts[1:])
    if strategy not in STRATEGIES:
        raise ConfigError("--variant", f"{text!r}: unknown strategy {strategy!r}", STRATEGIES)
    for o in overrides:
        if "=" not in o:
            raise ConfigError("--variant", f"{text!r}: {o!r} is not KEY=VALUE")
        if o.partition("=")[0].strip() == "distributed.strategy":
            raise ConfigError("--variant", f"{text!r}: the strategy is the first item, not an override")
    return Variant(name, strategy, overrides)


def machine_slots(device: str) -> tuple[str, int]:
    """('cuda', visible GPUs) or ('cpu', cores): how many ranks fit on this machine."""
    import torch

    wants_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_gpu and torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def plan_points(cfg: Config, variants: list[Variant], nprocs: list[int], *, mode: str,
                device_type: str, slots: int, fsdp_ok: bool = True) -> list[Point]:
    """The baseline (when 1 is among `nprocs`), then each variant at each world size (skipped ones
    keep their reason)."""
    batch = cfg.data.batch_size
    unit = "GPUs" if device_type == "cuda" else "CPU cores"

    def skip_reason(variant: Variant, world: int, per_rank: int | None) -> str | None:
        if world > slots:
            if device_type == "cuda":
                return f"needs {world} GPUs (one per rank), {slots} visible"
            return f"{world} gloo ranks on {slots} {unit} would time-share cores and measure the scheduler"
        if per_rank is None:
            return f"strong scaling: global batch {batch} does not split into {world} equal per-rank batches"
        if variant.strategy == "fsdp" and not fsdp_ok:
            return "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)"
        return None

    one_rank = min(nprocs) == 1  # else the model may not fit one rank: no 1-rank point is tried
    points = [Point(BASELINE, 1, batch, role="baseline")] if one_rank else []
    for variant in variants:
        for world in nprocs:
            per_rank = batch if mode == "weak" else (batch // world if batch % world == 0 else None)
            points.append(Point(variant, world, per_rank or batch, skip=skip_reason(variant, world, per_rank)))
            if mode == "strong" and world > 1 and per_rank and one_rank:
                ref_skip = skip_reason(variant, 1, per_rank)
                points.append(Point(variant, 1, per_rank, role="reference", skip=ref_skip))
    return points
