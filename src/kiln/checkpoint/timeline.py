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
import json
import logging
import os
from pathlib import Path
from typing import Any

from kiln.checkpoint.layout import STEP_DIR, checkpoint_problem, checkpoint_step

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
        (dest / "retired.json").write_text(json.dumps(
            {"reason": f"the run was branched from {source} (step {step}) with checkpoint.resume",
             "moved": moved}, indent=2) + "\n")
        log.warning("branching from %s (step %d): %s of the earlier timeline moved to %s; auto resume, "
                    "checkpoint.keep and kiln export ignore it (delete it when no longer needed)",
                    source, step, ", ".join(moved), dest)
    root.mkdir(parents=True, exist_ok=True)
    record = {"from": str(source), "step": step,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    tmp = root / (BRANCH_FILE + ".part")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, root / BRANCH_FILE)
    return {**record, "retired": moved}


def branch_point(root: Path) -> Path | None:
    """The checkpoint the run in `root`'s run dir branched from, when it is still complete."""
    try:
        record = json.loads((Path(root) / BRANCH_FILE).read_text())
        source = Path(record["from"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    problem = checkpoint_problem(source)
    if problem is not None:
        log.warning("the run branched from %s, which is no longer a complete checkpoint: %s", source, problem)
        return None
    return source
