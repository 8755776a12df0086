"""`kiln profile [--config FILE] [--steps N] [--warmup N] [--memory-steps N] [--out DIR] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.profile.profile_request import ProfileRequest


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
    add_flags(p, ProfileRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.profile.profile_run import profile_plan, profile_run

    request = from_namespace(ProfileRequest, args)
    cfg, out = profile_plan(request)  # ConfigError -> exit 2 before any work
    args.output_dir = out  # a failure's error.log lands with the profile (once the run made it)
    summary = profile_run(cfg, out, steps=request.steps, warmup=request.warmup, memory_steps=request.memory_steps)
    if summary is None:
        return 0
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(Markdown((out / "profile_summary.md").read_text()))
    print(f"kiln: profiled {request.steps} steps; wrote {out / 'profile_summary.json'}, {out / 'profile_summary.md'}, "
          f"{out / summary['trace']}")
    return 0
