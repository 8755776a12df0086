"""`kiln bench scale | comm | predict`: argument parsing and printing only. The flags come from
kiln.bench.scale.scale_request (one field per flag); kiln.bench.scale.scale_command checks them (before any
process is started) and runs the bench. Registered from kiln.cli.bench_cmd.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.bench.scale.scale_request import CommRequest, PredictRequest, ScaleRequest
from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace


def add_parsers(bsub) -> None:
    p = bsub.add_parser(
        "scale", help="scaling efficiency over rank counts (DDP, FSDP2), collective bandwidth, predictions",
        description="Launch each (variant, rank count) point through torchrun as `kiln train --nproc-per-node N` "
        "does, then measure collectives at the model's sizes and predict efficiency at larger scale.")
    add_flags(p, ScaleRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run_scale)

    c = bsub.add_parser(
        "comm", help="collective bandwidth (all-reduce, reduce-scatter, all-gather) at the model's sizes",
        description="Time all-reduce at the model's DDP bucket sizes and all-gather / reduce-scatter at its FSDP2 "
        "unit sizes (plus a size sweep for the latency/bandwidth fit), on N ranks started through torchrun; "
        "algbw and busbw as nccl-tests defines them.")
    add_flags(c, CommRequest)
    add_verbose_flag(c)
    c.set_defaults(run=run_comm)

    d = bsub.add_parser(
        "predict", help="predict scaling from measured points (a bench scale results.json)",
        description="Rebuild the prediction rows of `kiln bench scale` from a results.json of measured points "
        "(and optionally a `kiln bench comm` results.json), e.g. to validate against committed results.")
    add_flags(d, PredictRequest)
    d.set_defaults(run=run_predict)


def _command(name: str) -> str:
    """The command line as typed (recorded with the results)."""
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith(("kiln", "__main__.py")) else []
    return shlex.join(["kiln", *argv]) if argv else f"kiln bench {name} (called from Python)"


def _print(rows, title, written) -> None:
    from rich.console import Console

    from kiln.bench.scale.scale_report import render_table

    console = Console()
    if not console.is_terminal:  # piped or logged: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(render_table(rows, title))
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"kiln: {len(rows)} rows ({', '.join(f'{n} {s}' for s, n in counts.items())}); "
          f"wrote {', '.join(str(p) for p in written.values())}")


def run_scale(args: argparse.Namespace) -> int:
    from kiln.activity import Activity
    from kiln.bench.scale.scale_command import check_scale, run_scale_job
    from kiln.cli.show_results import remove_scratch_on_interrupt

    job = check_scale(from_namespace(ScaleRequest, args))  # ConfigError -> exit 2 before any process starts
    try:
        with Activity() as activity:  # what runs now, on stderr: points take a while each
            rows, written = run_scale_job(job, _command("scale"), phase=activity.phase)
    except KeyboardInterrupt:  # the points written so far stay; their training checkpoints are scratch
        remove_scratch_on_interrupt(job.out, sorted((job.out / "points").glob("*/checkpoints")))
        raise
    _print(rows, job.title, written)
    return 0


def run_comm(args: argparse.Namespace) -> int:
    from kiln.bench.scale.scale_command import bench_comm

    result = bench_comm(from_namespace(CommRequest, args), _command("comm"))
    if result is None:  # one of the launched ranks
        return 0
    if result.written is not None:
        _print(result.rows, result.title, result.written)
        return 0
    if result.rows and result.rows[0]["status"] == "error":
        print(f"kiln: failed: {result.rows[0]['reason']}", file=sys.stderr)
        return 1
    print((result.out / "results.md").read_text().split("\nCommand:")[0])
    print(f"kiln: wrote {result.out / 'results.json'}, {result.out / 'results.md'}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from kiln.bench.scale.scale_command import bench_predict

    rows, written, title = bench_predict(from_namespace(PredictRequest, args), _command("predict"))
    _print(rows, title, written)
    return 0
