"""A config's identity: the keys that decide what a run computes.

Bookkeeping keys (checkpoint cadence and retention, metric sinks, log/eval intervals, the device,
loader worker counts, the distributed layout) may change between the attempts of one run without making it
another run; everything else is the run's identity. kiln digests it into every checkpoint's
completion marker and compares it with a run dir's saved config.toml before resuming there
(`compare`: the same run, or the same run trained longer, continues its LR schedule's span).
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


def compare(saved: dict[str, Any], config: Any) -> tuple[list[str], bool]:
    """(the differences of `config` from a run dir's saved identity, whether it raises training.steps),
    `optim.decay_steps` compared as the span it means (`continuation_identities`): what decides
    whether a rerun in that run dir continues the run there."""
    saved, current = continuation_identities(saved, identity(config))
    return differences(saved, current), current.get("training.steps", 0) > saved.get("training.steps", 0)


def schedule_span(saved: dict[str, Any]) -> int:
    """The steps a saved run's LR schedule spans (kiln.train.optim.schedule_steps of its config)."""
    return int(saved.get("optim.decay_steps") or saved.get("training.steps") or 0)


def continuation_identities(saved: dict[str, Any], current: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both identities with `optim.decay_steps` as the span it means. For a rerun in the run dir
    (as many steps or more), 0 means the run's own span: its schedule continues, never restarts."""
    span = schedule_span(saved)
    mine = current.get("optim.decay_steps") or (
        span if current.get("training.steps", 0) >= saved.get("training.steps", 0) else current.get("training.steps"))
    return {**saved, "optim.decay_steps": span}, {**current, "optim.decay_steps": mine}
