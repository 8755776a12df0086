"""`kiln report RUN_DIR | BENCH_DIR [--out DIR]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="markdown + self-contained HTML report with plots of a run dir or bench results dir",
        description="Report on a run dir (metrics.jsonl, summary.json: loss, throughput, MFU, memory, GPU health, "
        "per-rank timing, and the profile summary of a `kiln profile` dir) or a bench results dir (results.json: "
        "the table and charts). Writes report.md with report_files/*.png, and report.html with the images inlined.",
    )
    p.add_argument("path", metavar="RUN_DIR|BENCH_DIR", help="a kiln train/profile run dir or a kiln bench --out dir")
    p.add_argument("--out", help="where to write the report (default: into RUN_DIR|BENCH_DIR; refused while "
                   "a running kiln process holds that dir)")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kiln.outputs import refuse_held_by_another
    from kiln.report.contents import make_report

    path = Path(args.path)
    target = Path(args.out) if args.out else path.parent if path.is_file() else path
    # A run or bench still being written is its process's: report on it, but write the report elsewhere.
    refuse_held_by_another(target, "--out", "pass --out DIR to write the report elsewhere")
    args.output_dir = target  # a failure's error.log goes where the report was going

    written = make_report(args.path, args.out)
    print(f"kiln: wrote {written['html']} and {written['md']} (+ {written['files']}/)")
    return 0
