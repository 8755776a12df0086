"""Where a model comes from (`resolve_model`: a preset, a `config.json`, a model directory) and its
`DecoderConfig` (`config_from_dict`), read from a Hugging Face `config.json`.

kiln reads the JSON itself (no transformers needed); the family its `model_type` names
(kiln.llm.families: the Llama family's `llama`, `mistral`, `qwen2`, `qwen3`) reads the fields, and
refuses with a `ConfigError` naming the field anything the decoder would compute differently from
the checkpoint's own model, never silently approximating it.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.families import family_presets, family_spec
from kiln.llm.hf_config import PRESETS as HF_PRESETS
from kiln.safe_io import read_json


def config_from_dict(raw: dict[str, Any], key: str = "--model") -> DecoderConfig:
    """A DecoderConfig from `config.json` fields; ConfigError(key, ...) for what kiln cannot run.
    The family `model_type` names (kiln.llm.families) reads the fields."""
    return family_spec(raw.get("model_type"), key).parse_config(raw, key)


def read_config_json(path: Path, key: str = "--model") -> dict[str, Any]:
    if path.suffix in (".safetensors", ".pt", ".bin", ".distcp"):
        # A weights file alone (`kiln export --out model.safetensors`) says nothing of the model's shape.
        raise ConfigError(key, f"{path} is a weights file: pass a model directory (config.json beside its "
                          "*.safetensors, as `kiln export RUN --out DIR` writes) or a config.json")
    try:
        raw = read_json(path, 16 << 20, follow=True)  # a regular file of at most 16 MiB
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path} as a config.json: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(key, f"{path} is not a config.json object")
    return raw


def has_weights(directory: Path | None) -> bool:
    """`directory` holds safetensors weights (one file, or an index of shards)."""
    return directory is not None and (any(directory.glob("*.safetensors"))
                                      or (directory / "model.safetensors.index.json").is_file())


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: its config fields, and the directory holding its files, if any."""

    spec: str
    raw: dict[str, Any]
    directory: Path | None
    """The model directory (weights, tokenizer); None for a preset or a bare config.json."""

    @property
    def config(self) -> DecoderConfig:
        return config_from_dict(self.raw)


MODEL_PREFIXES = ("hf:", "llama:")
"""Prefixes `kiln train model.name=...` uses for these models; accepted here too, so one name
means one model across commands."""


def preset_config(name: str) -> dict[str, Any] | None:
    """The `config.json` fields of preset `name`, or None: the families' presets (kiln.llm.families)
    and the tiny test shapes `kiln train model.name=hf:NAME` knows (kiln.llm.hf_config.PRESETS), so
    every preset name train accepts means the same model here."""
    presets = family_presets()
    if name in presets:
        return dict(presets[name])
    return dict(HF_PRESETS[name]) if name in HF_PRESETS else None


def preset_names() -> list[str]:
    return list(dict.fromkeys([*family_presets(), *HF_PRESETS]))


def resolve_model(spec: str, key: str = "--model") -> ModelSource:
    """A preset name, a `config.json` path or a local model directory (an `hf:` or `llama:` prefix,
    as in `kiln train model.name=hf:llama-tiny`, is allowed). A preset of a family kiln's decoder
    does not run (gpt2-tiny) is refused by `config_from_dict`, naming its model_type."""
    name = next((spec[len(p):] for p in MODEL_PREFIXES if spec.startswith(p)), spec)
    preset = preset_config(name)
    path = Path(name).expanduser()
    if preset is not None:
        source = ModelSource(spec, preset, None)
    elif path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            if (path / "config.toml").is_file() and (path / "checkpoints").is_dir():  # `kiln train`'s run dir
                raise ConfigError(key, f"{path} is a kiln run dir, not a model directory: export it first "
                                  f"(kiln export {path} --out {path / 'hf'}), then pass {path / 'hf'}")
            raise ConfigError(key, f"directory {path.resolve()} has no config.json")
        source = ModelSource(spec, read_config_json(cfg, key), path)
        if not has_weights(path) and any(path.glob("pytorch_model*.bin")):  # never random weights instead
            raise ConfigError(key, f"{path} holds pytorch_model*.bin weights only: kiln loads safetensors only, which "
                              "never unpickle code (convert them with transformers' save_pretrained(..., "
                              "safe_serialization=True)), or pass its config.json for random weights")
    elif path.is_file():
        source = ModelSource(spec, read_config_json(path, key), None)
    else:
        presets = preset_names()
        close = difflib.get_close_matches(name, presets, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(key, f"{spec!r} is not a preset and no file or directory {path.resolve()} exists{hint}",
                          (*presets, "path/to/config.json", "path/to/model_dir"))
    config_from_dict(source.raw, key)  # refuse an unsupported model here, before anything is built
    return source
