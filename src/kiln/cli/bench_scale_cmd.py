"""`kiln bench scale | comm | predict`: argument parsing and input checks; the work is in kiln.bench.

Registered from kiln.cli.bench_cmd. Every check (config, variants, rank counts, thresholds, flags,
output directory) happens before any process is started.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.bench.results import refuse_held_results
from kiln.cli.args import add_verbose_flag

GB = 1e9


def _model_source(p) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config of the model/data/optimizer (e.g. configs/vit_b16.toml)")
    source.add_argument("--model", help="model spec (registry name, timm:<name>, hf:<...>, module:function)")


def _variants(p) -> None:
    p.add_argument("--strategies", default="ddp,fsdp", help="comma-separated: ddp,fsdp (default both)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=STRATEGY[,KEY=VALUE...]",
                   help="an extra variant, e.g. fsdp-zero2=fsdp,distributed.fsdp_reshard_after_forward=false "
                        "(repeatable)")


def _topology(p) -> None:
    g = p.add_argument_group("prediction (kiln.bench.predict; measured values are used where a flag is not given)")
    g.add_argument("--predict-worlds", default="16,32,64,128,256,512,1024", help="world sizes to predict")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node of the predicted cluster (default 8 on CUDA)")
    g.add_argument("--bus-bw", type=float, help="intra-node bus bandwidth, GB/s (default: measured, else given)")
    g.add_argument("--intra-latency-us", type=float, help="latency of one intra-node ring hop, microseconds")
    g.add_argument("--inter-bw", type=float, help="network bandwidth per GPU, GB/s (default 45: 400 Gb/s NICs)")
    g.add_argument("--inter-latency-us", type=float, help="latency of one inter-node hop, microseconds (default 5)")
    g.add_argument("--overlap-cost", type=float, help="share of overlapped communication that still costs time, 0..1")
    g.add_argument("--backward-share", type=float, default=0.6, help="share of the 1-rank step spent in backward")
    g.add_argument("--rest-share", type=float, default=0.1, help="share after backward (clip, optimizer, host)")
    g.add_argument("--calibrate-at", type=int, help="infer each variant's 1-rank step from its measured point here")


def add_parsers(bsub) -> None:
    p = bsub.add_parser(
        "scale", help="scaling efficiency over rank counts (DDP, FSDP2), collective bandwidth, predictions",
        description="Launch each (variant, rank count) point through torchrun as `kiln train --nproc-per-node N` "
        "does, then measure collectives at the model's sizes and predict efficiency at larger scale.")
    _model_source(p)
    p.add_argument("--nprocs", default="1,2,4,8", help="rank counts, e.g. 1,2,4,8 (default)")
    _variants(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--weak", dest="mode", action="store_const", const="weak", help="fixed per-rank batch (default)")
    mode.add_argument("--strong", dest="mode", action="store_const", const="strong", help="fixed global batch")
    p.add_argument("--thresholds", default="2:85,4:80,8:75", help="WORLD:PERCENT efficiency bars (seed default)")
    p.add_argument("--steps", type=int, default=60, help="training steps per point (default 60)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one point (or the bandwidth step) may take")
    p.add_argument("--device", help="same as training.device=... (auto, cpu, cuda)")
    p.add_argument("--no-comm", action="store_true", help="skip the collective-bandwidth step")
    p.add_argument("--comm-repeats", type=int, default=20, help="timed samples per collective size")
    _topology(p)
    p.add_argument("--out", help="output directory (default: runs/<time>-bench-scale-<name>)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, after --config")
    add_verbose_flag(p)
    p.set_defaults(run=run_scale, mode="weak")

    c = bsub.add_parser(
        "comm", help="collective bandwidth (all-reduce, reduce-scatter, all-gather) at the model's sizes",
        description="Time all-reduce at the model's DDP bucket sizes and all-gather / reduce-scatter at its FSDP2 "
        "unit sizes (plus a size sweep for the latency/bandwidth fit), on N ranks started through torchrun; "
        "algbw and busbw as nccl-tests defines them.")
    _model_source(c)
    c.add_argument("--nprocs", type=int, help="ranks (default: visible GPUs, or 2 on CPU)")
    _variants(c)
    c.add_argument("--repeats", type=int, default=20, help="timed samples per size")
    c.add_argument("--warmup", type=int, default=5, help="untimed calls per size")
    c.add_argument("--no-overlap", action="store_true", help="skip the compute/communication overlap probe")
    c.add_argument("--device", help="same as training.device=... (auto, cpu, cuda)")
    c.add_argument("--out", help="output directory (default: runs/<time>-bench-comm-<name>)")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, after --config")
    add_verbose_flag(c)
    c.set_defaults(run=run_comm)

    d = bsub.add_parser(
        "predict", help="predict scaling from measured points (a bench scale results.json)",
        description="Rebuild the prediction rows of `kiln bench scale` from a results.json of measured points "
        "(and optionally a `kiln bench comm` results.json), e.g. to validate against committed results.")
    _model_source(d)
    d.add_argument("--points", required=True, help="results.json holding the measured point rows")
    d.add_argument("--comm", help="a `kiln bench comm` results.json (measured latency, bandwidth, overlap)")
    _variants(d)
    mode = d.add_mutually_exclusive_group()
    mode.add_argument("--weak", dest="mode", action="store_const", const="weak", help="fixed per-rank batch (default)")
    mode.add_argument("--strong", dest="mode", action="store_const", const="strong", help="fixed global batch")
    d.add_argument("--thresholds", default="2:85,4:80,8:75", help="WORLD:PERCENT efficiency bars")
    d.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda", help="which given defaults apply")
    _topology(d)
    d.add_argument("--out", required=True, help="output directory")
    d.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, after --config")
    d.set_defaults(run=run_predict, mode="weak")


# -- checks --------------------------------------------------------------------------------------
def _at_least(flag: str, value, minimum) -> None:
    from kiln.config.errors import ConfigError

    if value is not None and value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def _in_unit(flag: str, value) -> None:
    from kiln.config.errors import ConfigError

    if value is not None and not 0 <= value <= 1:
        raise ConfigError(flag, f"must be between 0 and 1, got {value}")


def _overrides(args) -> list[str]:
    extra = [f"model.name={args.model}"] if args.model else []
    if getattr(args, "device", None):
        extra.append(f"training.device={args.device}")
    return extra + list(args.overrides)


def _variant_list(args):
    from kiln.bench.scale_plan import parse_strategies, parse_variant
    from kiln.config.errors import ConfigError

    variants = list(dict.fromkeys(parse_strategies(args.strategies) + [parse_variant(v) for v in args.variant]))
    names = [v.name for v in variants]
    dup = next((n for n in names if names.count(n) > 1 or n == "none"), None)
    if dup:
        raise ConfigError("--variant", f"name {dup!r} is taken (strategies and 'none' are names too)")
    return variants


def _check_variants(config, overrides, variants):
    """Each variant's resolved config validates and its model builds on meta: bad input exits 2 here."""
    from kiln.bench.scale_bench import variant_traffic

    return variant_traffic(config, overrides, variants)


