"""Does a checkpoint fit the model and optimizer it is loaded into? Checked from DCP metadata
before anything is read, so a mismatch is bad input (exit 2) and nothing has been modified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.checkpoint.dcp_io import APP_KEY, flat_keys, is_dropped, preview, prune_to
from kiln.errors import ConfigError


def check_model_keys(path: Path, saved: dict[str, tuple[int, ...]], current: dict[str, tuple[int, ...]],
                     present: set[str]) -> None:
    """The model's keys and shapes against the checkpoint's (`saved` shapes, `present` entries)."""
    prefix = f"{APP_KEY}.model."
    saved_keys = set(saved) | {k[len(prefix):] for k in present if k.startswith(prefix)}
    missing = set(current) - saved_keys
    unexpected = saved_keys - set(current)
    shapes = [f"{k} {list(saved[k])} in checkpoint vs {list(current[k])} in model"
              for k in sorted(set(saved) & set(current)) if saved[k] != current[k]]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"missing {preview(missing)}")
    if unexpected:
        parts.append(f"unexpected {preview(unexpected)}")
    if shapes:
        parts.append(f"shape {'; '.join(shapes[:3])}" + (f" (+{len(shapes) - 3} more)" if len(shapes) > 3 else ""))
    raise ConfigError("checkpoint.resume", f"{path}: checkpoint does not match the model: {', '.join(parts)}")


def unused_optimizer_state(template: dict[str, Any], present: set[str]) -> str | None:
    """A note naming the optimizer state the checkpoint holds and this optimizer has no place for
    (bf16-master's fp32 `master` weights resumed under another precision policy): it is not loaded,
    and saying so beats dropping it silently. None when everything saved is used."""
    state_prefix = f"{APP_KEY}.optim.state."
    states = template.get("optim", {}).get("state", {})
    wanted = set(flat_keys(states, state_prefix[:-1]))
    kinds = sorted({k[len(f"{state_prefix}{fqn}."):] for fqn in states for k in present
                    if k.startswith(f"{state_prefix}{fqn}.") and k not in wanted})
    if not kinds:
        return None
    masters = " (fp32 master weights of precision.policy=bf16-master: training continues from the "
    masters += "lower-precision parameters; resume with precision.policy=bf16-master to keep them)"
    return (f"the checkpoint's optimizer state {', '.join(kinds)} is not used by this run's optimizer and was not "
            f"loaded{masters if 'master' in kinds else ''}")


def prune_template(path: Path, template: dict[str, Any], present: set[str]) -> dict[str, Any]:
    """Keep the entries the checkpoint has. The model was checked exactly; optimizer state of a
    parameter the checkpoint has state for must match key by key (else: another optimizer);
    parameters without any saved state (never got a gradient) and everything else (progress,
    rank-local state of ranks that did not exist, hyper-parameters a newer torch added) keep their
    current values."""
    state_prefix = f"{APP_KEY}.optim.state."
    saved_params = {k[len(state_prefix):] for k in present if k.startswith(state_prefix)}
    wrong = []
    for fqn, param_state in template.get("optim", {}).get("state", {}).items():
        if not any(s.startswith(f"{fqn}.") for s in saved_params):
            continue
        for key in flat_keys(param_state, f"{state_prefix}{fqn}"):
            if key not in present:
                wrong.append(key[len(f"{APP_KEY}.optim."):])
    if wrong:
        raise ConfigError("checkpoint.resume", f"{path}: checkpoint does not match the optimizer: missing "
                          f"{preview(wrong)} (saved with another optimizer?)")
    pruned = {}
    for section, value in template.items():
        if section == "model":
            pruned[section] = value
            continue
        kept = prune_to(value, present, f"{APP_KEY}.{section}")
        if not is_dropped(kept):
            pruned[section] = kept
    return pruned
