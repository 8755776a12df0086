"""`kiln bench llm [...]`: generation engines side by side. Argument parsing only: the flags become
one kiln.bench.llm_options.LlmBenchOptions, which the library checks (before any model is built)
and runs (kiln.bench.llm_bench.bench_llm)."""

from __future__ import annotations

import argparse
import shlex

from kiln.cli.args import add_verbose_flag
from kiln.cli.llm_args import (
    MODEL_HELP,
    add_decode_attention_flag,
    add_decode_matvec_flag,
    add_quant_flags,
    int_list,
    split_list,
)


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
    p.add_argument("--model", help=MODEL_HELP)
    p.add_argument("--preset", help="seed002-llama3b (its model and sizes; flags given still apply)")
    p.add_argument("--engines", action="append", help="comma-separated: hf-eager,hf-compiled,kiln-eager,kiln-compiled")
    p.add_argument("--batch", action="append", type=int_list, help="batch sizes (prompts per request), comma-separated, e.g. "
                   "1,4,16,64: every engine runs once per batch size, each row with its roofline for the weights "
                   "and the KV cache a step reads (default 1)")
    p.add_argument("--prompt-len", type=int, help="prompt tokens (default 1024)")
    p.add_argument("--new-tokens", type=int, help="tokens generated per request (default 256)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, fp32")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests per engine after the first (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed requests per engine, interleaved (default 3)")
    p.add_argument("--prefill-repeats", type=int, default=10, help="timed prefills per engine (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt and of random weights")
    p.add_argument("--inductor", action="append", metavar="KEY=VALUE",
                   help="inductor option for kiln-compiled, over kiln's defaults (coordinate_descent_tuning=true "
                   "on CUDA), e.g. max_autotune=true; repeatable")
    add_quant_flags(p, many=True)
    p.add_argument("--ppl-file", help="local text file (tokenized with the model's tokenizer.json), file of token "
                   "ids, or a `kiln data prepare` directory (its val.bin): perplexity of every kiln model on it; on "
                   "real weights a quantized row over the perplexity bound (int8 +1%%, int4 +5%%) is accuracy_fail")
    p.add_argument("--ppl-context", type=int, default=1024, help="perplexity window in tokens (default 1024)")
    p.add_argument("--ppl-tokens", type=int, default=16384,
                   help="score at most this many tokens of --ppl-file (default 16384)")
    p.add_argument("--prefill", default="compiled",
                   help="kiln-compiled's prefill: compiled (default) or eager (skips a whole-model compile per row)")
    p.add_argument("--tuning", default="full", help="where kiln-compiled runs coordinate-descent tuning: full "
                   "(default), decode (not in prefill: shorter warm-up), off (also slows batch-1 decode)")
    add_decode_attention_flag(p)
    add_decode_matvec_flag(p)
    p.add_argument("--deadline-s", type=float, help="start no row's warm-up after this many seconds; later rows are "
                   "skipped (a time-boxed run still writes every row it finished)")
    p.add_argument("--profile-decode", type=int, default=0, metavar="N",
                   help="after timing, profile N decode steps of each kiln row (torch.profiler): kernels, GPU gaps, "
                   "bandwidth while busy and what bounds decode, in DIR/decode_profile/ (default 0: off)")
    p.add_argument("--gpt-fast", metavar="DIR", help="a gpt-fast checkout: add its rows (bf16, and int4 through its own "
                   "quantize.py) on the same weights, run after kiln's in subprocesses; its commit is recorded")
    p.add_argument("--gpt-fast-quant", default="none,int4", help="gpt-fast rows: comma-separated none,int4 "
                   "(default both; int4 groups of --group-size, default 128)")
    p.add_argument("--gpt-fast-timeout-s", type=float, default=600.0,
                   help="seconds all gpt-fast rows together may take (default 600)")
    p.add_argument("--end-by-s", type=float, help="gpt-fast rows end by this many seconds after the bench started "
                   "(with --deadline-s, a time-boxed run); a row out of time records why")
    p.add_argument("--out", help="output directory (default: runs/<time>-bench-llm-<name>)")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def options(args: argparse.Namespace):
    """The flags as kiln.bench.llm_options.LlmBenchOptions (comma lists split; nothing checked here)."""
    from kiln.bench.llm_options import LlmBenchOptions

    return LlmBenchOptions(
        model=args.model, preset=args.preset, engines=split_list(args.engines),
        batch=[b for chunk in args.batch or [] for b in chunk],
        prompt_len=args.prompt_len, new_tokens=args.new_tokens, device=args.device, dtype=args.dtype,
        warmup=args.warmup, repeats=args.repeats, prefill_repeats=args.prefill_repeats, seed=args.seed,
        inductor=list(args.inductor or []), quants=split_list(args.quant), group_size=args.group_size,
        quant_backend=args.quant_backend, quant_lm_head=args.quant_lm_head == "on", ppl_file=args.ppl_file,
        ppl_context=args.ppl_context, ppl_tokens=args.ppl_tokens, prefill=args.prefill, tuning=args.tuning,
        decode_attention=args.decode_attention, decode_matvec=args.decode_matvec, deadline_s=args.deadline_s,
        profile_decode=args.profile_decode, gpt_fast=args.gpt_fast, gpt_fast_quants=split_list([args.gpt_fast_quant]),
        gpt_fast_timeout_s=args.gpt_fast_timeout_s, end_by_s=args.end_by_s, out=args.out)


def _command(args: argparse.Namespace) -> str:
    """The command line as given (flags at their defaults left out), recorded with the results."""
    parts = ["kiln", "bench", "llm"]
    defaults = {"quant_backend": "torchao", "quant_lm_head": "on", "ppl_context": 1024, "ppl_tokens": 16384,
                "prefill": "compiled", "tuning": "full", "profile_decode": 0, "decode_attention": "auto",
                "decode_matvec": "auto", "gpt_fast_quant": "none,int4", "gpt_fast_timeout_s": 600.0}
    for flag in ("model", "preset", "prompt_len", "new_tokens", "device", "dtype", "warmup", "repeats",
                 "prefill_repeats", "seed", "group_size", "quant_backend", "quant_lm_head", "ppl_file", "ppl_context",
                 "ppl_tokens", "prefill", "tuning", "decode_attention", "decode_matvec", "deadline_s", "profile_decode", "out",
                 "gpt_fast", "gpt_fast_quant", "gpt_fast_timeout_s", "end_by_s"):
        value = getattr(args, flag)
        if value is not None and value != defaults.get(flag):
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    for flag in ("engines", "quant"):
        if getattr(args, flag):
            parts += [f"--{flag}", ",".join(split_list(getattr(args, flag)))]
    if args.batch:
        parts += ["--batch", ",".join(str(b) for chunk in args.batch for b in chunk)]
    for option in args.inductor or []:
        parts += ["--inductor", option]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from kiln.bench.llm_bench import bench_llm
    from kiln.bench.llm_report import render_table
    from kiln.cli.results import show_results

    result = bench_llm(options(args), command=_command(args))  # ConfigError -> exit 2 before any work
    show_results(result.rows, render_table(result.rows, result.title), result.written)
    return 0
