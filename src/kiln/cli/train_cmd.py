"""`kiln train [--config FILE.toml] [--run-dir DIR] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (default: the seed MLP on synthetic data, short run)",
        description="Train a model. Overrides use dotted config keys, e.g. training.steps=50 compile.enabled=true",
    )
    p.add_argument("--config", help="TOML config file (see configs/); defaults apply to missing keys")
    p.add_argument("--run-dir", help="output directory (default: runs/<time>-<model>)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, applied after --config")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.config import load_config

    cfg = load_config(args.config, args.overrides)  # ConfigError -> exit 2 before any work

    from kiln.train.trainer import Trainer

    trainer = Trainer(cfg, args.run_dir)  # builds model and data: bad paths/names also exit 2 here
    summary = trainer.fit()
    rate = summary.get("tokens_per_s") and f"{summary['tokens_per_s']:.0f} tokens/s" or (
        f"{summary['samples_per_s']:.0f} samples/s"
    )
    print(
        f"kiln: {summary['status']} {summary['steps']} steps, loss {summary['first_loss']:.4f} -> "
        f"{summary['final_loss']:.4f}, {summary['step_ms_median']:.2f} ms/step, {rate}; run dir {trainer.run_dir}"
    )
    return 0
