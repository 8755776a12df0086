"""The library side of `kiln bench scale | comm | predict` (requests: kiln.bench.scale.scale_request).

`check_*` check every flag, the config, the variants, the rank counts, the thresholds and the
output directory before any process is started (each problem a ConfigError naming the flag,
exit 2); `run_scale_job`, `bench_comm` and `bench_predict` run and write the results. The CLI
parses, calls these and prints."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.bench.results import refuse_held_results
from kiln.bench.scale.comm import plan_sizes, skipped_rows
from kiln.bench.scale.predict import Phases
from kiln.bench.scale.predict_offline import run_offline_prediction
from kiln.bench.scale.scale_bench import (
    ScaleOptions,
    TopologyFlags,
    comm_worker,
    launch_comm,
    run_scale_bench,
    variant_traffic,
)
from kiln.bench.scale.scale_plan import (
    ScalePlan,
    Variant,
    machine_slots,
    parse_nprocs,
    parse_strategies,
    parse_thresholds,
    parse_variant,
    plan_points,
)
from kiln.bench.scale.scale_report import write_scale_results
from kiln.bench.scale.scale_request import CommRequest, PredictionFlags, PredictRequest, ScaleRequest, VariantFlags
from kiln.bench.scale.scale_run import point_overrides
from kiln.config import load_config
from kiln.config.schema import Config
from kiln.distributed.fsdp import fsdp_available
from kiln.distributed.traffic import StepTraffic
from kiln.distributed.world import DistEnv
from kiln.errors import ConfigError
from kiln.monitor.env import collect_env
from kiln.runtime import default_run_dir

GB = 1e9
Rows = list[dict[str, Any]]


def at_least(flag: str, value, minimum) -> None:
    if value is not None and value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def _in_unit(flag: str, value) -> None:
    if value is not None and not 0 <= value <= 1:
        raise ConfigError(flag, f"must be between 0 and 1, got {value}")


def _overrides(req: VariantFlags) -> list[str]:
    extra = [f"model.name={req.model}"] if req.model else []
    if getattr(req, "device", None):
        extra.append(f"training.device={req.device}")
    return extra + list(req.overrides)


def _variants(req: VariantFlags) -> list[Variant]:
    variants = list(dict.fromkeys(parse_strategies(req.strategies) + [parse_variant(v) for v in req.variant]))
    names = [v.name for v in variants]
    dup = next((n for n in names if names.count(n) > 1 or n == "none"), None)
    if dup:
        raise ConfigError("--variant", f"name {dup!r} is taken (strategies and 'none' are names too)")
    return variants


def _check_points(points, config, overrides, steps) -> None:
    """Each point's full config (the bench's own overrides included) validates: a point that could
    only fail (e.g. warm-up longer than --steps) is bad input, reported before anything runs."""
    for point in (p for p in points if not p.skip):
        load_config(config, point_overrides(point, overrides, steps))


def _topology(req: PredictionFlags) -> tuple[TopologyFlags, Phases, list[int]]:
    for flag in ("gpus_per_node", "calibrate_at"):
        at_least("--" + flag.replace("_", "-"), getattr(req, flag), 1)
    for flag in ("bus_bw", "inter_bw", "intra_latency_us", "inter_latency_us"):
        value = getattr(req, flag)
        if value is not None and not value > 0:
            raise ConfigError("--" + flag.replace("_", "-"), f"must be > 0, got {value}")
    for flag in ("overlap_cost", "backward_share", "rest_share"):
        _in_unit("--" + flag.replace("_", "-"), getattr(req, flag))
    if req.backward_share + req.rest_share > 1:
        raise ConfigError("--backward-share", "backward and rest shares add up to more than the step")
    us = lambda v: None if v is None else v * 1e-6  # noqa: E731
    gb = lambda v: None if v is None else v * GB  # noqa: E731
    flags = TopologyFlags(gpus_per_node=req.gpus_per_node, bus_bw=gb(req.bus_bw),
                          intra_latency_s=us(req.intra_latency_us), inter_bw=gb(req.inter_bw),
                          inter_latency_s=us(req.inter_latency_us), overlap_cost=req.overlap_cost)
    return flags, Phases(req.backward_share, req.rest_share), parse_nprocs(req.predict_worlds)


@dataclass
class ScaleJob:
    """A checked `kiln bench scale`: what runs, where it is written, and how the results name it."""

    opts: ScaleOptions
    out: Path
    cfg: Config
    title: str
    config: dict[str, Any]
    """The `config` recorded in results.json: the base config and the bench's settings."""


