"""`kiln bench compile [...]`: benchmark commands (scale, comm and predict live in bench_scale_cmd).
Argument parsing and planning only; the measuring is in kiln.bench. Every check of the input happens before any model is built."""

from __future__ import annotations

import argparse
import shlex

AXES = ("modes", "precisions", "backends", "scopes", "losses")


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks with results.json/md/png: compile, scale, comm, predict")
    bench.set_defaults(run=_no_subcommand, bench_parser=bench)
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH", parser_class=type(bench))
    p = bsub.add_parser(
        "compile",
        help="eager vs compile recipes (modes, precisions, backends, scopes), interleaved, accuracy-checked",
        description="Eager and each selected compile recipe side by side in one process: compile time, "
        "interleaved step times, speedups, memory, graph breaks, accuracy vs an fp64 reference. "
        "List flags take comma-separated values and may repeat.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config of the model/data/optimizer to benchmark")
    source.add_argument("--model", help="model spec (registry name, timm:<name>, hf:<...>, module:function)")
    p.add_argument("--preset", help="seed001-vit | seed000-levels (overrides and flags still apply)")
    p.add_argument("--modes", action="append", help="compile modes, e.g. default,reduce-overhead")
    p.add_argument("--precisions", action="append", help="fp32,bf16-mixed,fp16-mixed,bf16-true")
    p.add_argument("--backends", action="append", help="compile backends, e.g. inductor,aot_eager,cudagraphs")
    p.add_argument("--scopes", action="append", help="model,model/loss,model+loss,step")
    p.add_argument("--losses", action="append", help="task (the model's loss), distill (teacher KL + CE)")
    run_kind = p.add_mutually_exclusive_group()
    run_kind.add_argument("--train", dest="train", action="store_true", default=None, help="time training steps")
    run_kind.add_argument("--infer", dest="train", action="store_false", help="time inference forwards")
    p.add_argument("--steps", type=int, default=20, help="timed samples per recipe, interleaved with eager")
    p.add_argument("--warmup", type=int, default=3, help="steps after the compiling one before timing")
    p.add_argument("--accuracy-steps", type=int, default=3, help="loss-trajectory steps; 0 = no accuracy check")
    p.add_argument("--batch-size", type=int, help="same as data.batch_size=N")
    p.add_argument("--device", help="same as training.device=... (auto, cpu, cuda, cuda:N)")
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk caches (default: cold compile)")
    p.add_argument("--out", help="output directory (default: runs/<time>-bench-compile-<name>)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, after --config/--preset")
    p.set_defaults(run=run_compile)
    from kiln.cli import bench_scale_cmd

    bench_scale_cmd.add_parsers(bsub)


def _no_subcommand(args: argparse.Namespace) -> int:
    args.bench_parser.print_help()
    return 2


def _count(flag: str, value: int, minimum: int) -> None:
    from kiln.config.errors import ConfigError

    if value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def plan(args: argparse.Namespace):
    """(options, preset or None) from the arguments; raises ConfigError on any bad input."""
    from kiln.bench.compile_bench import CompileBenchOptions
    from kiln.bench.presets import get_preset, plan_preset
    from kiln.bench.recipes import Axes, check_axes, expand_matrix, recipe_config, split_values
    from kiln.config import load_config
    from kiln.config.validate import validate_compile
    from kiln.precision import resolve_precision
    from kiln.train.runtime import resolve_device

    _count("--steps", args.steps, 1)
    _count("--warmup", args.warmup, 0)
    _count("--accuracy-steps", args.accuracy_steps, 0)
    preset = get_preset(args.preset) if args.preset else None
    overrides = list(preset.overrides) if preset else []
    if args.model:
        overrides.append(f"model.name={args.model}")
    overrides += list(args.overrides)
    if args.batch_size is not None:
        _count("--batch-size", args.batch_size, 1)
        overrides.append(f"data.batch_size={args.batch_size}")
    if args.device:
        overrides.append(f"training.device={args.device}")
    cfg = load_config(args.config, overrides)
    given = {k: split_values(getattr(args, k)) for k in AXES if getattr(args, k) is not None}
    if preset:
        _, axes, recipes = plan_preset(preset.name, given)
    else:
        # Without flags, the config's own recipe against eager.
        axes = Axes(modes=[cfg.compile.mode or "default"], precisions=[cfg.precision.policy],
                    backends=[cfg.compile.backend], scopes=[cfg.compile.scope])
        for key, values in given.items():
            setattr(axes, key, values)
        recipes = []
    check_axes(axes, cfg)
    if not preset:
        recipes = expand_matrix(axes)
    for recipe in recipes:
        if recipe.compiled:
            validate_compile(recipe_config(cfg, recipe))
    device = resolve_device(cfg.training.device)
    for precision in dict.fromkeys(r.precision for r in recipes):
        resolve_precision(precision, device)
    train = args.train if args.train is not None else (preset.train if preset else True)
    opts = CompileBenchOptions(cfg=cfg, recipes=recipes, train=train, steps=args.steps, warmup=args.warmup,
                               accuracy_steps=args.accuracy_steps, fresh_cache=not args.warm_cache)
    return opts, preset


def _command(args: argparse.Namespace) -> str:
    parts = ["kiln", "bench", "compile"]
    for flag in ("config", "model", "preset"):
        if getattr(args, flag):
            parts += [f"--{flag}", getattr(args, flag)]
    for key in AXES:
        if getattr(args, key) is not None:
            parts += [f"--{key}", ",".join(getattr(args, key))]
    if args.train is not None:
        parts.append("--train" if args.train else "--infer")
    for flag in ("steps", "warmup", "accuracy_steps", "batch_size", "device", "out"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    if args.warm_cache:
        parts.append("--warm-cache")
    return shlex.join(parts + list(args.overrides))


def run_compile(args: argparse.Namespace) -> int:
    opts, preset = plan(args)  # ConfigError -> exit 2 before any work

    import dataclasses
    from pathlib import Path

    import torch
    from rich.console import Console

    from kiln.bench.compile_bench import run_compile_bench
    from kiln.bench.compile_report import render_table, write_compile_results
    from kiln.monitor.env import collect_env
    from kiln.train.runtime import default_run_dir, resolve_device

    cfg = opts.cfg
    name = preset.name if preset else cfg.model.name
    out = Path(args.out) if args.out else default_run_dir(f"bench-compile-{name}")
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    run = "train" if opts.train else "infer"
    title = f"kiln bench compile: {cfg.model.name} ({run}, batch {cfg.data.batch_size}, {where})"
    rows = run_compile_bench(opts)
    config = {
        "base": dataclasses.asdict(cfg),
        "bench": {"preset": preset.name if preset else None, "train": opts.train, "steps": opts.steps,
                  "warmup": opts.warmup, "accuracy_steps": opts.accuracy_steps, "fresh_cache": opts.fresh_cache,
                  "recipes": [dataclasses.asdict(r) for r in opts.recipes], "device": str(device)},
    }
    written = write_compile_results(out, rows, env=collect_env(), config=config, command=_command(args), title=title)
    console = Console()
    if not console.is_terminal:  # piped or logged: do not squeeze the table into 80 columns
        console = Console(width=220)
    console.print(render_table(rows, title))
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"kiln: {len(rows)} rows ({summary}); wrote {', '.join(str(p) for p in written.values())}")
    return 0
