"""summary.json writing and step-time statistics, and the one line a run ends with.

Also home to `json_safe`, shared with the JSONL sink, so both files encode values the same way.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kiln.safe_io import MiB, read_json, write_atomic

__all__ = ["StepStats", "json_safe", "write_summary"]


def json_safe(value: Any) -> Any:
    """`value` made strict-JSON: NaN and +/-inf become null.

    Python's json would write bare `NaN`/`Infinity`, which is not JSON and which jq, JavaScript and
    many readers reject; writing strings like "nan" would turn a numeric column into mixed types.
    null keeps the column numeric-or-missing; a NaN loss is also reported by the NaN guard.
    numpy scalars and one-element tensors become Python numbers; unknown objects become str.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, Path):
        return str(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 0)() == 1:
        # A 0-d torch tensor: reading it syncs the device, so callers should pass floats already.
        return json_safe(item())
    return str(value)


def write_summary(path: str | os.PathLike[str], summary: Mapping[str, Any]) -> None:
    """Write `summary` as indented JSON, atomically: readers see the old file or the new, never half.

    The temporary file lives in the same directory so `os.replace` is a rename on one filesystem.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n"
    # A process killed mid-write (an NCCL watchdog abort, SIGKILL) cannot clean up after itself.
    for stale in target.parent.glob(f".{target.name}.*.part"):
        stale.unlink(missing_ok=True)  # removes a name (a planted link too), never what it points at
    # fsync before the rename so a power loss cannot leave an empty file under the real name.
    write_atomic(target, text, durable=True)


class StepStats:
    """Step times, one value per log interval (the interval's mean seconds per step).

    The trainer syncs the device only at log steps, so it knows interval averages, not single
    steps; the spread across intervals is still a good jitter signal. `skip_first` drops the first
    intervals (compile, cuDNN autotune, allocator warm-up) unless nothing else is left.
    """

    def __init__(self, skip_first: int = 0):
        self.skip_first = skip_first
        self._times: list[float] = []

    def add(self, step_seconds: float) -> None:
        self._times.append(float(step_seconds))

    def __len__(self) -> int:
        return len(self._times)

    def _values(self) -> list[float]:
        kept = self._times[self.skip_first :]
        return kept if kept else self._times

    def percentile(self, q: float) -> float | None:
        values = self._values()
        if not values:
            return None
        # Linear interpolation between order statistics (numpy's default), deterministic.
        return float(np.percentile(np.asarray(values, dtype=np.float64), q))

    def median(self) -> float | None:
        return self.percentile(50)

    def p10(self) -> float | None:
        return self.percentile(10)

    def p90(self) -> float | None:
        return self.percentile(90)

    def summary_ms(self) -> dict[str, float | None]:
        """`step_ms_median`, `step_ms_p10`, `step_ms_p90` for summary.json."""

        def ms(v: float | None) -> float | None:
            return None if v is None else v * 1e3

        return {"step_ms_median": ms(self.median()), "step_ms_p10": ms(self.p10()), "step_ms_p90": ms(self.p90())}


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """RUN_DIR/summary.json as written by `write_summary`, or None when it is missing, unreadable or
    not a JSON object (a run dir is read as untrusted input: no error, just no summary)."""
    try:
        data = read_json(Path(run_dir) / "summary.json", 16 * MiB)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summary_line(summary: dict, run_dir) -> str:
    """The one line a finished (or stopped) run ends with: steps, loss, speed, run dir."""
    if summary.get("first_loss") is None or summary.get("final_loss") is None:
        return f"kiln: {summary.get('status', 'completed')} {summary.get('steps', 0)} steps; run dir {run_dir}"
    rate = summary.get("tokens_per_s") and f"{summary['tokens_per_s']:.0f} tokens/s" or (
        f"{summary.get('samples_per_s') or 0:.0f} samples/s"
    )
    resumed = f" (resumed: {len(summary['segments'])} segments)" if summary.get("resumed") else ""
    return (f"kiln: {summary['status']} {summary['steps']} steps{resumed}, loss {summary['first_loss']:.4f} -> "
            f"{summary['final_loss']:.4f}, {summary['step_ms_median']:.2f} ms/step, {rate}; run dir {run_dir}")
