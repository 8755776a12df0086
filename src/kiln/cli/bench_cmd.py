"""`kiln bench compile|llm|scale|comm|predict [...]`: benchmark commands (`llm` lives in bench_llm_cmd;
scale, comm and predict in bench_scale_cmd). Argument parsing and planning only; the measuring is
in kiln.bench. Every check of the input happens before any model is built."""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.cli.args import DefaultsFormatter, add_verbose_flag
from kiln.cli.results import claim_results_dir, show_results

AXES = ("modes", "precisions", "backends", "scopes", "losses", "cudagraphs", "regional", "baselines")


def add_parser(sub) -> None:
    from kiln.cli import bench_llm_cmd, bench_scale_cmd, bench_train_llm_cmd

    bench = sub.add_parser("bench", help="benchmarks with results.json/md/png: compile, llm, train-llm, scale, comm, predict")
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
    p.add_argument("--modes", action="append",
                   help="compile modes, e.g. default,reduce-overhead (eager is always the baseline; naming it is allowed)")
    p.add_argument("--precisions", action="append", help="fp32,bf16-mixed,fp16-mixed,bf16-true,bf16-master")
    p.add_argument("--backends", action="append", help="compile backends, e.g. inductor,aot_eager,cudagraphs")
    p.add_argument("--scopes", action="append", help="model,model/loss,model+loss,step")
    p.add_argument("--losses", action="append", help="task (the model's loss), distill (teacher KL + CE)")
    p.add_argument("--cudagraphs", action="append", metavar="off,on",
                   help="whole-step CUDA-graph capture (compile.cudagraphs) off and/or on for each recipe; "
                        "'on' also adds eager with capture")
    p.add_argument("--regional", action="append", metavar="off,on",
                   help="scope-model recipes compiled whole and/or block by block (compile.regional)")
    p.add_argument("--baseline", dest="baselines", action="append", metavar="plain",
                   help="plain: add, for each mode, the loop a user writes by hand around torch.compile(model, mode)")
    p.add_argument("--warm-start", action="store_true",
                   help="also time each compiled recipe's compile from its saved cache artifacts (warm restart)")
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
    add_verbose_flag(p)
    p.set_defaults(run=run_compile)
    bench_llm_cmd.add_parser(bsub)
    bench_train_llm_cmd.add_parser(bsub)
    bench_scale_cmd.add_parsers(bsub)
    for parser in bsub.choices.values():  # every bench subcommand's --help shows its defaults
        parser.formatter_class = DefaultsFormatter


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
    from kiln.bench.recipes import EAGER, Axes, check_axes, expand_matrix, recipe_config, split_values
    from kiln.config import load_config
    from kiln.config.validate import validate_compile
    from kiln.precision import resolve_precision
    from kiln.runtime import resolve_device

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
    eager_only = False
    if "modes" in given and EAGER in given["modes"]:
        # Eager is every table's baseline, always run: asking for it is fine, not an error.
        given["modes"] = [m for m in given["modes"] if m != EAGER]
        eager_only = not given["modes"]
        print(f"kiln: --modes {EAGER}: eager is always run as the baseline of each precision"
              + ("; running the eager rows only" if eager_only else "; not a compile mode, ignored"), file=sys.stderr)
    if preset:
        _, axes, recipes = plan_preset(preset.name, given)
    else:
        # Without flags, the config's own recipe against eager.
        axes = Axes(modes=[cfg.compile.mode or "default"], precisions=[cfg.precision.policy],
                    backends=[cfg.compile.backend], scopes=[cfg.compile.scope])
        for key, values in given.items():
            setattr(axes, key, values)
        recipes = []
    check_axes(axes, cfg, eager_only=eager_only)
    if not preset:
        recipes = expand_matrix(axes)
    if eager_only:
        recipes = [r for r in recipes if not r.compiled]
    for recipe in recipes:
        if recipe.compiled:
            validate_compile(recipe_config(cfg, recipe))
    device = resolve_device(cfg.training.device)
    for precision in dict.fromkeys(r.precision for r in recipes):
        resolve_precision(precision, device)
    train = args.train if args.train is not None else (preset.train if preset else True)
    opts = CompileBenchOptions(cfg=cfg, recipes=recipes, train=train, steps=args.steps, warmup=args.warmup,
                               accuracy_steps=args.accuracy_steps, fresh_cache=not args.warm_cache,
                               warm_start=args.warm_start)
    return opts, preset


def _command(args: argparse.Namespace) -> str:
    parts = ["kiln", "bench", "compile"]
    for flag in ("config", "model", "preset"):
        if getattr(args, flag):
            parts += [f"--{flag}", getattr(args, flag)]
    for key in AXES:
        if getattr(args, key) is not None:
            parts += ["--baseline" if key == "baselines" else f"--{key}", ",".join(getattr(args, key))]
    if args.train is not None:
        parts.append("--train" if args.train else "--infer")
    for flag in ("steps", "warmup", "accuracy_steps", "batch_size", "device", "out"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    if args.warm_cache:
        parts.append("--warm-cache")
    if args.warm_start:
        parts.append("--warm-start")
    return shlex.join(parts + list(args.overrides))


def run_compile(args: argparse.Namespace) -> int:
    opts, preset = plan(args)  # ConfigError -> exit 2 before any work

    import dataclasses

    import torch

    from kiln.activity import Activity
    from kiln.bench.compile_bench import run_compile_bench
    from kiln.bench.compile_report import render_table, write_compile_results
    from kiln.monitor.env import collect_env
    from kiln.runtime import resolve_device

    cfg = opts.cfg
    name = preset.name if preset else cfg.model.name
    out = claim_results_dir(args, f"bench-compile-{name}")
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    run = "train" if opts.train else "infer"
    title = f"kiln bench compile: {cfg.model.name} ({run}, batch {cfg.data.batch_size}, {where})"
    if opts.train:  # the loop settings a plain loop pays for too
        title += (f"; grad_clip {cfg.training.grad_clip:g}, {cfg.optim.schedule} schedule, "
                  f"warm-up {cfg.optim.warmup_steps} steps")
    with Activity() as activity:  # what is compiling or timing now, on stderr
        activity.phase(f"building {cfg.model.name} ({run}) on {where}")
        rows = run_compile_bench(opts, log=activity.log, phase=activity.phase)
    config = {
        "base": dataclasses.asdict(cfg),
        "bench": {"preset": preset.name if preset else None, "train": opts.train, "steps": opts.steps,
                  "warmup": opts.warmup, "accuracy_steps": opts.accuracy_steps, "fresh_cache": opts.fresh_cache,
                  "warm_start": opts.warm_start,
                  "recipes": [dataclasses.asdict(r) for r in opts.recipes], "device": str(device)},
    }
    written = write_compile_results(out, rows, env=collect_env(), config=config, command=_command(args), title=title)
    show_results(rows, render_table(rows, title), written)
    return 0
