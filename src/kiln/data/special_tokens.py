"""The special-token ids (BOS, EOS, pad) of a tokenizer directory, and a model config made to agree
with them.

A model trained on token data learns the data's end-of-text id, not the one a preset names (the
Llama presets say 1/2; a BPE trained by `kiln data prepare` has `<|endoftext|>` at 0, and its id 2
is an ordinary character). So wherever a run has a tokenizer, its ids are the ones a model config,
an export and `kiln generate` use; an id the user set that contradicts it is refused.
The ids are read from tokenizer.json itself (added tokens, then the model's vocabulary), so the
`tokenizers` package is not needed for this.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.data.tokenizers_io import json_object
from kiln.errors import ConfigError

# config.json field -> the tokenizer_config.json / special_tokens_map.json key naming that token.
FIELDS = {"bos_token_id": "bos_token", "eos_token_id": "eos_token", "pad_token_id": "pad_token"}
# The fields a user may set (model.kwargs) and a mismatch of which is refused; pad only follows.
CHECKED = ("bos_token_id", "eos_token_id")


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str) and value["content"]:
        return value["content"]
    return None


def _vocabulary(tokenizer_json: dict[str, Any]) -> dict[str, int]:
    vocab = tokenizer_json.get("model", {}).get("vocab") if isinstance(tokenizer_json.get("model"), dict) else None
    ids = {k: v for k, v in vocab.items() if isinstance(v, int)} if isinstance(vocab, dict) else {}
    for token in tokenizer_json.get("added_tokens") or []:
        if isinstance(token, dict) and isinstance(token.get("content"), str) and isinstance(token.get("id"), int):
            ids[token["content"]] = token["id"]
    return ids


def special_tokens(directory: Path | None) -> dict[str, tuple[str, int]]:
    """config.json field -> (token text, id) for each of BOS / EOS / pad the tokenizer directory names
    (tokenizer_config.json, then special_tokens_map.json) and has in its tokenizer.json; {} for no
    directory or no tokenizer.json."""
    if directory is None or not (Path(directory) / "tokenizer.json").is_file():
        return {}
    directory = Path(directory)
    named: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = json_object(directory / name)
        for field, key in FIELDS.items():
            text = _text(data.get(key))
            if text is not None:
                named.setdefault(field, text)
    if not named:
        return {}
    vocab = _vocabulary(json_object(directory / "tokenizer.json"))
    return {field: (text, vocab[text]) for field, text in named.items() if text in vocab}


def describe(tokens: dict[str, tuple[str, int]]) -> str:
    """`bos <|endoftext|>=0, eos <|endoftext|>=0`: the ids in words, for messages."""
    return ", ".join(f"{field.split('_')[0]} {text}={i}" for field, (text, i) in tokens.items())


def align_config(config: dict[str, Any], directory: Path | None, *, explicit: dict[str, Any] | None = None,
                 key: str = "model.kwargs") -> tuple[dict[str, Any], dict[str, tuple[Any, int]]]:
    """`config` (HF config.json fields) with bos/eos/pad ids set to the tokenizer's, and the changes
    made (field -> (old, new)). A field in `explicit` (the user's own setting) that names another id
    than the tokenizer's is a ConfigError: the model would stop generating at the wrong token."""
    tokens = special_tokens(directory)
    explicit = explicit or {}
    for field in CHECKED:
        if field in tokens and field in explicit and not agrees(explicit[field], tokens[field][1]):
            text, want = tokens[field]
            raise ConfigError(f"{key}.{field}", f"is {explicit[field]!r} but the data's tokenizer ({directory}) has "
                              f"{FIELDS[field]} {text!r} at id {want}; remove the setting (kiln takes the "
                              f"tokenizer's ids) or set it to {want}")
    changes: dict[str, tuple[Any, int]] = {}
    aligned = dict(config)
    for field, (_, want) in tokens.items():
        if not agrees(aligned.get(field), want):
            changes[field] = (aligned.get(field), want)
            aligned[field] = want
    return aligned, changes


def agrees(value: Any, token_id: int) -> bool:
    """Whether a config value (one id or a list of them, as instruct models' eos_token_id) holds `token_id`."""
    return token_id in (list(value) if isinstance(value, (list, tuple)) else [value])
