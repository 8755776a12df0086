"""A run resumed after a stop or a crash is still one run: summary.json describes all of it.

Each process that trains in a run dir is one segment of the run (steps `first_step`..`last_step`,
its wall time, how it ended). summary.json lists them all (`segments`) and its run-level figures
cover the whole run: `first_loss` is the first segment's (step 1), `wall_s` adds up the segments'
wall times, `resumed` says whether there was more than one. The segment's own figures stay beside
them (`segment_first_loss`, `segment_wall_s`); throughput and step times are the last segment's,
as its records are the ones measured on the current setup.

The earlier segments come from the summary.json the previous segment wrote, read before this one
replaces it. A segment killed outright (SIGKILL, the OOM killer, a lost node) wrote none: it is
listed with the last step its checkpoint proves and an unknown wall time, and `wall_s_complete`
is then false. The first loss falls back to metrics.jsonl's step-1 record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.monitor.records import RECORDS_LIMIT
from kiln.monitor.summary import read_summary
from kiln.safe_io import open_read


@dataclass
class RunHistory:
    segments: list[dict[str, Any]] = field(default_factory=list)
    """The earlier segments, oldest first."""
    first_loss: float | None = None
    """The run's first loss (its step 1), if an earlier segment logged it."""


def _first_record_loss(metrics: Path) -> float | None:
    """The loss of metrics.jsonl's step-1 record, if it has one."""
    try:
        with open_read(metrics, RECORDS_LIMIT) as f:  # a regular file: a FIFO never hangs here
            first = json.loads(f.readline(1 << 20) or "{}")
    except (OSError, ValueError):
        return None
    return first.get("loss") if isinstance(first, dict) and first.get("step") == 1 else None


def read_history(run_dir: Path, resume_step: int) -> RunHistory:
    """The segments before one that resumes from a checkpoint of step `resume_step` in `run_dir`."""
    prior = read_summary(run_dir)
    segments: list[dict[str, Any]] = []
    first_loss = None
    if prior is not None and not prior.get("already_complete"):
        if isinstance(prior.get("segments"), list):
            segments = [dict(s) for s in prior["segments"]]
        else:  # a summary written before segments were recorded: one segment, its start unknown if resumed
            segments = [{"first_step": None if prior.get("resumed_from") else 1, "last_step": prior.get("steps"),
                         "wall_s": prior.get("wall_s"), "status": prior.get("status")}]
        first_loss = prior.get("first_loss") if segments and segments[0].get("first_step") == 1 else None
    last = segments[-1].get("last_step") if segments else None
    if not isinstance(last, int) or last < resume_step:  # a segment that left no summary reached the checkpoint
        segments.append({"first_step": (last + 1) if isinstance(last, int) else None, "last_step": resume_step,
                         "wall_s": None, "status": "unknown (no summary.json: the process was killed)"})
    if first_loss is None:
        first_loss = _first_record_loss(run_dir / "metrics.jsonl")
    return RunHistory(segments, first_loss)


def whole_run(summary: dict[str, Any], history: RunHistory, first_step: int,
              resumed_from: str | None) -> dict[str, Any]:
    """The run-level fields of summary.json for the segment in `summary` (its status, steps done,
    wall_s, first_loss), after the segments of `history`."""
    segment = {"first_step": first_step, "last_step": summary.get("steps"), "wall_s": summary.get("wall_s"),
               "status": summary.get("status")}
    if summary.get("stopped_by"):
        segment["stopped_by"] = summary["stopped_by"]
    if resumed_from:
        segment["resumed_from"] = resumed_from
    segments = [*history.segments, segment]
    walls = [s.get("wall_s") for s in segments]
    known = [w for w in walls if isinstance(w, (int, float))]
    out: dict[str, Any] = {
        "resumed": len(segments) > 1,
        "segments": segments,
        "segment_wall_s": summary.get("wall_s"),
        "wall_s": round(sum(known), 3),
        "wall_s_complete": len(known) == len(walls),
        "segment_first_loss": summary.get("first_loss"),
    }
    if len(segments) > 1 and history.first_loss is not None:
        out["first_loss"] = history.first_loss
    return out


def describe_segments(summary: dict[str, Any]) -> str | None:
    """One line for a report: "2 segments: steps 1-40 (stopped, SIGTERM, 12.3 s), 41-100 (completed,
    30.1 s)"; None for a run of one segment."""
    segments = summary.get("segments") or []
    if len(segments) < 2:
        return None

    def one(s: dict[str, Any]) -> str:
        first = s.get("first_step")
        steps = f"{first if first is not None else '?'}-{s.get('last_step', '?')}"
        how = ", ".join(str(x) for x in (s.get("status"), s.get("stopped_by")) if x)
        wall = s.get("wall_s")
        how += f", {wall:.1f} s" if isinstance(wall, (int, float)) else ", wall time unknown"
        return f"steps {steps} ({how})"

    return f"{len(segments)} segments: " + "; ".join(one(s) for s in segments)
