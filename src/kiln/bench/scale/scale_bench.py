"""`kiln bench scale` and `kiln bench comm`: run the planned points, measure the collectives, predict.

Each point is its own `kiln train` job started through torchrun (kiln.bench.scale.scale_run), exactly as
`kiln train --nproc-per-node N` starts one, so a point measures what training runs. The bandwidth
step is `kiln bench comm` started the same way at the largest world size that runs here; its rows
give the predictor measured latency, bandwidth and overlap cost (kiln.bench.scale.comm).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.bench.scale.comm import plan_sizes, run_comm, skipped_rows
from kiln.bench.scale.predict import Phases
from kiln.bench.scale.scale_analysis import analyse_points, overlap_cost, prediction_rows, topology
from kiln.bench.scale.scale_plan import ScalePlan, Variant
from kiln.bench.scale.scale_report import write_scale_results
from kiln.bench.scale.scale_run import rank_env, run_point, skipped_row
from kiln.config import load_config
from kiln.distributed.launch import LaunchSpec, launch_kiln
from kiln.distributed.traffic import StepTraffic, step_traffic
from kiln.distributed.world import DistEnv, backend_for, destroy_process_group, device_for, init_process_group
from kiln.monitor.env import collect_env
from kiln.runtime import default_run_dir


@dataclass
class TopologyFlags:
    gpus_per_node: int | None = None
    bus_bw: float | None = None
    intra_latency_s: float | None = None
    inter_bw: float | None = None
    inter_latency_s: float | None = None
    overlap_cost: float | None = None


@dataclass
class ScaleOptions:
    plan: ScalePlan
    config: str | None
    overrides: list[str]
    """The user's config overrides (with --model folded in), applied before each variant's."""
    steps: int = 60
    timeout_s: float = 600.0
    comm: bool = True
    comm_repeats: int = 20
    predict_worlds: list[int] = field(default_factory=list)
    topo: TopologyFlags = field(default_factory=TopologyFlags)
    phases: Phases = field(default_factory=Phases)
    calibrate_at: int | None = None


def variant_traffic(config: str | None, overrides: list[str], variants: list[Variant]) -> dict[str, StepTraffic]:
    """Each variant's collectives, from its own resolved config (its overrides change buckets/units)."""
    return {v.name: step_traffic(load_config(config, [*overrides, *v.config_overrides()]), v.strategy)
            for v in variants}


def traffic_as_run(traffic: dict[str, StepTraffic], rows: list[dict[str, Any]], config: str | None,
                   overrides: list[str], variants: list[Variant]) -> dict[str, StepTraffic]:
    """Each FSDP2 variant's collectives with the reshard-after-forward its points ran with: under
    `distributed.fsdp_reshard_after_forward=auto` the run's memory plan decides on the device
    (kiln.train.gpu_plan), which the traffic from the config alone cannot know. Variants whose points
    disagree, or recorded none, keep the config's."""
    out = dict(traffic)
    for v in variants:
        ran = {r.get("reshard_after_forward") for r in rows
               if r.get("kind") == "point" and r.get("variant") == v.name and r.get("status") == "ok"} - {None}
        if v.strategy == "fsdp" and len(ran) == 1:
            chosen = f"distributed.fsdp_reshard_after_forward={str(ran.pop()).lower()}"
            out[v.name] = step_traffic(load_config(config, [*overrides, *v.config_overrides(), chosen]), v.strategy)
    return out


def comm_args(world: int, out: Path, config: str | None, overrides: list[str], variants: list[Variant],
              repeats: int) -> list[str]:
    plain = [v.strategy for v in variants if v.name == v.strategy and not v.overrides]
    args = ["bench", "comm", "--nprocs", str(world), "--out", str(out), "--repeats", str(repeats),
            "--strategies", ",".join(plain or [variants[0].strategy])]
    if config:
        args += ["--config", config]
    for v in variants:
        if v.name != v.strategy or v.overrides:
            args += ["--variant", f"{v.name}={','.join([v.strategy, *v.overrides])}"]
    return [*args, *overrides]


