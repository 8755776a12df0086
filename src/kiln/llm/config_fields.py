"""Checked readers of the `config.json` fields every decoder family shares: sizes, real numbers and
RoPE (transformers' `rope_scaling` / `rope_parameters`). A family's parser (kiln.llm.family) uses
them so a bad value is refused the same way, with a `ConfigError` naming the field, in every family.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.errors import ConfigError
from kiln.llm.decoder_config import RopeConfig

ROPE_TYPES = ("default", "linear", "llama3")
# RoPE scaling fields transformers requires (it raises KeyError without them); kiln refuses too.
_ROPE_REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}

SIZE_LIMITS = {"num_hidden_layers": 1024, "hidden_size": 1 << 17, "intermediate_size": 1 << 19,
               "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 4096, "vocab_size": 1 << 23,
               "max_position_embeddings": 1 << 27, "sliding_window": 1 << 27}
"""Upper bounds on config.json sizes, far above any published model (405B: 126 layers, hidden 16384):
a config that asks for more is a mistake or an attack, refused before memory is allocated for it."""


def positive(value: Any, name: str, key: str) -> int:
    """`value` of config field `name`, which must be a positive integer (within SIZE_LIMITS)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, f"config field {name!r} must be a positive integer, got {value!r}")
    limit = SIZE_LIMITS.get(name)
    if limit is not None and value > limit:
        raise ConfigError(key, f"config field {name!r} is {value}, more than the {limit} kiln accepts")
    return value


def positive_field(raw: dict[str, Any], name: str, key: str, default: int | None = None) -> int:
    """`raw[name]` (else `default`), a positive integer."""
    return positive(raw.get(name, default), name, key)


def real(value: Any, name: str, key: str, *, below: float | None = None) -> float:
    """`value` of config field `name`, which must be a finite number > 0 (and < `below`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 \
            or (below is not None and value >= below):
        bound = f" below {below}" if below is not None else ""
        raise ConfigError(key, f"config field {name!r} must be a positive number{bound}, got {value!r}")
    return float(value)


def rope_config(raw: dict[str, Any], theta_default: Any, max_positions: int, key: str) -> RopeConfig:
    """RoPE as transformers standardizes it: `rope_scaling` (4.x) over `rope_parameters` (5.x); the
    theta inside that dict over the top-level `rope_theta` (else `theta_default`, the family's)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(key, "per-layer-type rope_parameters are not supported by kiln's decoder")
    scaling: dict[str, Any] = raw.get("rope_scaling") or (params if isinstance(params, dict) else None) or {}
    theta = real(scaling.get("rope_theta", raw.get("rope_theta", theta_default)), "rope_theta", key)
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(key, f"rope type {kind!r} is not supported by kiln's decoder", ROPE_TYPES)
    missing = [f for f in _ROPE_REQUIRED.get(kind, ()) if scaling.get(f) is None]
    if missing:
        raise ConfigError(key, f"{kind} rope scaling without {', '.join(missing)} (transformers refuses it too)")
    partial = raw.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(key, f"partial_rotary_factor {partial!r} is not supported (only 1.0)")
    factor = float(scaling.get("factor", 1.0)) if kind != "default" else 1.0
    if kind in ("linear", "llama3") and factor <= 0:
        raise ConfigError(key, f"rope scaling factor must be > 0, got {factor}")
    original = scaling.get("original_max_position_embeddings") or max_positions
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=factor,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_positions=int(original),
    )
