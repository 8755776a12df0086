"""`kiln data prepare`: text / jsonl files -> the token files `kiln train` reads (layout: kiln.data.prepared).

Order of work: every flag and input is checked first (exit 2 naming it, nothing written); then,
in a temporary directory beside `--out`: the tokenizer (copied, or a byte-level BPE trained on
the inputs), all documents tokenized into one stream (each followed by EOS), the stream split
into train and validation, meta.json. The temporary directory becomes `--out` by one rename at
the end and is removed on any failure or Ctrl-C, so `--out` is either complete or absent.

The split: the token stream is cut into blocks and block i is held out when
floor((i + 1) * f) > floor(i * f), so a fraction f of the blocks, spread evenly over the whole
corpus (not only its end), is validation text. Blocks are `split_block` tokens, smaller for a
small corpus so validation gets at least 8 of them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.data import prepared as layout
from kiln.data import text_sources, tokenizers_io
from kiln.data.prepare_options import PrepareOptions
from kiln.errors import ConfigError

# (stage, done, total): stage is `checking`, `training BPE`, `tokenizing` or `splitting`; done and
# total count input bytes (total 0 when a stage has no measure).
Progress = Callable[[str, int, int], None]
_BATCH_CHARS = 1 << 21
_MIN_VAL_BLOCKS = 8
_PROBE = "The first line.\nA second one, then a blank line.\n\nIndented:\n    code here\nLast line\n"


@dataclass
class Checked:
    sources: list[text_sources.TextSource]
    loaded: tokenizers_io.LoadedTokenizer | None
    dtype: str | None
    """Known up front except for a trained BPE with `auto` (then from the trained vocabulary)."""


def check_options(opts: PrepareOptions, progress: Progress | None = None) -> Checked:
    """Everything that can be refused before work, in the order a user fixes it (flags, --out,
    tokenizer, then every input file read once)."""
    if (opts.tokenizer is None) == (opts.train_bpe is None):
        raise ConfigError("--tokenizer", "give exactly one of --tokenizer DIR and --train-bpe VOCAB")
    if not 0.0 <= opts.val_fraction < 1.0 or math.isnan(opts.val_fraction):
        raise ConfigError("--val-fraction", f"must be in [0, 1), got {opts.val_fraction}")
    if opts.split_block < 1:
        raise ConfigError("--split-block", f"must be a positive number of tokens, got {opts.split_block}")
    if not opts.text_field:
        raise ConfigError("--text-field", "must name a field")
    if opts.dtype not in layout.DTYPE_CHOICES:
        raise ConfigError("--dtype", f"unknown dtype {opts.dtype!r}", layout.DTYPE_CHOICES)
    dtype = loaded = None
    if opts.train_bpe is not None:
        if opts.train_bpe < tokenizers_io.MIN_BPE_VOCAB:
            raise ConfigError("--train-bpe", f"a byte-level BPE needs at least {tokenizers_io.MIN_BPE_VOCAB} tokens "
                              f"(256 bytes + <|endoftext|>), got {opts.train_bpe}")
        if opts.train_bpe > tokenizers_io.MAX_BPE_VOCAB:  # the trainer would abort the process, leaving files
            raise ConfigError("--train-bpe", f"{opts.train_bpe} tokens is more than the {tokenizers_io.MAX_BPE_VOCAB} "
                              "kiln trains (published BPE vocabularies hold up to a few hundred thousand)")
        layout.dtype_for(opts.train_bpe, opts.dtype)  # a vocabulary that cannot fit is refused now
        dtype = None if opts.dtype == "auto" else opts.dtype
    _check_out(opts.out)
    if opts.tokenizer is not None:
        loaded = tokenizers_io.load_tokenizer_dir(opts.tokenizer)
        dtype = layout.dtype_for(loaded.vocab_size, opts.dtype)
    files = text_sources.collect_files(opts.inputs)
    total = sum(f.stat().st_size for f in files)
    sources, done = [], 0
    for f in files:
        sources.append(text_sources.check_source(f, opts.text_field))
        done += sources[-1].bytes
        if progress:
            progress("checking", done, total)
    return Checked(sources, loaded, dtype)


def _check_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        what = "a directory that is not empty" if out.is_dir() else "a file"
        raise ConfigError("--out", f"{out} is {what}; name a new directory (nothing was written)")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise ConfigError("--out", f"cannot create {out}: {parent} is not writable")


def prepare(opts: PrepareOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Check, then write `opts.out`; returns its meta.json contents."""
    checked = check_options(opts, progress)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.partial-", dir=opts.out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        meta = _write(opts, checked, tmp, progress or (lambda *a: None))
        os.replace(tmp, opts.out)  # onto nothing or an empty directory: one atomic step
    except BaseException:  # KeyboardInterrupt included: leave nothing half-written
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _write(opts: PrepareOptions, checked: Checked, tmp: Path, progress: Progress) -> dict[str, Any]:
    sources, total = checked.sources, text_sources.total_bytes(checked.sources)
    tok_dir = tmp / layout.TOKENIZER_DIR
    if checked.loaded is None:
        progress("training BPE", 0, 0)
        texts = (d for s in sources for d in text_sources.documents(s, opts.text_field))
        loaded = tokenizers_io.train_bpe(texts, opts.train_bpe or 0)
        tokenizers_io.save_trained(loaded, tok_dir)
        tokenizer_files = sorted(p.name for p in tok_dir.iterdir())
    else:
        loaded = checked.loaded
        tokenizer_files = tokenizers_io.copy_tokenizer_dir(Path(loaded.source), tok_dir)
    dtype = checked.dtype or layout.dtype_for(loaded.vocab_size, opts.dtype)
    np_dtype = np.dtype(dtype)

    stream_path = tmp / "all.bin"
    documents = 0
    with open(stream_path, "wb") as stream:
        for ids in _token_stream(loaded, sources, opts.text_field, total, progress):
            stream.write(ids.astype(np_dtype).tobytes())
            documents += 1
    all_tokens = np.memmap(stream_path, dtype=np_dtype, mode="r") if stream_path.stat().st_size else np.zeros(0)
    n = int(all_tokens.size)
    progress("splitting", 0, 0)
    block = split_block_size(n, opts.val_fraction, opts.split_block)
    if opts.val_fraction > 0 and n * opts.val_fraction < 2:
        raise RuntimeError(f"the inputs make {n} tokens, too few to hold out {opts.val_fraction:.2%} for validation "
                           "(at least 2 tokens); add text or pass --val-fraction 0")
    counts = _split(all_tokens, block, opts.val_fraction, tmp)
    del all_tokens
    stream_path.unlink()

    splits: dict[str, Any] = {"train": {"file": layout.TRAIN_FILE, "tokens": counts[0]}}
    unigram = None
    if opts.val_fraction > 0:
        splits["val"] = {"file": layout.VAL_FILE, "tokens": counts[1]}
        train = np.memmap(tmp / layout.TRAIN_FILE, dtype=np_dtype, mode="r")
        val = np.memmap(tmp / layout.VAL_FILE, dtype=np_dtype, mode="r")
        unigram = layout.unigram_perplexity(train, val, loaded.vocab_size)
        del train, val
    meta = {
        "format": layout.FORMAT,
        "version": layout.VERSION,
        "tokenizer": layout.TOKENIZER_DIR,
        "tokenizer_source": loaded.source,
        "tokenizer_files": tokenizer_files,
        "dtype": dtype,
        "vocab_size": loaded.vocab_size,
        "eos_token": loaded.eos_token,
        "eos_token_id": loaded.eos_id,
        "eos": "appended after every document" if loaded.eos_id is not None
        else "none: the tokenizer names no eos_token, documents are concatenated",
        "special_tokens_in_text": "not added (add_special_tokens=False); only the EOS above",
        "splits": splits,
        "split": {"method": "blocks", "block_tokens": block, "val_fraction": opts.val_fraction,
                  "rule": "block i is validation when floor((i+1)*f) > floor(i*f)"},
        "tokens": n,
        "documents": documents,
        "text_bytes": total,
        "unigram_val_perplexity": unigram,
        "sources": [s.describe() for s in sources],
        "text_field": opts.text_field if any(s.format == "jsonl" for s in sources) else None,
        **({"note": opts.note} if opts.note else {}),
    }
    (tmp / layout.META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def pieces_are_exact(tokenizer) -> bool:
    """Whether cutting text with `text_sources.text_pieces` keeps this tokenizer's ids unchanged."""
    whole = tokenizer.encode(_PROBE, add_special_tokens=False).ids
    parts = [i for p in text_sources.text_pieces(_PROBE, 8) for i in tokenizer.encode(p, add_special_tokens=False).ids]
    return whole == parts and len(text_sources.text_pieces(_PROBE, 8)) > 1


def _token_stream(loaded: tokenizers_io.LoadedTokenizer, sources: list[text_sources.TextSource], text_field: str,
                  total: int, progress: Progress) -> Iterator[np.ndarray]:
    """Each document's ids (+ EOS), in input order; pieces of long documents encoded in parallel."""
    tokenizer = loaded.tokenizer
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    exact = pieces_are_exact(tokenizer)
    eos = np.array([loaded.eos_id] if loaded.eos_id is not None else [], dtype=np.int64)
    done = 0
    batch: list[str] = []
    owners: list[int] = []  # per piece in the batch: its document's number within the batch
    pending_progress = 0

    def flush() -> Iterator[np.ndarray]:
        nonlocal done, pending_progress
        if not batch:
            return
        encodings = encode(batch, add_special_tokens=False)
        start = 0
        for doc in range(owners[-1] + 1):
            end = start
            while end < len(owners) and owners[end] == doc:
                end += 1
            ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings[start:end]]
            yield np.concatenate([*ids, eos])
            start = end
        done += pending_progress
        pending_progress = 0
        batch.clear()
        owners.clear()
        progress("tokenizing", done, total)

    chars = 0
    for source in sources:
        for text in text_sources.documents(source, text_field):
            pieces = text_sources.text_pieces(text) if exact else [text]
            doc_no = owners[-1] + 1 if owners else 0
            batch.extend(pieces)
            owners.extend([doc_no] * len(pieces))
            chars += len(text)
            if chars >= _BATCH_CHARS:
                yield from flush()
                chars = 0
        pending_progress += source.bytes
    yield from flush()


