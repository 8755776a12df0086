"""`kiln bench llm [...]`: generation engines side by side. Argument parsing and checks only; the
measuring is in kiln.bench.llm_bench. Every check runs before a model is built."""

from __future__ import annotations

import argparse
import difflib
import shlex

from kiln.cli.args import add_verbose_flag
from kiln.cli.llm_args import (
    MODEL_HELP,
    add_decode_attention_flag,
    add_decode_matvec_flag,
    add_quant_flags,
    at_least,
    check_decode_attention,
    check_decode_matvec,
    resolve_device_flag,
    resolve_dtype_flag,
    resolve_quant_flags,
    split_list,
)
from kiln.config.errors import ConfigError


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
    p.add_argument("--batch", type=int, help="prompts per request (default 1)")
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


def plan(args: argparse.Namespace):
    from kiln.bench.llm_bench import PRESETS, LlmBenchOptions
    from kiln.bench.llm_engines import ENGINES, PREFILL_MODES, TUNING
    from kiln.bench.llm_quant import load_ppl_tokens
    from kiln.llm.config import resolve_model
    from kiln.llm.engine import check_lengths

    preset = None
    if args.preset:
        if args.preset not in PRESETS:
            raise ConfigError("--preset", f"unknown preset {args.preset!r}", tuple(PRESETS))
        preset = PRESETS[args.preset]
    model = args.model or (preset.model if preset else None)
    if not model:
        raise ConfigError("--model", "give a model (or --preset)", MODEL_HELP.split(" | "))
    engines = split_list(args.engines) or list(preset.engines if preset else ENGINES)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ConfigError("--engines", f"unknown engine {unknown[0]!r}", ENGINES)
    if len(set(engines)) != len(engines):
        raise ConfigError("--engines", f"an engine is listed twice: {','.join(engines)}")
    sizes = {"batch": 1, "prompt_len": 1024, "new_tokens": 256}
    for key, default in sizes.items():
        value = getattr(args, key)
        sizes[key] = value if value is not None else (getattr(preset, key) if preset else default)
        at_least(f"--{key.replace('_', '-')}", sizes[key], 1)
    at_least("--warmup", args.warmup, 0)
    at_least("--repeats", args.repeats, 1)
    at_least("--prefill-repeats", args.prefill_repeats, 1)
    at_least("--ppl-context", args.ppl_context, 2)
    at_least("--ppl-tokens", args.ppl_tokens, 2)
    if args.prefill not in PREFILL_MODES:
        raise ConfigError("--prefill", f"unknown prefill mode {args.prefill!r}", PREFILL_MODES)
    if args.tuning not in TUNING:
        raise ConfigError("--tuning", f"unknown tuning {args.tuning!r}", TUNING)
    at_least("--profile-decode", args.profile_decode, 0)
    if args.profile_decode:
        from kiln.profile.decode import window_fits

        fits = window_fits(sizes["new_tokens"])
        if args.profile_decode > fits:
            raise ConfigError("--profile-decode", f"{args.profile_decode} steps do not fit in a request of "
                              f"{sizes['new_tokens']} new tokens (at most {fits}: the window follows the graph's "
                              "warm-up steps within one request); raise --new-tokens or profile fewer steps")
        if not any(e.startswith("kiln") for e in engines):
            raise ConfigError("--profile-decode", "profiles kiln's engines; add kiln-eager or kiln-compiled to --engines")
    if args.deadline_s is not None and args.deadline_s <= 0:
        raise ConfigError("--deadline-s", f"must be > 0, got {args.deadline_s}")
    device = resolve_device_flag(args.device)
    dtype = resolve_dtype_flag(args.dtype, device)
    source = resolve_model(model)
    config = source.config
    check_decode_attention(args.decode_attention, device, dtype, config.head_dim)
    check_decode_matvec(args.decode_matvec, device, dtype)
    check_lengths([sizes["prompt_len"]], sizes["new_tokens"], max_positions=config.max_positions, max_seq_len=None,
                  keys={"max_new_tokens": "--new-tokens", "prompt": "--prompt-len"})
    kinds = split_list(args.quant) or ["none"]
    quants = resolve_quant_flags(kinds, args, config, device, dtype)
    if kinds != ["none"] and not any(e.startswith("kiln") for e in engines):
        raise ConfigError("--quant", "quantization applies to kiln's engines (HF rows stay unquantized references); "
                          "add kiln-eager or kiln-compiled to --engines")
    load_ppl_tokens(args.ppl_file, source, config.vocab_size)  # a bad file fails here, before any model is built
    peer = _gpt_fast_flags(args, config, sizes["batch"])
    return LlmBenchOptions(model=model, engines=engines, dtype=dtype, device=str(device), warmup=args.warmup,
                           repeats=args.repeats, prefill_repeats=args.prefill_repeats, seed=args.seed,
                           preset=preset.name if preset else None, inductor_options=_inductor_options(args.inductor),
                           quants=quants, ppl_file=args.ppl_file, ppl_context=args.ppl_context,
                           ppl_max_tokens=args.ppl_tokens, prefill=args.prefill, tuning=args.tuning,
                           decode_attention=args.decode_attention, decode_matvec=args.decode_matvec,
                           deadline_s=args.deadline_s, profile_decode=args.profile_decode, **peer, **sizes)