def launch_comm(world: int, out: Path, *, config: str | None, overrides: list[str], variants: list[Variant],
                repeats: int, timeout_s: float | None, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`kiln bench comm` on `world` ranks through torchrun; its rows, or one error row."""
    out.mkdir(parents=True, exist_ok=True)
    code = launch_kiln(LaunchSpec(nproc_per_node=world), comm_args(world, out, config, overrides, variants, repeats),
                       timeout_s=timeout_s, log_path=out / "launch.log", env=env)
    results = out / "results.json"
    if code == 0 and results.exists():
        return json.loads(results.read_text())["results"]
    tail = (out / "launch.log").read_text(errors="replace").strip().splitlines()[-3:] if (out / "launch.log").exists() else []
    reason = "timed out" if code == 124 else f"exit code {code}"
    return [{"kind": "comm", "status": "error", "world": world, "reason": f"{reason}: {' | '.join(tail)}"[:1500]}]


def comm_skipped(traffic: dict[str, StepTraffic], plan: ScalePlan, reason: str) -> list[dict[str, Any]]:
    return skipped_rows(plan_sizes(list(traffic.values()), sweep=False), 1, reason)


def run_scale_bench(opts: ScaleOptions, out: Path, *,
                    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
                    phase: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run every planned point (skipped ones become rows with their reason), then the bandwidth
    step, then the predictions. `on_rows(rows)` is called after each point, so partial results are
    on disk if a later point hangs or the job is killed; `phase(message)` when the work moves on
    (kiln.activity), so a run of minutes is not silent."""
    plan = opts.plan
    phase = phase or (lambda message: None)
    phase("measuring each variant's gradient traffic")
    traffic = variant_traffic(opts.config, opts.overrides, plan.variants)
    rows: list[dict[str, Any]] = []
    runnable = [p for p in plan.points if not p.skip]
    for point in plan.points:
        if point.skip:
            rows.append(skipped_row(point))
        else:
            phase(f"[{runnable.index(point) + 1}/{len(runnable)}] point {point.name}: launching its ranks, "
                  f"{opts.steps} steps")
            rows.append(run_point(point, out / "points" / point.name, config=opts.config, overrides=opts.overrides,
                                  steps=opts.steps, timeout_s=opts.timeout_s, device_type=plan.device_type))
        if on_rows is not None:
            on_rows(rows)
    analyse_points(rows, plan.thresholds, plan.mode)
    traffic = traffic_as_run(traffic, rows, opts.config, opts.overrides, plan.variants)
    world = plan.comm_world
    if not opts.comm:
        comm_rows = comm_skipped(traffic, plan, "--no-comm")
    elif world < 2:
        unit = "GPU" if plan.device_type == "cuda" else "CPU core"
        reason = (f"one {unit} here runs one rank: no peer to communicate with" if plan.slots < 2
                  else "no requested rank count of 2 or more: no peer to communicate with")
        comm_rows = comm_skipped(traffic, plan, reason)
    else:
        phase(f"measuring collective bandwidth on {world} ranks")
        comm_rows = launch_comm(world, out / "comm", config=opts.config, overrides=opts.overrides,
                                variants=plan.variants, repeats=opts.comm_repeats, timeout_s=opts.timeout_s,
                                env=rank_env(plan.device_type))
    rows += comm_rows
    if on_rows is not None:
        on_rows(rows)
    flags = opts.topo
    per_node = flags.gpus_per_node or max(plan.slots, 1)
    topo = topology(comm_rows, device_type=plan.device_type, gpus_per_node=per_node, bus_bw=flags.bus_bw,
                    intra_latency_s=flags.intra_latency_s, inter_bw=flags.inter_bw,
                    inter_latency_s=flags.inter_latency_s)
    worlds = sorted({n for n in plan.nprocs if n > 1} | set(opts.predict_worlds))
    rows += prediction_rows(rows, traffic, worlds, topo, cost=overlap_cost(comm_rows, flags.overlap_cost),
                            mode=plan.mode, thresholds=plan.thresholds, phases=opts.phases,
                            calibrate_at=opts.calibrate_at)
    return rows


def comm_worker(cfg, traffic: dict[str, StepTraffic], *, warmup: int, repeats: int, overlap: bool,
                out: Path | None, command: str) -> list[dict[str, Any]]:
    """One rank of `kiln bench comm` under torchrun: join the group, measure every size of every
    variant's traffic, leave; rank 0 writes the results (to `out`, or a new run dir)."""
    env = DistEnv.from_env()
    device = device_for(env, cfg.training.device)
    init_process_group(env, device, backend_for(device, cfg.distributed.backend), cfg.distributed.timeout_s)
    try:
        rows = run_comm(plan_sizes(list(traffic.values())), device=device, warmup=warmup, repeats=repeats,
                        overlap=overlap)
    finally:
        destroy_process_group()
    if env.is_main:
        write_scale_results(out or default_run_dir(f"bench-comm-{cfg.model.name}"), rows, env=collect_env(),
                            config={"world": env.world_size, "variants": list(traffic)}, command=command,
                            title=f"kiln bench comm: {cfg.model.name}, {env.world_size} ranks", png=False)
    return rows