def split_block_size(n_tokens: int, val_fraction: float, largest: int) -> int:
    """Block size of the split: `largest`, or less so validation gets >= 8 blocks."""
    if val_fraction <= 0:
        return largest
    return max(1, min(largest, int(n_tokens * val_fraction) // _MIN_VAL_BLOCKS))


def val_blocks(n_blocks: int, val_fraction: float) -> np.ndarray:
    """Boolean mask over blocks: block i is validation when floor((i+1)*f) > floor(i*f)."""
    i = np.arange(n_blocks, dtype=np.float64)
    return np.floor((i + 1) * val_fraction) > np.floor(i * val_fraction)


def _split(tokens: np.ndarray, block: int, val_fraction: float, directory: Path) -> tuple[int, int]:
    """Write train.bin (and val.bin when val_fraction > 0) from the stream; (train, val) token counts."""
    n_blocks = -(-tokens.size // block)
    mask = val_blocks(n_blocks, val_fraction) if val_fraction > 0 else np.zeros(n_blocks, dtype=bool)
    counts = [0, 0]
    files = [open(directory / layout.TRAIN_FILE, "wb")]
    if val_fraction > 0:
        files.append(open(directory / layout.VAL_FILE, "wb"))
    try:
        for b in range(n_blocks):
            chunk = tokens[b * block: (b + 1) * block]
            which = int(mask[b])
            files[which].write(np.ascontiguousarray(chunk).tobytes())
            counts[which] += int(chunk.size)
    finally:
        for f in files:
            f.close()
    return counts[0], counts[1]