def check_scale(req: ScaleRequest) -> ScaleJob:
    if DistEnv.from_env().launched:
        raise ConfigError("torchrun", "kiln bench scale starts its own torchrun jobs: run it without torchrun")
    nprocs = parse_nprocs(req.nprocs)
    thresholds = parse_thresholds(req.thresholds)
    at_least("--steps", req.steps, 4)
    at_least("--comm-repeats", req.comm_repeats, 1)
    if not req.timeout > 0:
        raise ConfigError("--timeout", f"must be > 0, got {req.timeout}")
    topo, phases, predict_worlds = _topology(req)
    overrides = _overrides(req)
    cfg = load_config(req.config, overrides)
    variants = _variants(req)
    variant_traffic(req.config, overrides, variants)  # each variant validates and builds on meta
    device_type, slots = machine_slots(cfg.training.device)
    if topo.gpus_per_node is None:
        topo.gpus_per_node = 8 if device_type == "cuda" else max(1, slots)
    out = Path(req.out) if req.out else default_run_dir(f"bench-scale-{cfg.model.name}")
    refuse_held_results(out)
    points = plan_points(cfg, variants, nprocs, mode=req.mode, device_type=device_type, slots=slots,
                         fsdp_ok=fsdp_available())
    _check_points(points, req.config, overrides, req.steps)
    plan = ScalePlan(cfg, variants, nprocs, req.mode, thresholds, points, device_type, slots)
    # Without a 1-rank point, predictions start from the smallest rank count's measured step.
    calibrate_at = req.calibrate_at if req.calibrate_at is not None or nprocs[0] == 1 else nprocs[0]
    opts = ScaleOptions(plan, req.config, overrides, steps=req.steps, timeout_s=req.timeout,
                        comm=not req.no_comm, comm_repeats=req.comm_repeats, predict_worlds=predict_worlds,
                        topo=topo, phases=phases, calibrate_at=calibrate_at)
    where = "GPU" if plan.device_type == "cuda" else "CPU gloo"
    title = (f"kiln bench scale: {cfg.model.name}, {plan.mode} scaling, batch {cfg.data.batch_size} "
             f"{'per rank' if plan.mode == 'weak' else 'global'} ({where})")
    config = {"base": dataclasses.asdict(cfg), "bench": {
        "config": opts.config, "overrides": opts.overrides, "nprocs": plan.nprocs, "mode": plan.mode,
        "variants": [dataclasses.asdict(v) for v in plan.variants], "thresholds": plan.thresholds,
        "steps": opts.steps, "device_type": plan.device_type, "slots": plan.slots, "comm": opts.comm,
        "predict_worlds": opts.predict_worlds, "topology_flags": dataclasses.asdict(opts.topo),
        "phases": dataclasses.asdict(opts.phases), "calibrate_at": opts.calibrate_at}}
    return ScaleJob(opts, out, cfg, title, config)


@dataclass
class CommJob:
    """A checked `kiln bench comm`: a worker under torchrun (`worker`), or the ranks to start."""

    cfg: Config
    overrides: list[str]
    variants: list[Variant]
    traffic: dict[str, StepTraffic]
    worker: bool
    world: int = 0
    out: Path | None = None


