"""`kiln bench compile|llm|scale|comm|predict [...]`: benchmark commands (`llm` lives in bench_llm_cmd;
scale, comm and predict in bench_scale_cmd). Argument parsing and printing only: compile's flags
come from kiln.bench.compile.compile_request.CompileRequest; kiln.bench.compile.compile_command checks them (before
any model is built) and runs the recipes."""

from __future__ import annotations

import argparse
import sys

from kiln.bench.compile.compile_request import CompileRequest
from kiln.cli.args import DefaultsFormatter, add_verbose_flag
from kiln.cli.show_results import claim_results_dir, show_results
from kiln.config.options import add_flags, command_line, from_namespace

WORDS = ["kiln", "bench", "compile"]


def add_parser(sub) -> None:
    from kiln.cli import bench_llm_cmd, bench_scale_cmd, bench_train_llm_cmd

    bench = sub.add_parser("bench", help="benchmarks with results.json/md/png: compile, llm, train-llm, scale, comm, predict")
    bench.set_defaults(run=_no_subcommand, bench_parser=bench)
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH", parser_class=type(bench))
    p = bsub.add_parser(
        "compile",
        help="eager vs compile recipes (modes, precisions, backends, scopes), interleaved, accuracy-checked",
        description="Eager and each selected compile recipe side by side in one process: compile time, "
        "interleaved step times, speedups, memory, graph breaks, accuracy vs an fp64 reference. "
        "List flags take comma-separated values and may repeat.",
    )
    add_flags(p, CompileRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run_compile)
    bench_llm_cmd.add_parser(bsub)
    bench_train_llm_cmd.add_parser(bsub)
    bench_scale_cmd.add_parsers(bsub)
    for parser in bsub.choices.values():  # every bench subcommand's --help shows its defaults
        parser.formatter_class = DefaultsFormatter


def _no_subcommand(args: argparse.Namespace) -> int:
    args.bench_parser.print_help()
    return 2


def run_compile(args: argparse.Namespace) -> int:
    from kiln.activity import Activity
    from kiln.bench.compile.compile_command import check_compile, run_compile_job
    from kiln.bench.compile.compile_report import render_table

    req = from_namespace(CompileRequest, args)
    job = check_compile(req, say=lambda line: print(line, file=sys.stderr))  # ConfigError -> exit 2 before any work
    out = claim_results_dir(args, f"bench-compile-{job.name}")
    with Activity() as activity:  # what is compiling or timing now, on stderr
        rows, written, title = run_compile_job(job, out, command_line(WORDS, req), log=activity.log,
                                               phase=activity.phase)
    show_results(rows, render_table(rows, title), written)
    return 0
