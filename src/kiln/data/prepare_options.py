"""What `kiln data prepare` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.data.prepare checks and runs it. Imports no torch or numpy: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from kiln.config.options import option

TokenDtype = Literal["auto", "uint16", "uint32"]
"""The token file dtype: `auto` is the smallest that holds every id (kiln.data.prepared.DTYPE_CHOICES)."""
HOW = "tokenizer"
"""The exclusive pair: an existing tokenizer or a BPE trained on the inputs, one of them."""


@dataclass(kw_only=True)
class PrepareOptions:
    """`kiln data prepare`'s request, one field per flag."""

    inputs: list[str] = option(
        shape="words", required=True, metavar="TEXT",
        help="text or .jsonl files, or directories of them (.txt .text .md .rst .jsonl .ndjson, recursive)")
    tokenizer: Path | None = option(
        None, metavar="DIR", exclusive=HOW, required=True,
        help="an existing Hugging Face tokenizer directory (with tokenizer.json); it is copied to OUT")
    train_bpe: int | None = option(
        None, metavar="VOCAB", exclusive=HOW,
        help="train a byte-level BPE of VOCAB tokens on the inputs (tokenizers library)")
    out: Path = option(required=True, help="directory to create (must not exist, or be empty)")
    val_fraction: float = option(
        0.01, help="fraction of tokens held out for validation, spread over the corpus (default 0.01; 0: none)")
    dtype: TokenDtype = option(
        "auto", choices=get_args(TokenDtype),
        help="token file dtype (default auto: uint16 when the vocabulary fits, else uint32)")
    text_field: str = option("text", help="the field holding a jsonl record's text (default text)")
    split_block: int = option(
        2048, help="tokens moved to train or validation as one unit (default 2048; smaller for a small corpus)")
    note: str | None = option(
        None, help="free text recorded in meta.json as `note` (e.g. where the corpus came from)")
    json: bool = option(False, shape="switch", help="print meta.json on stdout when done")
