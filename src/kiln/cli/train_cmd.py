"""`kiln train [--config FILE.toml] [--run-dir DIR] [--nproc-per-node N ...] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.train.train_options import TrainOptions


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (default: the seed MLP on synthetic data, short run)",
        description="Train a model. Overrides use dotted config keys, e.g. training.steps=50 compile.enabled=true",
    )
    add_flags(p, TrainOptions, only=("config", "run_dir"))
    add_verbose_flag(p)
    add_flags(p, TrainOptions, only=("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "max_restarts",
                                     "rdzv_wait", "overrides"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.config import load_config

    options = from_namespace(TrainOptions, args)
    cfg = load_config(options.config, options.overrides)  # ConfigError -> exit 2 before torch is imported

    from kiln.train.command import run_train, train_request

    def on_run_dir(run_dir) -> None:  # a failure's error.log and dependencies.log (kiln.noise) go there
        args.output_dir = run_dir

    outcome = run_train(cfg, train_request(options, verbose=args.verbose, on_run_dir=on_run_dir))
    for line in outcome.lines:
        print(line)
    return outcome.code
