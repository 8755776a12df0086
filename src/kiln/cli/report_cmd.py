"""`kiln report RUN_DIR | BENCH_DIR [--out DIR]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.report.report_request import ReportRequest


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="markdown + self-contained HTML report with plots of a run dir or bench results dir",
        description="Report on a run dir (metrics.jsonl, summary.json: loss, throughput, MFU, memory, GPU health, "
        "per-rank timing, and the profile summary of a `kiln profile` dir) or a bench results dir (results.json: "
        "the table and charts). Writes report.md with report_files/*.png, and report.html with the images inlined.",
    )
    add_flags(p, ReportRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.report.contents import make_report, report_target

    request = from_namespace(ReportRequest, args)
    args.output_dir = report_target(request)  # a failure's error.log goes where the report was going
    written = make_report(request.path, request.out)
    print(f"kiln: wrote {written['html']} and {written['md']} (+ {written['files']}/)")
    return 0