def _gpt_fast_flags(args: argparse.Namespace, config, batch: int) -> dict:
    """LlmBenchOptions' gpt-fast fields from --gpt-fast*, checked (ConfigError names the flag)."""
    from kiln.bench.peers.gpt_fast import QUANTS, check_checkout, model_args

    if not args.gpt_fast:
        return {}
    root = check_checkout(args.gpt_fast)
    quants = tuple(split_list([args.gpt_fast_quant]))
    bad = [q for q in quants if q not in QUANTS]
    if bad or not quants:
        raise ConfigError("--gpt-fast-quant", f"unknown gpt-fast quantization {bad[0] if bad else '(none given)'!r}",
                          QUANTS)
    if batch != 1:
        raise ConfigError("--batch", f"gpt-fast rows run batch 1 (its benchmark mode); got --batch {batch}")
    if args.end_by_s is not None and args.end_by_s <= 0:
        raise ConfigError("--end-by-s", f"must be > 0, got {args.end_by_s}")
    if args.gpt_fast_timeout_s <= 0:
        raise ConfigError("--gpt-fast-timeout-s", f"must be > 0, got {args.gpt_fast_timeout_s}")
    group = args.group_size or 128
    if "int4" in quants and group not in (32, 64, 128, 256):
        raise ConfigError("--group-size", f"gpt-fast's int4 takes group sizes 32, 64, 128, 256; got {group}")
    if config.vocab_size < 1024:
        raise ConfigError("--gpt-fast", f"gpt-fast's synthetic prompt draws ids below 1024; this model's vocabulary "
                          f"has {config.vocab_size}")
    try:
        model_args(config)
    except ValueError as exc:
        raise ConfigError("--gpt-fast", str(exc)) from None
    return {"gpt_fast": str(root.resolve()), "gpt_fast_quants": quants, "gpt_fast_group_size": group,
            "gpt_fast_timeout_s": args.gpt_fast_timeout_s, "end_by_s": args.end_by_s}


def _inductor_options(assignments: list[str] | None) -> dict[str, object]:
    from kiln.config.load import parse_literal
    from kiln.config.validate import inductor_option_names

    options: dict[str, object] = {}
    names = inductor_option_names() if assignments else []
    for assignment in assignments or []:
        key, sep, value = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--inductor", f"expected KEY=VALUE, got {assignment!r}")
        key = key.strip()
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            raise ConfigError("--inductor", f"{key!r} is not an inductor option in this torch", close or None)
        options[key] = parse_literal(value)
    return options


def _command(args: argparse.Namespace) -> str:
    parts = ["kiln", "bench", "llm"]
    defaults = {"quant_backend": "torchao", "quant_lm_head": "on", "ppl_context": 1024, "ppl_tokens": 16384,
                "prefill": "compiled", "tuning": "full", "profile_decode": 0, "decode_attention": "auto",
                "decode_matvec": "auto", "gpt_fast_quant": "none,int4", "gpt_fast_timeout_s": 600.0}
    for flag in ("model", "preset", "batch", "prompt_len", "new_tokens", "device", "dtype", "warmup", "repeats",
                 "prefill_repeats", "seed", "group_size", "quant_backend", "quant_lm_head", "ppl_file", "ppl_context",
                 "ppl_tokens", "prefill", "tuning", "decode_attention", "decode_matvec", "deadline_s", "profile_decode", "out",
                 "gpt_fast", "gpt_fast_quant", "gpt_fast_timeout_s", "end_by_s"):
        value = getattr(args, flag)
        if value is not None and value != defaults.get(flag):
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    for flag in ("engines", "quant"):
        if getattr(args, flag):
            parts += [f"--{flag}", ",".join(split_list(getattr(args, flag)))]
    for option in args.inductor or []:
        parts += ["--inductor", option]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    opts = plan(args)  # ConfigError -> exit 2 before any model is built

    import dataclasses
    from pathlib import Path

    import torch

    from kiln.bench.llm_bench import run_llm_bench
    from kiln.bench.llm_report import render_table, write_llm_results
    from kiln.bench.results import refuse_held_results
    from kiln.cli.results import show_results
    from kiln.monitor.env import collect_env
    from kiln.train.runtime import default_run_dir

    name = opts.preset or Path(opts.model).name
    out = Path(args.out) if args.out else default_run_dir(f"bench-llm-{name}")
    refuse_held_results(out)
    opts.profile_dir = str(out / "decode_profile") if opts.profile_decode else None
    device = torch.device(opts.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    quant = f", quant {','.join(opts.quants)}" if list(opts.quants) != ["none"] else ""
    title = (f"kiln bench llm: {opts.model} ({opts.dtype}, batch {opts.batch}, prompt {opts.prompt_len}, "
             f"{opts.new_tokens} new tokens{quant}, {where})")
    rows, context = run_llm_bench(opts)
    config = {"bench": dataclasses.asdict(opts), **context}
    written = write_llm_results(out, rows, env=collect_env(), config=config, command=_command(args), title=title)
    show_results(rows, render_table(rows, title), written)
    return 0
