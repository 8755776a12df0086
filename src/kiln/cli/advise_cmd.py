"""`kiln advise [TARGET] [--config FILE] [--json FILE] [--measure/--no-measure] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.args import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "advise",
        help="check a model and config against the speed checklist: shapes, bf16, channels-last, data, breaks, "
             "launch overhead, DDP/FSDP; each with a fix and the gain measured here",
        description="Static and measured checks of a model trained with a config, each with a concrete fix and, "
        "where it can be measured, the gain measured on this machine: matmul/conv dims not multiples of 8 (timed at "
        "their shape and padded), fp32 where bf16 would do, channels-last for convnets, a data loader that starves "
        "the device (a short profiled run), graph breaks (kiln explain), launch-bound steps that whole-step CUDA "
        "graphs fix (GPU idle gaps, then the capture measured), DDP vs FSDP fit, CPU threads.",
    )
    p.add_argument("--config", help="TOML config of the run to check (as for kiln train)")
    p.add_argument("--json", metavar="FILE", help="write the findings as JSON to FILE ('-' for stdout, no table)")
    p.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                   help="time what can be timed: a short profiled run, padded GEMMs, channels-last, bf16, capture "
                        "(default); --no-measure runs the static checks only")
    p.add_argument("--device", help="same as training.device=... (auto, cpu, cuda, cuda:N)")
    p.add_argument("--budget", type=float, metavar="MIN",
                   help="start no check after MIN minutes; the checks left are listed as not run (a check already "
                        "running finishes)")
    p.add_argument("words", nargs="*", metavar="[TARGET] [KEY=VALUE ...]",
                   help="TARGET, the model: registry name (mlp, vit), package.module:function or path/to/file.py:function "
                        "(default: the config's model.name); then config overrides, after --config")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.advise.advise_config import advise_config

    cfg = advise_config(args.config, args.words, args.device)  # ConfigError -> exit 2 before any work

    from kiln.advise.advise_run import advise_target
    from kiln.advise.findings import Finding, render
    from kiln.cli.explain_cmd import emit

    def say(message: str) -> None:
        if args.json != "-":
            print(f"kiln: advise: {message}", file=sys.stderr, flush=True)

    report = advise_target(cfg, measure=args.measure, say=say, budget_min=args.budget)
    findings = [Finding(**f) for f in report["findings"]]
    title = (f"kiln advise: {report['target']} ({report['precision']}, batch {report['batch_size']}, "
             f"{report['device_name']}{'' if report['measured'] else ', static checks only'})")
    emit(report, args.json, lambda r: render(findings, title))
    if args.json != "-":
        counts = ", ".join(f"{n} {s}" for s, n in report["counts"].items())
        print(f"kiln: {len(findings)} checks ({counts})")
    if report.get("over_budget"):
        not_run = sum(1 for f in findings if f.finding.startswith("not run: over the --budget"))
        print(f"kiln: advise: stopped at its --budget of {args.budget:g} min: the findings made before it are above, "
              f"{not_run} checks not run", file=sys.stderr)
    if report.get("interrupted"):
        not_run = sum(1 for f in findings if f.finding.startswith("not run: interrupted"))
        print(f"kiln: advise: stopped by Ctrl-C: the findings made before it are above, {not_run} checks not run; "
              "the short profiled run's temporary directory was removed", file=sys.stderr)
    return 0
