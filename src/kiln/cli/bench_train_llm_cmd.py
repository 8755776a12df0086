"""`kiln bench train-llm [...]`: LLM training recipes (kiln, the plain transformers loop, torchtitan)
side by side. Argument parsing and printing only: the flags come from
kiln.bench.train_llm.llm_train_request.TrainLlmRequest, kiln.bench.train_llm.llm_train_check checks them (before any
work) and kiln.bench.train_llm.llm_train_run measures."""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.bench.train_llm.llm_train_request import TrainLlmRequest
from kiln.config.options import add_flags, from_namespace


def add_parser(bsub) -> None:
    p = bsub.add_parser(
        "train-llm",
        help="LLM training: kiln recipes vs the plain transformers loop vs torchtitan (tok/s, MFU, memory, loss)",
        description="Each row trains the same model from the same initial weights on the same tokens for --steps "
        "steps, in one call: tokens/s, median step time, MFU against the GPU's datasheet peak and a bf16 matmul "
        "measured in the same process, peak memory, loss after the steps, and each row's exact config. Writes "
        "results.json and results.md.",
    )
    add_flags(p, TrainLlmRequest)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.bench.train_llm.llm_train_check import check_train_llm

    opts = check_train_llm(from_namespace(TrainLlmRequest, args))  # ConfigError -> exit 2 before any work

    from pathlib import Path

    from kiln.bench.train_llm.llm_train_report import write_report
    from kiln.bench.train_llm.llm_train_run import run as run_rows
    from kiln.cli.show_results import claim_results_dir, remove_scratch_on_interrupt
    from kiln.monitor.env import collect_env

    out = claim_results_dir(args, f"bench-train-llm-{Path(args.model).name}")
    env, command = collect_env(), shlex.join(["kiln", *sys.argv[1:]])
    try:
        rows, ctx = run_rows(opts, out, log=lambda m: print(f"kiln: {m}", file=sys.stderr, flush=True),
                             progress=lambda so_far, c: write_report(out, so_far, c, opts, env=env, command=command))
    except KeyboardInterrupt:  # the rows written so far stay; the corpus and initial weights are scratch
        remove_scratch_on_interrupt(out, [out / "data"] if opts.data_dir is None else [])
        raise
    written = write_report(out, rows, ctx, opts, env=env, command=command)
    print(written["table"])
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"kiln: {len(rows)} rows ({', '.join(f'{n} {s}' for s, n in counts.items())}); wrote "
          f"{written['json']}, {written['md']}")
    return 0
