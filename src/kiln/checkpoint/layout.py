"""The on-disk layout of a run's checkpoints and when one counts as complete.

    run_dir/checkpoints/step_00000100/        complete: renamed AND holds kiln_complete.json
    run_dir/checkpoints/step_00000200.tmp/    being written (or a crash cut it short): never used

kiln.checkpoint.manager writes this layout; these readers serve it, resume, export and the
failure reports.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from kiln.checkpoint.dcp_io import check_files, read_metadata

log = logging.getLogger("kiln.checkpoint")

MARKER = "kiln_complete.json"
FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d{8,})$")


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete kiln checkpoint, or None when it is."""
    if not path.is_dir():
        return "not a directory"
    if path.name.endswith(".tmp"):
        return "its save did not finish (.tmp)"
    marker = read_marker(path)
    if marker is None:
        return f"no valid completion marker ({MARKER})"
    match = STEP_DIR.match(path.name)
    if match and marker.get("step") != int(match.group(1)):
        return f"marker says step {marker.get('step')}, directory says {int(match.group(1))}"
    try:
        metadata = read_metadata(path)
    except Exception as exc:  # unreadable, truncated or refused metadata: not usable
        return f"unreadable DCP metadata ({type(exc).__name__}: {exc})"
    return check_files(path, metadata)


def latest_complete(root: Path, *, ignore: Path | None = None) -> Path | None:
    """Newest complete checkpoint under `root` (a `checkpoints/` dir); warns naming each newer
    incomplete or corrupt one it skips, and every leftover `.tmp` (other than `ignore`)."""
    if not root.is_dir():
        return None
    for tmp in sorted(root.glob("step_*.tmp")):
        if ignore is None or tmp != ignore:
            log.warning("skipping incomplete checkpoint %s: its save did not finish", tmp)
    candidates = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))), reverse=True
    )
    for _, path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints (renamed and marked), oldest first. Only the marker is checked: this
    decides retention, where reading every checkpoint's metadata would be wasted work."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found) if read_marker(p) is not None]
