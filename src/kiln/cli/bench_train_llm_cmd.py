"""`kiln bench train-llm [...]`: LLM training recipes (kiln, the plain transformers loop, torchtitan)
side by side. Argument parsing and checks only (all before any work); the measuring is in
kiln.bench.llm_train_run."""

from __future__ import annotations

import argparse
import shlex
import sys

from kiln.config.errors import ConfigError


def add_parser(bsub) -> None:
    from kiln.bench.llm_train_recipes import KILN_RECIPES

    p = bsub.add_parser(
        "train-llm",
        help="LLM training: kiln recipes vs the plain transformers loop vs torchtitan (tok/s, MFU, memory, loss)",
        description="Each row trains the same model from the same initial weights on the same tokens for --steps "
        "steps, in one call: tokens/s, median step time, MFU against the GPU's datasheet peak and a bf16 matmul "
        "measured in the same process, peak memory, loss after the steps, and each row's exact config. Writes "
        "results.json and results.md.",
    )
    p.add_argument("--model", default="llama-3.2-1b",
                   help="a kiln.llm preset (llama-3.2-1b, llama-3.2-3b, llama-3.1-8b) or a config.json/model dir")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps each row trains (default 50)")
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of the timing (default 10)")
    p.add_argument("--rows", action="append", metavar="LIST",
                   help=f"comma-separated rows, in order: plain, torchtitan, {', '.join(KILN_RECIPES)} or a "
                   "--recipe name (default: plain, kiln, every --recipe, torchtitan)")
    p.add_argument("--recipe", action="append", default=[], metavar="'NAME: KEY=VALUE ...'",
                   help="a kiln row: a name and config overrides on the bench's base config (repeatable)")
    p.add_argument("--skip-invalid-recipes", action="store_true",
                   help="report a recipe kiln's config refuses as a skipped row instead of exiting 2")
    p.add_argument("--kiln-family", default="llama", choices=("llama", "hf"),
                   help="model family of the kiln rows: llama (kiln's own decoder, default) or hf (transformers)")
    p.add_argument("--precision", default="bf16-mixed", choices=("bf16-mixed", "fp32"),
                   help="base policy of every row (a kiln recipe may override it)")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="peak learning rate of every row (default 1e-4: early AdamW steps on random weights spike at "
                   "higher rates, and a spike amplifies the bf16 rounding differences between rows)")
    p.add_argument("--lr-warmup", type=int, help="linear learning-rate warm-up steps (default: half of --steps)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the initial weights and every row")
    p.add_argument("--baseline", metavar="ROW",
                   help="the row the others are compared with (default: plain, else the first row)")
    p.add_argument("--loss-tol", type=float, default=0.02,
                   help="relative difference of the last loss to the reference row called ok (default 0.02)")
    p.add_argument("--untie", action="store_true",
                   help="train the untied shape (separate LM head) in every row; implied when torchtitan is a row")
    p.add_argument("--no-plain-compile", dest="plain_compile", action="store_false",
                   help="run the plain loop eagerly (default: torch.compile(model), as the hand-written loop does)")
    p.add_argument("--torchtitan-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of torchtitan's job (repeatable), e.g. activation_checkpoint.mode=selective")
    p.add_argument("--torchtitan-timeout-s", type=float, default=600.0)
    p.add_argument("--deadline-s", type=float, help="start no row after this many seconds (later rows: skipped)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--data-dir", help="where the corpus, tokenizer and initial weights go (default OUT/data)")
    p.add_argument("--out", help="output directory (default: runs/<time>-bench-train-llm-<model>)")
    p.set_defaults(run=run)


def _positive(flag: str, value: float, minimum: float) -> None:
    if value < minimum:
        raise ConfigError(flag, f"must be >= {minimum:g}, got {value:g}")


