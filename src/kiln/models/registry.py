"""`model.name` -> a BuiltModel: the builtin registry plus the timm / HF / user-factory forms.

Resolution order: a registry name (`mlp`, `vit`), then a source prefix of SOURCES (`timm:<name>`,
`hf:<spec>`, `llama:<spec>`), then anything with a ':' as a user factory. (So a user package
literally named `timm`, `hf` or `llama` needs the `path/file.py:function` form.) `llama:` builds
kiln's own decoder for every family kiln.llm.families registers: the config's `model_type` picks it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, get_args

import torch
import torch.nn as nn

from kiln.config.schema import ModelConfig, Task
from kiln.errors import ConfigError
from kiln.llm.families import family_presets
from kiln.llm.hf_config import PRESETS as HF_PRESETS
from kiln.models.factory_args import bind_kwargs
from kiln.models.hf import build_hf
from kiln.models.llama import build_llama
from kiln.models.mlp import build_mlp, mlp_input_spec
from kiln.models.spec import BuiltModel, InputSpec
from kiln.models.timm_models import build_timm
from kiln.models.user import build_user
from kiln.models.vit import build_vit, vit_input_spec


@dataclass(frozen=True)
class RegistryEntry:
    factory: Callable[..., nn.Module]
    """Called with the checked `model.kwargs`."""
    task: str
    """Task the model declares (used when model.task is `auto`)."""
    input_spec: Callable[[dict[str, Any]], InputSpec]
    """InputSpec from the factory's arguments, defaults filled in."""
    blocks: Callable[[nn.Module], list[nn.Module]]
    """The repeated blocks, named explicitly (find_repeated_blocks would take the MLP head's two
    Linears for blocks when num_layers=1)."""
    summary: str
    """One line for `kiln env` and error messages."""


# Read-only: adding a model means adding an entry here (no global registration at import time).
REGISTRY: Mapping[str, RegistryEntry] = MappingProxyType(
    {
        "mlp": RegistryEntry(
            build_mlp,
            "classification",
            mlp_input_spec,
            lambda m: list(m.backbone),
            "seed MLP (Linear/LayerNorm/GELU/Dropout blocks)",
        ),
        "vit": RegistryEntry(
            build_vit,
            "classification",
            vit_input_spec,
            lambda m: list(m.blocks),
            "Vision Transformer, ViT-B/16 shapes by default",
        ),
    }
)

SourceBuilder = Callable[[str, dict[str, Any], str, torch.device | str | None], BuiltModel]
"""(spec after the prefix, model.kwargs, the whole model.name, device) -> the built model."""

# Read-only, as REGISTRY: adding a model source means adding an entry here.
SOURCES: Mapping[str, SourceBuilder] = MappingProxyType(
    {
        "timm": lambda spec, kwargs, name, device: build_timm(spec, kwargs, name),
        "hf": lambda spec, kwargs, name, device: build_hf(spec, kwargs, name),
        "llama": build_llama,  # built in place on `device`
    }
)

NAME_FORMS = ("llama:<preset | config.json | dir>", "timm:<name>", "hf:<preset | config.json | dir>",
              "package.module:function", "path/to/file.py:function")


def known_models() -> list[str]:
    """Registry names, the presets of kiln's decoder families and the HF presets, as they are written in
    `model.name`."""
    return [*REGISTRY, *(f"llama:{p}" for p in family_presets()), *(f"hf:{p}" for p in HF_PRESETS)]


def _build_registered(name: str, entry: RegistryEntry, kwargs: dict[str, Any]) -> BuiltModel:
    resolved = bind_kwargs(entry.factory, kwargs, f"model {name!r}")
    module = entry.factory(**resolved)
    return BuiltModel(
        module=module,
        task=entry.task,
        input_spec=entry.input_spec(resolved),
        name=name,
        blocks=entry.blocks(module),
    )


def build_model(cfg: ModelConfig, device: torch.device | str | None = None) -> BuiltModel:
    """Build the model `cfg` names, on the current default device (use `torch.device("meta")`
    as a context manager for a shape-only build). `device`: where a model that can be built in
    place is built and initialised (kiln's decoder, `llama:`); the others ignore it and are moved
    by the caller."""
    name = cfg.name.strip()
    kwargs = dict(cfg.kwargs)
    if cfg.task not in get_args(Task):
        raise ConfigError("model.task", f"unknown value {cfg.task!r}", get_args(Task))
    if not name:
        raise ConfigError("model.name", "must not be empty", (*known_models(), *NAME_FORMS))

    prefix, colon, spec = name.partition(":")
    if name in REGISTRY:
        built = _build_registered(name, REGISTRY[name], kwargs)
    elif colon and prefix in SOURCES:
        built = SOURCES[prefix](spec, kwargs, name, device)
    elif colon:
        built = build_user(name, kwargs)
    else:
        known = known_models()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError("model.name", f"unknown model {name!r}{hint}", (*known, *NAME_FORMS))

    if cfg.task != "auto":
        # The configured task wins: e.g. a user model that returns its own loss ("custom").
        built.task = cfg.task
    return built
