"""`kiln autotune [--config FILE] [--budget MINUTES] [--out DIR] [KEY=VALUE ...]`: argument parsing
and the progress display. The flags come from kiln.tune.autotune_request.AutotuneRequest; kiln.tune.autotune_check
checks them (before any work) and kiln.tune searches."""

from __future__ import annotations

import argparse
import sys

from kiln.cli import autotune_llm
from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, command_line, from_namespace
from kiln.tune.autotune_request import AutotuneRequest

WORDS = ["kiln", "autotune"]


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
    add_flags(p, AutotuneRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.tune.autotune_check import autotune_config, is_llm, plan_autotune

    req = from_namespace(AutotuneRequest, args)
    command = command_line(WORDS, req)
    llm = autotune_config(req)
    if is_llm(llm):  # batch, checkpointing, float8, CE kernel, compile scope instead of recipes
        return autotune_llm.run(args, req, llm, command)
    opts, nproc, notes = plan_autotune(req)  # ConfigError -> exit 2 before any work

    import torch
    from rich.console import Console

    from kiln.cli.show_results import claim_results_dir, stopped_line
    from kiln.monitor.env import collect_env
    from kiln.runtime import resolve_device
    from kiln.tune.autotune_check import has_blocks
    from kiln.tune.output import best_config, changed_keys, evidence_config, render_table, write_best, write_evidence
    from kiln.tune.progress import RichProgress
    from kiln.tune.search import Search
    from kiln.tune.space import describe

    cfg = opts.cfg
    blocks = has_blocks(cfg)  # a model that does not build is bad input (exit 2) before any output
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
        search = Search(opts, has_blocks=blocks, log=progress.log, progress=progress)
        result = search.run()
        if nproc and not result.stop_reason:
            from kiln.tune.strategy_stage import strategy_stage

            strategy_stage(result, opts, nproc, out, log=progress.log)
    result.notes[:0] = notes
    best = best_config(cfg, result)
    changes = changed_keys(cfg, best)
    path = write_best(out, cfg, result, model=cfg.model.name, device=where, precisions=precisions)
    title = f"kiln autotune: {cfg.model.name} (batch {cfg.data.batch_size}, {where})"
    config = evidence_config(cfg, opts, result, changes, budget_min=args.budget)
    written = write_evidence(out, result, env=collect_env(), config=config, command=command, title=title,
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
