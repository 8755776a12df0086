"""`kiln data prepare TEXT... (--tokenizer DIR | --train-bpe VOCAB) --out DIR`: text -> token files."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.data.prepare_options import PrepareOptions


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="prepare training data (text -> token files)",
                       description="Data commands. `kiln data prepare --help` for the one there is.")
    data_sub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND", parser_class=type(p))
    q = data_sub.add_parser(
        "prepare",
        help="tokenize text / jsonl files into train.bin, val.bin, meta.json and tokenizer/",
        description="Tokenize text files (one document each) and .jsonl files (one document per line) into the "
        "flat token files `kiln train data.source=tokens data.path=OUT` reads: OUT/train.bin, OUT/val.bin (the "
        "held-out split, used for validation), OUT/meta.json and OUT/tokenizer/ (a Hugging Face tokenizer "
        "directory). Every input is checked before any work; OUT appears complete or not at all.",
    )
    add_flags(q, PrepareOptions)
    add_verbose_flag(q)
    q.set_defaults(run=run)


class _Display:
    """A rich progress bar on a terminal; a plain line per stage and per tenth of the input elsewhere."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self.stage: str | None = None
        self.bar = self.task = None
        self.shown_tenth = -1
        self.started = time.perf_counter()
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("checking", total=None)
            self.bar.start()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=stage, completed=done, total=total or None)
            return
        if stage != self.stage:
            self.stage, self.shown_tenth = stage, -1
            print(f"kiln: {stage} ...", file=sys.stderr, flush=True)
        if total:
            tenth = 10 * done // total
            if tenth > self.shown_tenth and tenth < 10:
                self.shown_tenth = tenth
                print(f"kiln: {stage} {done / 1e6:.1f} / {total / 1e6:.1f} MB", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def run(args: argparse.Namespace) -> int:
    from kiln.data.prepare import prepare

    opts = from_namespace(PrepareOptions, args)
    args.output_dir = opts.out.parent  # a failure's error.log goes beside the directory it was writing
    display = _Display()
    try:
        meta = prepare(opts, display)
    finally:
        display.close()
    if opts.json:
        print(json.dumps(meta, indent=2))
        return 0
    splits = meta["splits"]
    val = splits.get("val", {}).get("tokens", 0)
    unigram = meta.get("unigram_val_perplexity")
    print(f"wrote {opts.out}: {splits['train']['tokens']:,} train + {val:,} validation tokens ({meta['dtype']}) from "
          f"{meta['documents']:,} documents in {len(meta['sources'])} file(s); vocabulary {meta['vocab_size']:,} "
          f"({meta['tokenizer_source']})" + (f"; unigram perplexity of the validation text {unigram:.1f}"
                                               if unigram else ""))
    print(f"train on it: kiln train data.source=tokens data.path={opts.out} ...")
    return 0
