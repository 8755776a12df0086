"""Text inputs of `kiln data prepare`: find the files, check them, and read their documents.

A plain text file is one document; a `.jsonl` file holds one document per line, a JSON object
whose text field (`text` unless told) is a string. Directories are searched recursively for
files with the extensions below. Every file is read once up front (`check_source`): it must
exist, be non-empty, decode as UTF-8 without NUL bytes, and (jsonl) parse line by line; the
same pass computes its size and sha256 for the metadata. Only then does tokenization start, so
bad input is refused before any work.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ConfigError

TEXT_EXTENSIONS = (".txt", ".text", ".md", ".rst")
JSONL_EXTENSIONS = (".jsonl", ".ndjson")
_READ_BYTES = 1 << 20
# Plain text is encoded in pieces of about this many characters, cut where the pieces tokenize
# exactly as the whole would (see `text_pieces`), so the tokenizer can use every core.
PIECE_CHARS = 1 << 20

log = logging.getLogger("kiln.data")


@dataclass(frozen=True)
class TextSource:
    """One checked input file."""

    path: Path
    format: str
    """`text` (the file is one document) or `jsonl` (one document per line)."""
    bytes: int
    sha256: str
    documents: int

    def describe(self) -> dict[str, object]:
        return {"path": str(self.path), "format": self.format, "bytes": self.bytes, "sha256": self.sha256,
                "documents": self.documents}


def file_format(path: Path) -> str:
    return "jsonl" if path.suffix.lower() in JSONL_EXTENSIONS else "text"


def collect_files(inputs: list[str], key: str = "TEXT") -> list[Path]:
    """The files named, with directories expanded (sorted, recursively) to their text/jsonl files."""
    if not inputs:
        raise ConfigError(key, "no input files given")
    files: list[Path] = []
    for name in inputs:
        path = Path(name).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and p.suffix.lower() in (*TEXT_EXTENSIONS, *JSONL_EXTENSIONS))
            if not found:
                raise ConfigError(key, f"directory {path} holds no text files",
                                  (*TEXT_EXTENSIONS, *JSONL_EXTENSIONS))
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(key, f"no such file or directory: {path}")
    seen: set[Path] = set()
    unique = []
    for f in files:  # a file named twice (or inside a named directory too) is read once
        real = f.resolve()
        if real != Path(os.path.abspath(f)):  # read through a link: said, not silent
            log.info("reading %s through a link: it is %s", f, real)
        if real not in seen:
            seen.add(real)
            unique.append(f)
    return unique


def check_source(path: Path, text_field: str, key: str = "TEXT") -> TextSource:
    """Read `path` once: size, sha256, UTF-8 validity, no NULs, and its document count."""
    fmt = file_format(path)
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    size = documents = 0
    has_text = False
    line_no, pending = 0, ""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_READ_BYTES):
                digest.update(chunk)
                nul = chunk.find(b"\x00")
                if nul >= 0:
                    raise ConfigError(key, f"{path} is binary (NUL byte at offset {size + nul}), not text")
                try:
                    text = decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    raise ConfigError(key, f"{path} is not UTF-8 text (bad byte at offset {size + exc.start})") from None
                size += len(chunk)
                if fmt == "text":
                    has_text = has_text or bool(text.strip())
                    continue
                lines = (pending + text).split("\n")
                pending = lines.pop()
                for line in lines:
                    line_no += 1
                    documents += _check_record(line, path, line_no, text_field, key)
            try:
                tail = decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise ConfigError(key, f"{path} is not UTF-8 text (truncated character at its end)") from None
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if fmt == "jsonl":
        line_no += 1
        documents += _check_record(pending + tail, path, line_no, text_field, key)
    else:
        has_text = has_text or bool(tail.strip())
        documents = int(has_text)
    if size == 0:
        raise ConfigError(key, f"{path} is empty")
    if documents == 0:
        raise ConfigError(key, f"{path} holds no text" if fmt == "text" else f"{path} holds no non-empty documents")
    return TextSource(path, fmt, size, digest.hexdigest(), documents)


def _check_record(line: str, path: Path, line_no: int, text_field: str, key: str) -> int:
    """1 for a line holding a non-empty document, 0 for a blank line or empty text."""
    if not line.strip():
        return 0
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(key, f"{path}:{line_no} is not a JSON object: {exc.msg}") from None
    if not isinstance(record, dict) or text_field not in record:
        raise ConfigError("--text-field", f"{path}:{line_no} has no field {text_field!r}"
                          + (f" (fields: {', '.join(sorted(record))})" if isinstance(record, dict) else ""))
    value = record[text_field]
    if not isinstance(value, str):
        raise ConfigError("--text-field", f"{path}:{line_no}: field {text_field!r} is a "
                          f"{type(value).__name__}, not a string")
    return int(bool(value.strip()))


def documents(source: TextSource, text_field: str) -> Iterator[str]:
    """The non-empty documents of a checked file, in order."""
    if source.format == "text":
        yield source.path.read_text(encoding="utf-8")
        return
    with open(source.path, encoding="utf-8", newline="\n") as f:
        for line in f:
            if line.strip():
                text = json.loads(line)[text_field]
                if text.strip():
                    yield text


def text_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` cut into pieces of about `size` characters, each cut just after a lone newline (a
    non-space character on both sides). Byte-level pre-tokenizers (GPT-2's, Llama 3's) make such a
    newline a token of its own, so the pieces' tokens, concatenated, are the whole text's; whether
    a given tokenizer keeps that promise is checked (`kiln.data.prepare.pieces_are_exact`)."""
    pieces, start = [], 0
    while len(text) - start > size:
        cut = start + size
        while cut < len(text) and not (text[cut - 1] == "\n" and not text[cut - 2].isspace()
                                       and not text[cut].isspace()):
            cut += 1
        if cut >= len(text):
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def total_bytes(sources: list[TextSource]) -> int:
    return sum(s.bytes for s in sources)
