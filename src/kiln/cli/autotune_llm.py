"""`kiln autotune` for an LLM config (`model.name=llama:...`): the run and its display; the flags
are kiln.tune.autotune_request's LLM group, kiln.tune.autotune_check.plan_autotune_llm checks them (before any work)
and kiln.tune.llm_search searches. Other models take kiln.cli.autotune_cmd's compile-recipe
search."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace, req, cfg, command: str) -> int:
    from kiln.tune.autotune_check import plan_autotune_llm

    opts, notes = plan_autotune_llm(req, cfg)  # ConfigError -> exit 2 before any work

    import torch

    from kiln.cli.show_results import claim_results_dir, stopped_line
    from kiln.monitor.env import collect_env
    from kiln.runtime import resolve_device
    from kiln.tune.llm_output import result_rows, write_best, write_evidence
    from kiln.tune.llm_search import LlmSearch

    out = claim_results_dir(args, f"autotune-{cfg.model.name.replace('/', '_')}")
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def log(message: str) -> None:
        print(f"kiln: {message}", file=sys.stderr, flush=True)

    log(f"autotune (LLM) {cfg.model.name} on {where}, budget {req.budget:g} min: batch {opts.space.batches}, "
        f"ac {opts.space.ac}, ce {opts.space.ce}, precision {opts.space.precision or [cfg.precision.policy]}, "
        f"float8 {opts.space.float8}, compile {opts.space.compile}")
    for note in notes:
        log(note)
    result = LlmSearch(opts, log=log).run()
    result.notes[:0] = notes
    path = write_best(out, cfg, result, model=cfg.model.name, device=where)
    title = f"kiln autotune (LLM): {cfg.model.name} ({where})"
    written = write_evidence(out, cfg, result, opts, env=collect_env(), command=command, title=title)
    from kiln.bench.results import markdown_table
    from kiln.tune.llm_output import COLUMNS

    print(markdown_table(result_rows(result), COLUMNS))
    gain = result.speedup_vs_default
    print(f"kiln: winner {result.winner.describe()}" + (f" ({gain:.2f}x the config's own tokens/s)" if gain else "")
          + f"; {len(result.trials)} rows measured in {result.elapsed_s / 60:.1f} min, {len(result.not_tried)} not "
          f"tried; wrote {path}, {', '.join(str(p) for p in written)}")
    print(f"kiln: train with it: kiln train --config {path}")
    if line := stopped_line(result, out):
        print(line, file=sys.stderr)
    return 0
