"""Branching a run from one of its checkpoints (or another run's) without mixing timelines.

`checkpoint.resume=PATH` starts training from a chosen checkpoint, often an earlier one of the
same run dir with another config (a lower learning rate from step 4). From then on the run dir
holds one timeline: the new one. Before the first step, rank 0 (holding the run dir's lock):

- moves every checkpoint of the run dir that is not on the new timeline (later than PATH's step
  when PATH is one of the run dir's own checkpoints; all of them when PATH is elsewhere) to
  `checkpoints/retired/<UTC time>/`, with a `retired.json` saying why. Nothing is deleted; auto
  resume, `checkpoint.keep` and `kiln export` never look there (delete the folder when done);
- moves `metrics.jsonl` there too when PATH is elsewhere (its records are another run's);
- records the branch point in `checkpoints/branch.json`, so a crash before the new timeline's
  first save resumes from PATH again (`checkpoint.resume=auto`), not from step 0.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Any

from kiln.checkpoint.layout import STEP_DIR, checkpoint_problem, checkpoint_step
from kiln.errors import ConfigError
from kiln.safe_io import read_json, write_json

log = logging.getLogger("kiln.checkpoint")

BRANCH_FILE = "branch.json"
RETIRED_DIR = "retired"


def branch(run_dir: Path, source: Path) -> dict[str, Any]:
    """Make `run_dir` hold only the timeline that continues from checkpoint `source` (see the
    module docstring); returns what was done."""
    run_dir, source = Path(run_dir), Path(source).resolve()
    root = run_dir / "checkpoints"
    step = checkpoint_step(source)
    own = source.parent == root.resolve()
    candidates = sorted((p for p in root.iterdir() if STEP_DIR.match(p.name) or p.name.endswith(".tmp")),
                        key=lambda p: p.name) if root.is_dir() else []
    later = [p for p in candidates if not own or p.resolve() != source and (
        p.name.endswith(".tmp") or int(STEP_DIR.match(p.name).group(1)) > step)]
    metrics = run_dir / "metrics.jsonl"
    moved: list[str] = []
    if later or (not own and metrics.exists()):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        dest = root / RETIRED_DIR / stamp
        dest.mkdir(parents=True)
        for path in later:
            os.replace(path, dest / path.name)
            moved.append(path.name)
        if not own and metrics.exists():
            os.replace(metrics, dest / metrics.name)
            moved.append(metrics.name)
        write_json(dest / "retired.json", {
            "reason": f"the run was branched from {source} (step {step}) with checkpoint.resume", "moved": moved})
        log.warning("branching from %s (step %d): %s of the earlier timeline moved to %s; auto resume, "
                    "checkpoint.keep and kiln export ignore it (delete it when no longer needed)",
                    source, step, ", ".join(moved), dest)
    root.mkdir(parents=True, exist_ok=True)
    record = {"from": str(source), "step": step,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_json(root / BRANCH_FILE, record)
    return {**record, "retired": moved}


def branch_point(root: Path) -> Path | None:
    """The checkpoint the run in `root`'s run dir branched from, None when it never branched.
    A branch record kiln cannot use (unreadable, not the shape it writes) or whose checkpoint is
    no longer complete is bad input (ConfigError): starting over from step 0 instead would discard
    the branch silently."""
    path = Path(root) / BRANCH_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        record = read_json(path, 1 << 20)
        source = Path(record["from"]) if isinstance(record, dict) and isinstance(record.get("from"), str) else None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), f"cannot be read ({getattr(exc, 'strerror', None) or exc}); {_FIX}") from None
    if source is None or not isinstance(record.get("step"), int):
        raise ConfigError(str(path), f"is not a branch record kiln wrote (want {{\"from\": PATH, \"step\": N}}); {_FIX}")
    problem = checkpoint_problem(source)
    if problem is not None:
        raise ConfigError(str(path), f"the run branched from {source}, which is no longer a complete checkpoint "
                          f"({problem}); {_FIX}")
    return source


_FIX = ("the run has no checkpoint of its own yet: pass checkpoint.resume=PATH to branch again, or "
        "checkpoint.resume=never with a new run dir to start over")