def parse_recipe(text: str):
    """'NAME: KEY=VALUE KEY=VALUE' -> (name, overrides)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name or any(c in name for c in " ,="):
        raise ConfigError("--recipe", f"expected 'NAME: KEY=VALUE ...', got {text!r}")
    overrides = shlex.split(rest)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError("--recipe", f"{name}: {bad[0]!r} is not KEY=VALUE")
    return name, overrides


def plan(args: argparse.Namespace):
    """TrainLlmOptions from the arguments; ConfigError on any bad input."""
    from kiln.bench.llm_train_bench import RowSpec, TrainLlmOptions
    from kiln.bench.llm_train_recipes import KILN_RECIPES
    from kiln.bench.peers.plain.loop import Hyper
    from kiln.bench.peers.registry import check_peers, peer_names
    from kiln.bench.recipes import split_values
    from kiln.config import load_config
    from kiln.llm.config import resolve_model
    from kiln.runtime import resolve_device

    if args.lr_warmup is None:
        args.lr_warmup = max(1, args.steps // 2)
    for flag, value, minimum in (("--seq-len", args.seq_len, 1), ("--batch-size", args.batch_size, 1),
                                 ("--warmup", args.warmup, 0), ("--lr-warmup", args.lr_warmup, 0)):
        _positive(flag, value, minimum)
    _positive("--steps", args.steps, args.warmup + 2)
    _positive("--steps", args.steps, args.lr_warmup)
    if not args.lr > 0:
        raise ConfigError("--lr", f"must be > 0, got {args.lr}")
    source = resolve_model(args.model)
    hf = dict(source.raw)
    limit = int(hf.get("max_position_embeddings") or 0)
    if limit and args.seq_len > limit:
        raise ConfigError("--seq-len", f"{args.seq_len} is past the model's {limit} positions")
    peers = peer_names("train-llm")
    recipes = dict(KILN_RECIPES)
    for text in args.recipe:
        name, overrides = parse_recipe(text)
        if name in peers:
            raise ConfigError("--recipe", f"{name!r} names a peer row; choose another name")
        recipes[name] = overrides
    names = split_values(args.rows) if args.rows else [
        "plain", "kiln", *(parse_recipe(t)[0] for t in args.recipe), "torchtitan"]
    valid = (*peers, *recipes)
    for name in names:
        if name not in valid:
            raise ConfigError("--rows", f"unknown row {name!r}", valid)
    if args.baseline is not None and args.baseline not in names:
        raise ConfigError("--baseline", f"{args.baseline!r} is not one of the rows", tuple(names))
    device = resolve_device(args.device)
    if "torchtitan" in names and (args.untie or hf.get("tie_word_embeddings")):
        hf["tie_word_embeddings"] = False
    elif args.untie:
        hf["tie_word_embeddings"] = False
    rows = []
    for name in names:
        if name in peers:
            rows.append(RowSpec(name, name))
            continue
        overrides = tuple(recipes[name])
        invalid = None
        try:  # the recipe on the base config, checked as kiln train would check it
            load_config(None, ["data.source=synthetic", f"data.seq_len={args.seq_len}", f"training.steps={args.steps}",
                               f"optim.warmup_steps={args.lr_warmup}", *overrides])
        except ConfigError as exc:
            if not args.skip_invalid_recipes:
                raise ConfigError("--recipe", f"{name}: {exc}") from None
            invalid = f"kiln's config refused the recipe: {exc}"
        rows.append(RowSpec(name, "kiln", overrides, invalid))
    hyper = Hyper(lr=args.lr, warmup_steps=args.lr_warmup)
    notes = []
    if hf.get("tie_word_embeddings") is False and source.raw.get("tie_word_embeddings"):
        notes.append("every row trains the untied shape (a separate LM head): torchtitan's Llama cannot tie "
                     "embeddings; model FLOPs per token are the same either way")
    from pathlib import Path

    opts = TrainLlmOptions(model=args.model, hf=hf, seq_len=args.seq_len, batch=args.batch_size, steps=args.steps,
                           warmup=args.warmup, rows=rows, hyper=hyper, precision=args.precision, seed=args.seed,
                           device=str(device), kiln_family=args.kiln_family,
                           data_dir=Path(args.data_dir) if args.data_dir else None, deadline_s=args.deadline_s,
                           torchtitan_overrides=list(args.torchtitan_set),
                           torchtitan_timeout_s=args.torchtitan_timeout_s, loss_tol=args.loss_tol,
                           baseline=args.baseline, plain_compile=args.plain_compile, notes=notes)
    check_peers("train-llm", opts)  # each peer's own flags (--torchtitan-set)
    return opts


def run(args: argparse.Namespace) -> int:
    opts = plan(args)  # ConfigError -> exit 2 before any work

    from pathlib import Path

    from kiln.bench.llm_train_report import write_report
    from kiln.bench.llm_train_run import run as run_rows
    from kiln.cli.results import claim_results_dir, remove_scratch_on_interrupt
    from kiln.monitor.env import collect_env

    out = claim_results_dir(args, f"bench-train-llm-{Path(args.model).name}")
    env, command = collect_env(), shlex.join(["kiln", *sys.argv[1:]])
    try:
        rows, ctx = run_rows(opts, out, log=lambda m: print(f"kiln: {m}", file=sys.stderr, flush=True),
                             progress=lambda so_far, c: write_report(out, so_far, c, opts, env=env, command=command))
    except KeyboardInterrupt:  # the rows written so far stay; the corpus and initial weights are scratch
        remove_scratch_on_interrupt(out, [out / "data"] if opts.data_dir is None else [])
        raise
    written = write_report(out, rows, ctx, opts, env=env, command=command)
    print(written["table"])
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"kiln: {len(rows)} rows ({', '.join(f'{n} {s}' for s, n in counts.items())}); wrote "
          f"{written['json']}, {written['md']}")
    return 0
