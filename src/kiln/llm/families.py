"""The one table of model families kiln's decoder runs: config.json `model_type` -> FamilySpec.

Adding a family is one module holding its spec (kiln.llm.llama_family is the model) and one
line here; every command finds it through `family_spec` (docs/extension.md). The table is a plain
dict so a test can register a family for its duration (`monkeypatch.setitem(FAMILIES, ...)`);
nothing registers itself at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln.errors import ConfigError
from kiln.llm import llama_family
from kiln.llm.family import FamilySpec, Kernel

FAMILIES: dict[str, FamilySpec] = {
    **{spec.name: spec for spec in llama_family.SPECS},
}


def family_spec(model_type: Any, key: str = "--model") -> FamilySpec:
    """The spec of `model_type`, or a ConfigError naming `key` and the families kiln runs."""
    spec = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if spec is None:
        raise ConfigError(key, f"model_type {model_type!r} is not a decoder kiln runs", tuple(FAMILIES))
    return spec


def family_presets() -> dict[str, Mapping[str, Any]]:
    """Every family's presets, by name (the first family listing a name wins)."""
    presets: dict[str, Mapping[str, Any]] = {}
    for spec in FAMILIES.values():
        for name, fields in spec.presets.items():
            presets.setdefault(name, fields)
    return presets


def takes_kernel(family: str, kernel: Kernel) -> bool:
    """Whether modules of `family` (a DecoderConfig's `family`) can take kiln's `kernel`."""
    spec = FAMILIES.get(family)
    return spec is not None and kernel in spec.kernels
