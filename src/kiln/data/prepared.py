"""The layout `kiln data prepare` writes and `kiln train` (data.source=tokens) reads.

    DIR/train.bin      flat token ids (uint16 or uint32, native little-endian), documents in order,
                       each followed by the tokenizer's EOS token when it has one
    DIR/val.bin        the held-out split, same format (absent when --val-fraction is 0)
    DIR/meta.json      format/version, dtype, vocab_size, token counts per split, documents,
                       sources (path, bytes, sha256), EOS handling, the split rule, and
                       `tokenizer`: the tokenizer directory's name relative to meta.json
    DIR/tokenizer/     the Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json, ...)

Exports of a model trained on DIR copy `tokenizer` from here, so the two stay one contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.data.files import TOKEN_DTYPES
from kiln.errors import ConfigError
from kiln.safe_io import read_json

FORMAT = "kiln-tokens"
VERSION = 1
META_FILE = "meta.json"
TRAIN_FILE, VAL_FILE = "train.bin", "val.bin"
TOKENIZER_DIR = "tokenizer"
DTYPES = tuple(TOKEN_DTYPES)  # the token file element types kiln.data.files reads
DTYPE_CHOICES = ("auto", *DTYPES)


def dtype_for(vocab_size: int, requested: str, key: str = "--dtype") -> str:
    """The token dtype: `auto` is uint16 when every id fits (vocab <= 65536), else uint32."""
    if requested not in DTYPE_CHOICES:
        raise ConfigError(key, f"unknown dtype {requested!r}", DTYPE_CHOICES)
    if requested == "auto":
        return "uint16" if vocab_size <= 1 << 16 else "uint32"
    if vocab_size > np.iinfo(np.dtype(requested)).max + 1:
        raise ConfigError(key, f"a vocabulary of {vocab_size} tokens does not fit {requested} "
                          f"(ids up to {np.iinfo(np.dtype(requested)).max}); use uint32 or auto")
    return requested


def is_prepared(path: str | Path) -> bool:
    """True for a directory holding a prepared token set (its meta.json)."""
    return Path(path).is_dir() and (Path(path) / META_FILE).is_file()


@dataclass(frozen=True)
class PreparedTokens:
    directory: Path
    meta: dict[str, Any]

    @property
    def dtype(self) -> str:
        return self.meta["dtype"]

    @property
    def train_path(self) -> Path:
        return self.directory / self.meta["splits"]["train"]["file"]

    @property
    def val_path(self) -> Path | None:
        val = self.meta["splits"].get("val")
        return self.directory / val["file"] if val and val.get("tokens") else None

    @property
    def tokenizer_dir(self) -> Path | None:
        name = self.meta.get("tokenizer")
        return self.directory / name if name else None


def read_prepared(path: str | Path, key: str = "data.path") -> PreparedTokens:
    """The meta.json of a prepared directory, checked enough that reading its splits cannot go wrong."""
    directory = Path(path)
    meta_path = directory / META_FILE
    try:
        meta = read_json(meta_path, 16 << 20, follow=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(key, f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(key, f"{meta_path} is not a {FORMAT} meta.json (written by `kiln data prepare`)")
    if meta.get("version") != VERSION:
        raise ConfigError(key, f"{meta_path} has format version {meta.get('version')!r}; this kiln reads {VERSION}")
    if meta.get("dtype") not in DTYPES:
        raise ConfigError(key, f"{meta_path}: dtype {meta.get('dtype')!r} is not one of {DTYPES}")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), dict):
        raise ConfigError(key, f"{meta_path} names no train split")
    prepared = PreparedTokens(directory, meta)
    for split_path in (prepared.train_path, prepared.val_path):
        if split_path is not None and not split_path.is_file():
            raise ConfigError(key, f"{split_path} (named by {meta_path}) is missing")
    return prepared


def unigram_perplexity(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Perplexity of `val` under the unigram model of `train` with add-one smoothing:
    p(t) = (count_train(t) + 1) / (N_train + V), ppl = exp(-mean over val of log p(t)).
    The floor a trained language model must beat by far: it knows token frequencies, no context."""
    if val.size == 0:
        raise ValueError("no validation tokens")
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size).astype(np.float64)
    log_p = np.log(counts + 1.0) - math.log(float(train.size) + vocab_size)
    val_counts = np.bincount(np.asarray(val, dtype=np.int64), minlength=vocab_size).astype(np.float64)
    return float(math.exp(-float(val_counts @ log_p) / val.size))