def _check_points(points, config, overrides, steps) -> None:
    """Each point's full config (the bench's own overrides included) validates: a point that could
    only fail (e.g. warm-up longer than --steps) is bad input, reported before anything runs."""
    from kiln.bench.scale_run import point_overrides
    from kiln.config import load_config

    for point in (p for p in points if not p.skip):
        load_config(config, point_overrides(point, overrides, steps))


def _topology_flags(args):
    from kiln.bench.predict import Phases
    from kiln.bench.scale_bench import TopologyFlags
    from kiln.bench.scale_plan import parse_nprocs

    for flag in ("gpus_per_node", "calibrate_at"):
        _at_least("--" + flag.replace("_", "-"), getattr(args, flag), 1)
    for flag in ("bus_bw", "inter_bw", "intra_latency_us", "inter_latency_us"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            from kiln.config.errors import ConfigError

            raise ConfigError("--" + flag.replace("_", "-"), f"must be > 0, got {value}")
    for flag in ("overlap_cost", "backward_share", "rest_share"):
        _in_unit("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.backward_share + args.rest_share > 1:
        from kiln.config.errors import ConfigError

        raise ConfigError("--backward-share", "backward and rest shares add up to more than the step")
    us = lambda v: None if v is None else v * 1e-6  # noqa: E731
    gb = lambda v: None if v is None else v * GB  # noqa: E731
    flags = TopologyFlags(gpus_per_node=args.gpus_per_node, bus_bw=gb(args.bus_bw),
                          intra_latency_s=us(args.intra_latency_us), inter_bw=gb(args.inter_bw),
                          inter_latency_s=us(args.inter_latency_us), overlap_cost=args.overlap_cost)
    return flags, Phases(args.backward_share, args.rest_share), parse_nprocs(args.predict_worlds)


def _command(name: str) -> str:
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith(("kiln", "__main__.py")) else []
    return shlex.join(["kiln", *argv]) if argv else f"kiln bench {name} (called from Python)"


def _print(rows, title, written) -> None:
    from rich.console import Console

    from kiln.bench.scale_report import render_table

    console = Console()
    if not console.is_terminal:  # piped or logged: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(render_table(rows, title))
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"kiln: {len(rows)} rows ({', '.join(f'{n} {s}' for s, n in counts.items())}); "
          f"wrote {', '.join(str(p) for p in written.values())}")


# -- commands ------------------------------------------------------------------------------------
def run_scale(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kiln.bench.scale_bench import ScaleOptions
    from kiln.bench.scale_plan import (
        ScalePlan,
        machine_slots,
        parse_nprocs,
        parse_thresholds,
        plan_points,
    )
    from kiln.config import load_config
    from kiln.distributed.env import DistEnv
    from kiln.distributed.fsdp import fsdp_available
    from kiln.runtime import default_run_dir

    if DistEnv.from_env().launched:
        from kiln.config.errors import ConfigError

        raise ConfigError("torchrun", "kiln bench scale starts its own torchrun jobs: run it without torchrun")
    nprocs = parse_nprocs(args.nprocs)
    thresholds = parse_thresholds(args.thresholds)
    _at_least("--steps", args.steps, 4)
    _at_least("--comm-repeats", args.comm_repeats, 1)
    if not args.timeout > 0:
        from kiln.config.errors import ConfigError

        raise ConfigError("--timeout", f"must be > 0, got {args.timeout}")
    topo, phases, predict_worlds = _topology_flags(args)
    overrides = _overrides(args)
    cfg = load_config(args.config, overrides)
    variants = _variant_list(args)
    _check_variants(args.config, overrides, variants)
    device_type, slots = machine_slots(cfg.training.device)
    if topo.gpus_per_node is None:
        topo.gpus_per_node = 8 if device_type == "cuda" else max(1, slots)
    out = Path(args.out) if args.out else default_run_dir(f"bench-scale-{cfg.model.name}")
    refuse_held_results(out)
    points = plan_points(cfg, variants, nprocs, mode=args.mode, device_type=device_type, slots=slots,
                         fsdp_ok=fsdp_available())
    _check_points(points, args.config, overrides, args.steps)
    plan = ScalePlan(cfg, variants, nprocs, args.mode, thresholds, points, device_type, slots)
    opts = ScaleOptions(plan, args.config, overrides, steps=args.steps, timeout_s=args.timeout,
                        comm=not args.no_comm, comm_repeats=args.comm_repeats, predict_worlds=predict_worlds,
                        topo=topo, phases=phases, calibrate_at=args.calibrate_at)
    return _run_and_write(opts, out, "scale", cfg)


def _run_and_write(opts, out, name: str, cfg) -> int:
    import dataclasses

    from kiln.bench.scale_bench import run_scale_bench
    from kiln.bench.scale_report import write_scale_results
    from kiln.monitor.env import collect_env

    plan = opts.plan
    env = collect_env()
    where = "GPU" if plan.device_type == "cuda" else "CPU gloo"
    title = (f"kiln bench scale: {cfg.model.name}, {plan.mode} scaling, batch {cfg.data.batch_size} "
             f"{'per rank' if plan.mode == 'weak' else 'global'} ({where})")
    config = {"base": dataclasses.asdict(cfg), "bench": {
        "config": opts.config, "overrides": opts.overrides, "nprocs": plan.nprocs, "mode": plan.mode,
        "variants": [dataclasses.asdict(v) for v in plan.variants], "thresholds": plan.thresholds,
        "steps": opts.steps, "device_type": plan.device_type, "slots": plan.slots, "comm": opts.comm,
        "predict_worlds": opts.predict_worlds, "topology_flags": dataclasses.asdict(opts.topo),
        "phases": dataclasses.asdict(opts.phases), "calibrate_at": opts.calibrate_at}}
    command = _command(name)

    def save(rows, png=False):
        return write_scale_results(out, rows, env=env, config=config, command=command, title=title, png=png)

    from kiln.activity import Activity

    try:
        with Activity() as activity:  # what runs now, on stderr: points take a while each
            rows = run_scale_bench(opts, out, on_rows=save, phase=activity.phase)
    except KeyboardInterrupt:  # the points written so far stay; their training checkpoints are scratch
        from kiln.cli.results import remove_scratch_on_interrupt

        remove_scratch_on_interrupt(out, sorted((out / "points").glob("*/checkpoints")))
        raise
    _print(rows, title, save(rows, png=True))
    return 0


def run_comm(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kiln.bench.comm import plan_sizes, skipped_rows
    from kiln.bench.scale_plan import machine_slots
    from kiln.config import load_config
    from kiln.distributed.env import DistEnv
    from kiln.runtime import default_run_dir

    overrides = _overrides(args)
    cfg = load_config(args.config, overrides)
    variants = _variant_list(args)
    traffic = _check_variants(args.config, overrides, variants)
    _at_least("--repeats", args.repeats, 1)
    _at_least("--warmup", args.warmup, 0)
    if DistEnv.from_env().launched:
        from kiln.bench.scale_bench import comm_worker

        comm_worker(cfg, traffic, warmup=args.warmup, repeats=args.repeats, overlap=not args.no_overlap,
                    out=Path(args.out) if args.out else None, command=_command("comm"))
        return 0
    device_type, slots = machine_slots(cfg.training.device)
    world = args.nprocs if args.nprocs is not None else (slots if device_type == "cuda" else 2)
    _at_least("--nprocs", world, 1)
    if world > slots:
        from kiln.config.errors import ConfigError

        unit = "GPUs" if device_type == "cuda" else "CPU cores"
        raise ConfigError("--nprocs", f"{world} ranks but {slots} {unit} here")
    out = Path(args.out) if args.out else default_run_dir(f"bench-comm-{cfg.model.name}")
    refuse_held_results(out)
    if world < 2:
        from kiln.bench.scale_report import write_scale_results
        from kiln.monitor.env import collect_env

        rows = skipped_rows(plan_sizes(list(traffic.values()), sweep=False), world, "one rank: no peer to communicate with")
        written = write_scale_results(out, rows, env=collect_env(), config={"nprocs": world}, command=_command("comm"),
                                      title=f"kiln bench comm: {cfg.model.name}", png=False)
        _print(rows, "kiln bench comm", written)
        return 0
    from kiln.bench.scale_bench import launch_comm

    rows = launch_comm(world, out, config=args.config, overrides=overrides, variants=variants, repeats=args.repeats,
                       timeout_s=None)
    if rows and rows[0]["status"] == "error":
        print(f"kiln: failed: {rows[0]['reason']}", file=sys.stderr)
        return 1
    print((out / "results.md").read_text().split("\nCommand:")[0])
    print(f"kiln: wrote {out / 'results.json'}, {out / 'results.md'}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kiln.bench.predict_offline import run_offline_prediction

    topo, phases, predict_worlds = _topology_flags(args)
    overrides = _overrides(args)
    variants = _variant_list(args)
    traffic = _check_variants(args.config, overrides, variants)
    from kiln.bench.scale_plan import parse_thresholds

    thresholds = parse_thresholds(args.thresholds)
    out = Path(args.out)
    refuse_held_results(out)
    rows, written, title = run_offline_prediction(
        points=Path(args.points), comm=Path(args.comm) if args.comm else None, traffic=traffic, mode=args.mode,
        thresholds=thresholds, topo=topo, phases=phases, predict_worlds=predict_worlds, calibrate_at=args.calibrate_at,
        device_type=args.device_type, out=out, command=_command("predict"))
    _print(rows, title, written)
    return 0
