"""`llama:<spec>`: kiln's own decoder (kiln.llm.model.Decoder, of any family kiln.llm.families
registers: the Llama family and any added one) as a model to train.

The module is the one `kiln generate` and `kiln bench llm` run, kept single-device and plain:
compile, FSDP2, activation checkpointing, float8 and the fused cross-entropy are applied to it
from outside (kiln.train.features, kiln.distributed). `<spec>` is a kiln.llm preset (random
weights), a `config.json` (random weights) or a local HF model directory (its safetensors).
`model.kwargs` are config.json fields that override the spec's (e.g. `num_hidden_layers` for a
shallower smoke run) before the model is built.

Random weights follow HF's initialisation (kiln.llm.weights.init_random) from torch's global
seed, which the trainer sets from `training.seed`: the same seed gives the same model.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch

from kiln.errors import ConfigError
from kiln.llm.config import ModelSource, config_from_dict, resolve_model
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.families import family_presets, family_spec
from kiln.llm.weights import (
    empty_decoder,
    has_weights,
    hf_parameters,
    init_random,
    load_safetensors_dir,
    open_safetensors_dir,
    random_parameters,
)
from kiln.models.spec import BuiltModel, InputSpec

# Default sequence length of the InputSpec (data.seq_len=0); any length up to the model's
# position limit trains.
DEFAULT_SEQ_LEN = 1024
SPEC_FORMS = ("llama:<preset>", "llama:path/to/config.json", "llama:path/to/hf_model_dir")


def llama_source(spec: str, kwargs: dict[str, Any]):
    """The kiln.llm ModelSource `spec` names, with `kwargs` merged into its config fields."""
    if not spec.strip():
        raise ConfigError("model.name", "'llama:' needs a preset, config.json or model directory after it",
                          (*(f"llama:{p}" for p in family_presets()), *SPEC_FORMS[1:]))
    source = resolve_model(spec, key="model.name")
    fields = family_spec(source.raw.get("model_type"), "model.name").config_fields  # what model.kwargs may override
    for key in kwargs:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"model.kwargs.{key}", f"not a config.json field kiln's decoder reads{hint}", fields)
    if kwargs:
        source = ModelSource(source.spec, {**source.raw, **kwargs}, source.directory)
        config_from_dict(source.raw, "model.kwargs")  # a bad override is named as such
    return source


def build_llama(spec: str, kwargs: dict[str, Any], name: str, device: torch.device | str | None = None) -> BuiltModel:
    """A trainable Decoder: fp32 parameters (the precision policy casts), train mode, built on
    `device` (default: the current default device; `meta` gives shapes only, no weights). Random
    weights are drawn on that device: on a GPU in milliseconds, where the host takes tens of
    seconds for a few billion parameters."""
    source = llama_source(spec, kwargs)
    config = source.config
    family = family_spec(config.family, "model.name")
    target = torch.device(device) if device is not None else torch.get_default_device()
    initial = None
    if target.type == "meta":
        with torch.device("meta"):
            model = family.build(config)
        shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        initial = partial(_initial_values, config, source.directory, shapes)
    else:  # the decoder the generation engine builds, then made trainable
        model = empty_decoder(config, device=target, dtype=torch.float32).requires_grad_(True)
        if has_weights(source.directory):
            load_safetensors_dir(model, source.directory, key="model.name")
        else:
            init_random(model, seed=torch.initial_seed() % 2**63)
    model.train()
    hf_config = {**source.raw, "architectures": [family.hf_architecture]}
    return BuiltModel(
        module=model,
        task="causal_lm",
        input_spec=InputSpec("tokens", (min(DEFAULT_SEQ_LEN, config.max_positions),), vocab_size=config.vocab_size,
                             max_seq_len=config.max_positions),
        name=name,
        blocks=list(model.layers),
        hf_config=hf_config,
        hidden_states=True,
        initial_values=initial,
    )


def _initial_values(config: DecoderConfig, directory: Path | None, shapes: list[tuple[str, tuple[int, ...]]],
                    device: torch.device, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights a build on `device` under torch seed `seed` holds, one parameter at a time: the
    directory's safetensors, else `init_random`'s draws (kiln.llm.weights.random_parameters)."""
    if has_weights(directory):
        get, names = open_safetensors_dir(directory, "model.name")
        yield from hf_parameters(config, dict(shapes), get, names, device=device, where=str(directory), key="model.name")
    else:
        yield from random_parameters(config, shapes, device, seed % 2**63)
