"""Tokenizers for `kiln data prepare`: an existing Hugging Face tokenizer directory, or a byte-level
BPE trained on the data with the `tokenizers` library, saved so `transformers.AutoTokenizer` (and
kiln's own `kiln.llm.tokenizer`) load it.

The trained BPE is GPT-2's recipe: bytes are mapped to printable characters (every input is
representable, no unknown token), text is pre-split by GPT-2's pattern, no prefix space, and one
special token, `<|endoftext|>`, which ends every document and serves as BOS/EOS/pad.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.safe_io import read_bytes, write_atomic

INSTALL_HINT = "pip install 'kiln[llm]' (or: pip install tokenizers)"
END_OF_TEXT = "<|endoftext|>"
# Smallest trained vocabulary: the 256 byte symbols plus the special token.
MIN_BPE_VOCAB = 257
MAX_BPE_VOCAB = 1 << 24
"""The largest BPE `--train-bpe` trains: token ids stay far inside the u32 the tokenizers library uses."""
# Files that make up a Hugging Face tokenizer directory (weights and model configs are not copied).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja",
                   "chat_template.json")


@dataclass
class LoadedTokenizer:
    tokenizer: Any
    """A `tokenizers.Tokenizer`."""
    eos_token: str | None
    eos_id: int | None
    source: str
    """Where it came from: the directory copied, or `trained byte-level BPE`."""

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError("--train-bpe", f"needs the tokenizers package; {INSTALL_HINT}") from None
    return tokenizers


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} where it cannot be read or is not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_tokenizer_dir(directory: Path, key: str = "--tokenizer") -> LoadedTokenizer:
    """A directory holding `tokenizer.json` (a "fast" tokenizer); its EOS token from
    tokenizer_config.json / special_tokens_map.json, if it names one."""
    if not directory.is_dir():
        raise ConfigError(key, f"{directory} is not a directory" if directory.exists()
                          else f"no such directory: {directory}")
    path = directory / "tokenizer.json"
    if not path.is_file():
        extra = " (it has tokenizer.model: save it as a fast tokenizer first)" \
            if (directory / "tokenizer.model").is_file() else ""
        raise ConfigError(key, f"{directory} has no tokenizer.json{extra}")
    tk = _tokenizers()
    try:
        tokenizer = tk.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ConfigError(key, f"cannot read {path}: {exc}") from None
    eos = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        eos = eos or _token_text(json_object(directory / name).get("eos_token"))
    eos_id = tokenizer.token_to_id(eos) if eos else None
    if eos is not None and eos_id is None:
        raise ConfigError(key, f"{directory}: eos_token {eos!r} is not in its vocabulary")
    return LoadedTokenizer(tokenizer, eos, eos_id, str(directory))


def train_bpe(texts: Iterator[str], vocab_size: int, total_chars: int | None = None) -> LoadedTokenizer:
    """A byte-level BPE of `vocab_size` tokens (the special token included) trained on `texts`."""
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer, length=total_chars)
    return LoadedTokenizer(tokenizer, END_OF_TEXT, tokenizer.token_to_id(END_OF_TEXT), "trained byte-level BPE")


def save_trained(loaded: LoadedTokenizer, directory: Path, model_max_length: int | None = None) -> None:
    """Write a trained tokenizer as a Hugging Face tokenizer directory."""
    directory.mkdir(parents=True, exist_ok=True)
    loaded.tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT,
               "pad_token": END_OF_TEXT}
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
                              "add_bos_token": False, "add_eos_token": False,
                              "clean_up_tokenization_spaces": False}
    if model_max_length:
        config["model_max_length"] = model_max_length
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


TOKENIZER_FILE_LIMIT = 1 << 30
"""The largest tokenizer file kiln copies (a 256k-token vocabulary's tokenizer.json is tens of MiB)."""


def copy_tokenizer_dir(source: Path, directory: Path) -> list[str]:
    """Copy the tokenizer files of `source` (never weights) into `directory`; returns their names.
    The copies are new files of this user's (the umask's mode), not the source's mode."""
    directory.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():  # a regular file (through a link: followed, and logged)
            write_atomic(directory / name, read_bytes(source / name, TOKENIZER_FILE_LIMIT, follow=True))
            copied.append(name)
    return copied
