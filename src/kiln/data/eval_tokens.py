"""Token ids to evaluate a model on (its perplexity): a file of token ids, a text file through the
model's tokenizer, or the validation split of a directory written by `kiln data prepare`. Each
is checked against the model's vocabulary, so a file made with another tokenizer is bad input.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kiln.data.prepared import is_prepared, read_prepared
from kiln.errors import ConfigError

_IDS = re.compile(r"[\d\s,]+")


def read_ppl_tokens(path: str | Path, tokenizer, vocab_size: int, key: str = "--ppl-file") -> list[int]:
    """Token ids of a perplexity file: whitespace/comma-separated integers as they are, a directory
    written by `kiln data prepare` (its val.bin), any other text through `tokenizer` (the model's
    tokenizer.json). ConfigError naming `key` otherwise."""
    path = Path(path)
    if path.is_dir():
        return _prepared_val_tokens(path, vocab_size, key)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path}: {exc}") from None
    if not text.strip():
        raise ConfigError(key, f"{path} is empty")
    if _IDS.fullmatch(text):
        ids = [int(t) for t in re.split(r"[\s,]+", text.strip()) if t]
    elif tokenizer is None:
        raise ConfigError(key, f"{path} is text and the model has no tokenizer.json to tokenize it: pass --tokenizer "
                          "DIR, or a file of token ids (integers separated by spaces, commas or newlines)")
    else:
        ids = tokenizer.encode(text)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ConfigError(key, f"token id {bad} in {path} is outside the vocabulary [0, {vocab_size})")
    if len(ids) < 2:
        raise ConfigError(key, f"{path} has {len(ids)} token(s); perplexity needs at least 2")
    return ids


def _prepared_val_tokens(path: Path, vocab_size: int, key: str) -> list[int]:
    if not is_prepared(path):
        raise ConfigError(key, f"{path} is a directory without meta.json; pass a text file, a token-id file or a "
                          "directory written by `kiln data prepare`")
    prepared = read_prepared(path, key)
    if prepared.val_path is None:
        raise ConfigError(key, f"{path} has no validation split (prepared with --val-fraction 0)")
    ids = np.fromfile(prepared.val_path, dtype=prepared.dtype)
    if ids.size < 2:
        raise ConfigError(key, f"{prepared.val_path} has {ids.size} token(s); perplexity needs at least 2")
    if int(ids.max()) >= vocab_size:
        raise ConfigError(key, f"token id {int(ids.max())} in {prepared.val_path} is outside the model's vocabulary "
                          f"[0, {vocab_size}): prepared with another tokenizer")
    return ids.astype(np.int64).tolist()
