"""`kiln profile [--config FILE] [--steps N] [--warmup N] [--memory-steps N] [--out DIR] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="torch.profiler over a window of training steps: trace, kernel/idle-gap/memory summary",
        description="Run the training step `kiln train` runs (same config, same build) for a short window under "
        "torch.profiler. Writes a trace for Perfetto/TensorBoard, a CUDA memory snapshot, and a summary (top "
        "kernels; share of GPU time in Triton, matmul and communication kernels; GPU idle gaps between kernels; "
        "memory peak by category) to DIR/profile_summary.{json,md}, and prints it. On a CPU the host-side parts "
        "are reported and the GPU parts say n/a.",
    )
    p.add_argument("--config", help="TOML config file (as for kiln train)")
    p.add_argument("--steps", type=int, default=10, help="profiled steps (default 10)")
    p.add_argument("--warmup", type=int, default=5, help="steps after the first (compiling) one before the window, >= 1 (default 5)")
    p.add_argument("--memory-steps", type=int, default=2,
                   help="steps after the window with memory profiling and the CUDA allocator history (0: none)")
    p.add_argument("--out", help="output directory (default: runs/<time>-profile-<model>)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, after --config (training.steps and intervals are set by the window)")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kiln.config import load_config
    from kiln.profile.profile_run import profile_config, profile_run
    from kiln.runtime import default_run_dir

    cfg = load_config(args.config, args.overrides)  # ConfigError -> exit 2 before any work
    profile_config(cfg, steps=args.steps, warmup=args.warmup, memory_steps=args.memory_steps)  # flags too
    out = Path(args.out) if args.out else default_run_dir(f"profile-{cfg.model.name}")
    args.output_dir = out  # a failure's error.log lands with the profile (once the run made it)
    summary = profile_run(cfg, out, steps=args.steps, warmup=args.warmup, memory_steps=args.memory_steps)
    if summary is None:
        return 0
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(Markdown((out / "profile_summary.md").read_text()))
    print(f"kiln: profiled {args.steps} steps; wrote {out / 'profile_summary.json'}, {out / 'profile_summary.md'}, "
          f"{out / summary['trace']}")
    return 0