def check_comm(req: CommRequest) -> CommJob:
    overrides = _overrides(req)
    cfg = load_config(req.config, overrides)
    variants = _variants(req)
    traffic = variant_traffic(req.config, overrides, variants)
    at_least("--repeats", req.repeats, 1)
    at_least("--warmup", req.warmup, 0)
    if DistEnv.from_env().launched:
        return CommJob(cfg, overrides, variants, traffic, worker=True, out=Path(req.out) if req.out else None)
    device_type, slots = machine_slots(cfg.training.device)
    world = req.nprocs if req.nprocs is not None else (slots if device_type == "cuda" else 2)
    at_least("--nprocs", world, 1)
    if world > slots:
        unit = "GPUs" if device_type == "cuda" else "CPU cores"
        raise ConfigError("--nprocs", f"{world} ranks but {slots} {unit} here")
    out = Path(req.out) if req.out else default_run_dir(f"bench-comm-{cfg.model.name}")
    refuse_held_results(out)
    return CommJob(cfg, overrides, variants, traffic, worker=False, world=world, out=out)


@dataclass
class PredictJob:
    """A checked `kiln bench predict`."""

    traffic: dict[str, StepTraffic]
    thresholds: dict[int, float]
    topo: TopologyFlags
    phases: Phases
    predict_worlds: list[int]
    out: Path


def check_predict(req: PredictRequest) -> PredictJob:
    topo, phases, predict_worlds = _topology(req)
    overrides = _overrides(req)
    variants = _variants(req)
    traffic = variant_traffic(req.config, overrides, variants)
    thresholds = parse_thresholds(req.thresholds)
    out = Path(req.out)
    refuse_held_results(out)
    return PredictJob(traffic, thresholds, topo, phases, predict_worlds, out)


def run_scale_job(job: ScaleJob, command: str, *, phase: Callable[[str], None]) -> tuple[Rows, dict[str, Path]]:
    """Run the planned points (results.json rewritten after each), then write the final results."""
    env = collect_env()

    def save(rows: Rows, png: bool = False) -> dict[str, Path]:
        return write_scale_results(job.out, rows, env=env, config=job.config, command=command, title=job.title,
                                   png=png)

    rows = run_scale_bench(job.opts, job.out, on_rows=save, phase=phase)
    return rows, save(rows, png=True)


@dataclass
class CommResult:
    """What `kiln bench comm` did: the rows, and what it wrote (None: the launched ranks wrote it)."""

    rows: Rows
    out: Path
    written: dict[str, Path] | None
    title: str


def bench_comm(req: CommRequest, command: str) -> CommResult | None:
    """Check `req`, then measure (None: this process is one of the ranks, which writes its rows)."""
    job = check_comm(req)
    if job.worker:
        comm_worker(job.cfg, job.traffic, warmup=req.warmup, repeats=req.repeats, overlap=not req.no_overlap,
                    out=job.out, command=command)
        return None
    if job.world < 2:
        rows = skipped_rows(plan_sizes(list(job.traffic.values()), sweep=False), job.world,
                            "one rank: no peer to communicate with")
        written = write_scale_results(job.out, rows, env=collect_env(), config={"nprocs": job.world},
                                      command=command, title=f"kiln bench comm: {job.cfg.model.name}", png=False)
        return CommResult(rows, job.out, written, "kiln bench comm")
    rows = launch_comm(job.world, job.out, config=req.config, overrides=job.overrides, variants=job.variants,
                       repeats=req.repeats, timeout_s=None)
    return CommResult(rows, job.out, None, "kiln bench comm")


def bench_predict(req: PredictRequest, command: str) -> tuple[Rows, dict[str, Path], str]:
    """Check `req`, then rebuild the prediction rows from its measured points: rows, files, title."""
    job = check_predict(req)
    return run_offline_prediction(
        points=Path(req.points), comm=Path(req.comm) if req.comm else None, traffic=job.traffic, mode=req.mode,
        thresholds=job.thresholds, topo=job.topo, phases=job.phases, predict_worlds=job.predict_worlds,
        calibrate_at=req.calibrate_at, device_type=req.device_type, out=job.out, command=command)
