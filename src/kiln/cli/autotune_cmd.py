"""`kiln autotune [--config FILE] [--budget MINUTES] [--out DIR] [KEY=VALUE ...]`: argument parsing,
the checks of the input (all before any work) and the progress display; the search is kiln.tune."""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.cli import autotune_llm
from kiln.cli.args import add_verbose_flag, check_budget, checked_list


def add_parser(sub) -> None:
    p = sub.add_parser(
        "autotune",
        help="search precision x compile mode x scope x regional x CUDA-graph capture (LLMs: batch x activation "
        "checkpointing x float8 x CE kernel x compile scope) by measuring; write the best config",
        description="Measure candidate recipes of the config (precisions you allow x compile modes x scopes x regional "
        "compile x whole-step CUDA-graph capture, and DDP vs FSDP with --nproc-per-node) with kiln bench compile's "
        "machinery, pruning what cannot win and what the time budget cannot afford, checking each against eager "
        "and fp64; writes DIR/best.toml (the full config with the winning keys: kiln train --config DIR/best.toml) "
        "and the evidence DIR/results.{json,md,png}. An LLM config (model.name=llama:...) searches batch size x "
        "activation checkpointing x float8 x cross-entropy kernel x compile scope by tokens/s instead. List flags take "
        "comma-separated values.",
    )
    p.add_argument("--config", help="TOML config to tune (as for kiln train); default: kiln's built-in default")
    p.add_argument("--budget", type=float, default=10.0, metavar="MINUTES",
                   help="time for the whole search, compiles included (default 10); what does not fit is reported")
    p.add_argument("--out", help="output directory (default: runs/<time>-autotune-<model>)")
    p.add_argument("--precisions", metavar="LIST",
                   help="precisions the search may use (a precision change changes the numerics; default: the "
                        "config's own, plus bf16-mixed on a GPU with bf16; for an LLM config: bf16-mixed,bf16-master "
                        "on a GPU when the config trains bf16 with AdamW)")
    p.add_argument("--modes", metavar="LIST", help="compile modes to search (default: default,reduce-overhead,"
                   "max-autotune-no-cudagraphs,max-autotune on a GPU; default,max-autotune-no-cudagraphs on a CPU)")
    p.add_argument("--scopes", metavar="LIST", help="compile scopes to search: model,model+loss,step (default all)")
    p.add_argument("--no-regional", dest="regional", action="store_false", help="do not search regional compile")
    p.add_argument("--no-capture", dest="capture", action="store_false",
                   help="do not search whole-step CUDA-graph capture (compile.cudagraphs)")
    p.add_argument("--nproc-per-node", type=int,
                   help="also compare distributed strategies (ddp, fsdp) of the winner over N processes "
                        "(default: every GPU when there are several; none on a CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed samples per candidate (the final comparison takes twice as many)")
    p.add_argument("--warmup", type=int, default=3, help="steps after the compiling one before timing")
    p.add_argument("--device", help="same as training.device=... (auto, cpu, cuda, cuda:N)")
    p.add_argument("--rank-noisy", action="store_true",
                   help="let rows flagged too noisy to rank (wide p10-p90, round-to-round drift) win anyway, e.g. "
                        "on a shared machine that is never quiet; the flags stay in the table (default: keep the "
                        "config's own recipe)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, after --config")
    autotune_llm.add_flags(p)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def plan(args: argparse.Namespace):
    """(TuneOptions, nproc for the strategy stage, notes) from the arguments; ConfigError on bad input."""
    import copy

    import torch

    from kiln.bench.recipes import PRECISIONS
    from kiln.config import load_config
    from kiln.config.errors import ConfigError
    from kiln.config.validate import compile_modes, validate_compile
    from kiln.precision import cpu_bf16_native, resolve_precision
    from kiln.runtime import resolve_device
    from kiln.tune.search import TuneOptions
    from kiln.tune.space import SCOPES, Space

    check_budget(args)
    overrides = list(args.overrides) + ([f"training.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    notes = []
    if cfg.compile.options:
        notes.append("compile.options dropped: kiln autotune searches torch.compile modes (a mode and options "
                     "exclude each other)")
        cfg = copy.deepcopy(cfg)
        cfg.compile.options = {}
        if cfg.compile.enabled and not cfg.compile.mode:
            cfg.compile.mode = "default"
    device = resolve_device(cfg.training.device)
    gpu = device.type == "cuda"
    precisions = checked_list("--precisions", args.precisions, PRECISIONS)
    if precisions is None:  # bf16 where it runs natively: a GPU with bf16, a CPU with AMX / AVX512-BF16
        precisions = [cfg.precision.policy]
        native = torch.cuda.is_bf16_supported() if gpu else cpu_bf16_native()
        if native and "bf16-mixed" not in precisions:
            precisions.append("bf16-mixed")
    for precision in precisions:
        try:
            resolve_precision(precision, device)
        except ConfigError as exc:
            raise ConfigError("--precisions", str(exc).split(": ", 1)[-1], exc.choices) from None
    available = compile_modes()
    modes = checked_list("--modes", args.modes)
    if modes is None:
        wanted = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"] if gpu else [
            "default", "max-autotune-no-cudagraphs"]
        modes = [m for m in wanted if m in available]
    probe = copy.deepcopy(cfg)
    probe.compile.enabled, probe.compile.backend = True, "inductor"
    for mode in modes:
        probe.compile.mode = mode
        try:
            validate_compile(probe)
        except ConfigError as exc:  # named after the flag, with torch's list and the seed's typo hint
            raise ConfigError("--modes", str(exc).split(": ", 1)[-1].rsplit(" (valid: ", 1)[0], exc.choices) from None
    scopes = checked_list("--scopes", args.scopes, SCOPES) or list(SCOPES)
    nproc = args.nproc_per_node
    if nproc is not None and nproc < 1:
        raise ConfigError("--nproc-per-node", f"must be >= 1, got {nproc}")
    if nproc is None and gpu and torch.cuda.device_count() > 1:
        nproc = torch.cuda.device_count()
    if nproc is not None and gpu and nproc > torch.cuda.device_count():
        raise ConfigError("--nproc-per-node", f"{nproc} processes but {torch.cuda.device_count()} visible GPUs")
    space = Space(precisions=precisions, modes=modes, scopes=scopes, regional=args.regional, cudagraphs=args.capture)
    opts = TuneOptions(cfg=cfg, space=space, budget_s=args.budget * 60, steps=args.steps, warmup=args.warmup,
                       rank_noisy=args.rank_noisy)
    return opts, (nproc if nproc and nproc > 1 else None), notes


def _command(args: argparse.Namespace) -> str:
    parts = ["kiln", "autotune"]
    for flag in ("config", "budget", "out", "precisions", "modes", "scopes", "nproc_per_node", "steps", "warmup",
                 "device", "batch_sizes", "ac", "float8", "ce_kernels", "compile_scopes", "loss_tol"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    parts += [] if args.regional else ["--no-regional"]
    parts += [] if args.capture else ["--no-capture"]
    parts += ["--rank-noisy"] if args.rank_noisy else []
    return shlex.join(parts + list(args.overrides))


def run(args: argparse.Namespace) -> int:
    from kiln.config import load_config

    llm = load_config(args.config, list(args.overrides) + ([f"training.device={args.device}"] if args.device else []))
    if autotune_llm.is_llm(llm):  # batch, checkpointing, float8, CE kernel, compile scope instead of recipes
        return autotune_llm.run(args, llm, _command(args))
    opts, nproc, notes = plan(args)  # ConfigError -> exit 2 before any work


    import torch
    from rich.console import Console

    from kiln.cli.results import claim_results_dir, stopped_line
    from kiln.config.errors import ConfigError
    from kiln.models import build_model
    from kiln.monitor.env import collect_env
    from kiln.runtime import resolve_device
    from kiln.tune.output import best_config, changed_keys, evidence_config, render_table, write_best, write_evidence
    from kiln.tune.progress import RichProgress
    from kiln.tune.search import Search
    from kiln.tune.space import describe

    cfg = opts.cfg
    try:
        with torch.device("meta"):
            has_blocks = bool(build_model(cfg.model).blocks)
    except ConfigError:
        raise
    except Exception:  # a factory that cannot build on meta: build it for real, once
        has_blocks = bool(build_model(cfg.model).blocks)
    out = claim_results_dir(args, f"autotune-{cfg.model.name}")
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    precisions = opts.space.precisions
    print(f"kiln: autotune {cfg.model.name} on {where}, budget {args.budget:g} min; precisions {', '.join(precisions)}"
          + (" (a precision change changes the numerics: each candidate is accuracy-checked; --precisions restricts)"
             if len(precisions) > 1 else ""), file=sys.stderr)
    for note in notes:
        print(f"kiln: {note}", file=sys.stderr)
    with RichProgress(opts.budget_s) as progress:
        search = Search(opts, has_blocks=has_blocks, log=progress.log, progress=progress)
        result = search.run()
        if nproc and not result.stop_reason:
            from kiln.tune.strategy import strategy_stage

            strategy_stage(result, opts, nproc, out, log=progress.log)
    result.notes[:0] = notes
    best = best_config(cfg, result)
    changes = changed_keys(cfg, best)
    path = write_best(out, cfg, result, model=cfg.model.name, device=where, precisions=precisions)
    title = f"kiln autotune: {cfg.model.name} (batch {cfg.data.batch_size}, {where})"
    config = evidence_config(cfg, opts, result, changes, budget_min=args.budget)
    written = write_evidence(out, result, env=collect_env(), config=config, command=_command(args), title=title,
                             changes=changes, precisions=precisions, model=cfg.model.name, device=where)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(render_table(result, title))
    gain = result.speedup_vs_default
    if not changes:
        verdict = "the config's own recipe stays"
    elif gain:
        verdict = f"{len(changes)} key(s) changed, {gain:.2f}x the config's own recipe"
    else:
        verdict = f"{len(changes)} key(s) changed; the config's own recipe did not run here"
    print(f"kiln: winner {describe(result.winner)}"
          f" ({verdict}); {len(result.trials)} rows measured in {result.elapsed_s / 60:.1f} min, "
          f"{len(result.not_tried)} not tried; wrote {path}, {', '.join(str(p) for p in written)}")
    print(f"kiln: train with it: kiln train --config {path}")
    if line := stopped_line(result, out):
        print(line, file=sys.stderr)
    return 0
