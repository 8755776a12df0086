"""A local tokenizer (`tokenizer.json`, the Hugging Face `tokenizers` format) and generation defaults.

kiln never downloads: the tokenizer is the one next to the model (or a directory the user
names). `tokenizers` comes with transformers (`kiln[llm]`) and is imported only when needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.errors import ConfigError

INSTALL_HINT = "pip install 'kiln[llm]'"


class Tokenizer:
    def __init__(self, path: Path, key: str = "--tokenizer"):
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError:
            raise ConfigError(key, f"reading {path} needs the tokenizers package; {INSTALL_HINT}") from None
        try:
            self._tok = HfTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise ConfigError(key, f"cannot read tokenizer {path}: {exc}") from None
        self.path = path

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids with the tokenizer's own special tokens (e.g. Llama's BOS); `special` False
        leaves them out (a chat template writes its own)."""
        return self._tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def find_tokenizer(directory: Path | None) -> Path | None:
    if directory is None:
        return None
    path = directory / "tokenizer.json"
    return path if path.is_file() else None


def load_tokenizer(directory: Path, key: str = "--tokenizer") -> Tokenizer:
    if not directory.exists():
        raise ConfigError(key, f"no such file or directory: {directory}")
    path = directory if directory.is_file() else find_tokenizer(directory)
    if path is None:
        extra = " (it has tokenizer.model: convert it to tokenizer.json)" if (directory / "tokenizer.model").is_file() else ""
        raise ConfigError(key, f"{directory} has no tokenizer.json{extra}")
    return Tokenizer(path, key)


def generation_stop_tokens(directory: Path | None, config_eos: tuple[int, ...]) -> list[int]:
    """Stop tokens: `generation_config.json`'s eos_token_id (instruct models list several) when the
    model directory has one, else the config's."""
    if directory is not None and (directory / "generation_config.json").is_file():
        try:
            eos = json.loads((directory / "generation_config.json").read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, int):
            return [eos]
        if isinstance(eos, list) and all(isinstance(t, int) for t in eos):
            return list(eos)
    return list(config_eos)
