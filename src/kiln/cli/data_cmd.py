"""`kiln data prepare TEXT... (--tokenizer DIR | --train-bpe VOCAB) --out DIR`: text -> token files."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kiln.cli.args import add_verbose_flag


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
    q.add_argument("inputs", nargs="+", metavar="TEXT",
                   help="text or .jsonl files, or directories of them (.txt .text .md .rst .jsonl .ndjson, recursive)")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--tokenizer", type=Path, metavar="DIR",
                     help="an existing Hugging Face tokenizer directory (with tokenizer.json); it is copied to OUT")
    how.add_argument("--train-bpe", type=int, metavar="VOCAB",
                     help="train a byte-level BPE of VOCAB tokens on the inputs (tokenizers library)")
    q.add_argument("--out", type=Path, required=True, help="directory to create (must not exist, or be empty)")
    q.add_argument("--val-fraction", type=float, default=0.01,
                   help="fraction of tokens held out for validation, spread over the corpus (default 0.01; 0: none)")
    q.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"),
                   help="token file dtype (default auto: uint16 when the vocabulary fits, else uint32)")
    q.add_argument("--text-field", default="text", help="the field holding a jsonl record's text (default text)")
    q.add_argument("--split-block", type=int, default=2048,
                   help="tokens moved to train or validation as one unit (default 2048; smaller for a small corpus)")
    q.add_argument("--note", help="free text recorded in meta.json as `note` (e.g. where the corpus came from)")
    q.add_argument("--json", action="store_true", help="print meta.json on stdout when done")
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
    from kiln.data.prepare import PrepareOptions, prepare

    args.output_dir = args.out.parent  # a failure's error.log goes beside the directory it was writing
    opts = PrepareOptions(inputs=args.inputs, out=args.out, tokenizer=args.tokenizer, train_bpe=args.train_bpe,
                          val_fraction=args.val_fraction, dtype=args.dtype, text_field=args.text_field,
                          split_block=args.split_block, extra_meta={"note": args.note} if args.note else {})
    display = _Display()
    try:
        meta = prepare(opts, display)
    finally:
        display.close()
    if args.json:
        print(json.dumps(meta, indent=2))
        return 0
    splits = meta["splits"]
    val = splits.get("val", {}).get("tokens", 0)
    unigram = meta.get("unigram_val_perplexity")
    print(f"wrote {args.out}: {splits['train']['tokens']:,} train + {val:,} validation tokens ({meta['dtype']}) from "
          f"{meta['documents']:,} documents in {len(meta['sources'])} file(s); vocabulary {meta['vocab_size']:,} "
          f"({meta['tokenizer_source']})" + (f"; unigram perplexity of the validation text {unigram:.1f}"
                                               if unigram else ""))
    print(f"train on it: kiln train data.source=tokens data.path={args.out} ...")
    return 0
