"""A config's identity: the keys that decide what a run computes.

Bookkeeping keys (checkpoint cadence and retention, metric sinks, log/eval intervals, the device,
loader worker counts, the distributed layout) may change between the attempts of one run without making it
another run; everything else is the run's identity. kiln digests it into every checkpoint's
completion marker and compares it with a run dir's saved config.toml before resuming there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kiln.config.choices import switch_keys, switch_spelling

# Keys (or section prefixes) that do not change what a run computes: they may differ between
# the attempts of one run without making it another run.
BOOKKEEPING = (
    "checkpoint.",
    "metrics.",
    "training.log_interval",
    "training.eval_interval",
    "training.eval_steps",
    "training.device",
    "data.num_workers",
    "data.prefetch_factor",
    "data.pin_memory",
    # How the same run is laid out on devices (strategy, wrapping, buckets): kiln resumes across
    # world sizes and strategies (DCP reshards), so these may change between attempts too.
    "distributed.",
    # Threads and pinning change how fast, not what (as the device does).
    "cpu.",
)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        # Sections nest one level (model, data, ...); dict-valued keys (model.kwargs) stay whole.
        if not prefix and isinstance(value, dict):
            out.update(_flatten(value, f"{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def identity(config: Any) -> dict[str, Any]:
    """The dotted keys of a config (a Config or its TOML table) that decide what a run computes,
    with values normalised through JSON so a config and its saved TOML compare equal."""
    table = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    flat = json.loads(json.dumps(_flatten(table), sort_keys=True, default=str))
    # A switch (`bool | None`) compares as it is spelled in TOML, so a saved "auto" / "true" and
    # the loaded None / True are one value (and digests match those of configs saved earlier).
    for key in switch_keys() & flat.keys():
        flat[key] = switch_spelling(flat[key])
    return {k: v for k, v in flat.items() if not any(k == b or (b.endswith(".") and k.startswith(b)) for b in BOOKKEEPING)}


def config_digest(config: Any) -> str:
    """A short digest of a config's identity, written into each checkpoint's completion marker."""
    text = json.dumps(identity(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved -> current` for each key whose value differs (a key only one side has counts)."""
    missing = object()
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, missing), current.get(key, missing)
        if a != b:
            def show(v: Any) -> str:
                return "(unset)" if v is missing else json.dumps(v)
            out.append(f"{key}: {show(a)} -> {show(b)}")
    return out
