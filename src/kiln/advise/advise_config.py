"""What `kiln advise` is asked to check: TARGET, --config, --device and the KEY=VALUE overrides
as one config. Imports no torch, so a bad request is refused at once."""

from __future__ import annotations

from kiln.config.load import load_config
from kiln.config.schema import Config
from kiln.errors import ConfigError


def advise_config(config: str | None, words: list[str], device: str | None) -> Config:
    """`kiln advise [TARGET] [KEY=VALUE ...]` with --config and --device -> the config to check;
    ConfigError (naming TARGET, or the key) otherwise."""
    # TARGET is the first word that is not KEY=VALUE (a path may hold '=' only after its ':').
    words = list(words)
    target = None
    if words and not ("=" in words[0] and ":" not in words[0].split("=", 1)[0]):
        target = words.pop(0)
    overrides = words
    if target is None and config is None and not any(o.startswith("model.name=") for o in overrides):
        raise ConfigError("TARGET", "name a model (mlp, vit, path/file.py:function) or give --config")
    if target is not None:
        overrides.insert(0, f"model.name={target}")
    if device:
        overrides.append(f"training.device={device}")
    return load_config(config, overrides)
