"""`kiln bench llm [...]`: generation engines side by side. Argument parsing and printing only: the
flags come from kiln.bench.llm.llm_request.LlmBenchOptions (one field per flag), which the library
checks (before any model is built) and runs (kiln.bench.llm.llm_bench.bench_llm)."""

from __future__ import annotations

import argparse

from kiln.bench.llm.llm_request import LlmBenchOptions
from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, command_line, from_namespace

WORDS = ["kiln", "bench", "llm"]


def add_parser(bsub) -> None:
    p = bsub.add_parser(
        "llm",
        help="LLM generation engines (HF eager/compiled, kiln eager/compiled): TTFT, prefill, decode, roofline",
        description="Engines side by side in one process on one random prompt: TTFT, prefill ms and tok/s "
        "(TFLOP/s vs the best matmul measured on the spot and the GPU's datasheet), decode tok/s and per-token "
        "p50/p90 (vs the bandwidth roofline of a read-only stream measured on the spot and the datasheet), "
        "warm-up/compile time, peak memory. "
        "With --quant, each kiln engine runs once per quantization, with its weight bytes, roofline, memory, "
        "logit drift against the unquantized model and (--ppl-file) perplexity. "
        "Writes results.json, results.md and results.png.",
    )
    add_flags(p, LlmBenchOptions)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def options(args: argparse.Namespace) -> LlmBenchOptions:
    """The flags as LlmBenchOptions (comma lists split; nothing checked here)."""
    return from_namespace(LlmBenchOptions, args)


def run(args: argparse.Namespace) -> int:
    from kiln.bench.llm.llm_bench import bench_llm
    from kiln.bench.llm.llm_report import render_table
    from kiln.cli.show_results import show_results

    opts = options(args)
    result = bench_llm(opts, command=command_line(WORDS, opts))  # ConfigError -> exit 2 before any work
    show_results(result.rows, render_table(result.rows, result.title), result.written)
    return 0
