"""The on-disk layout of a run's checkpoints and when one counts as complete.

    run_dir/checkpoints/step_00000100/        complete: renamed AND holds kiln_complete.json
    run_dir/checkpoints/step_00000200.tmp/    being written (or a crash cut it short): never used
    run_dir/checkpoints/retired/<when>/       checkpoints of a timeline left by a branch (see
                                              kiln.checkpoint.timeline): never resumed or exported

The completion marker lists every file of the checkpoint with its size and SHA-256 (format 2), so
a checkpoint whose bytes changed after it was written (a bad disk, a bad copy, an overwrite) is
found before it is loaded, reported, and skipped in favour of the newest intact one.

kiln.checkpoint.manager writes this layout; these readers serve it, resume, export and the
failure reports.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

from kiln.checkpoint.dcp_io import check_files, read_metadata

log = logging.getLogger("kiln.checkpoint")

MARKER = "kiln_complete.json"
FORMAT_VERSION = 2
_CHUNK = 8 << 20
_verified: dict[tuple[str, int, int], str | None] = {}  # (marker path, its mtime, size) -> problem
STEP_DIR = re.compile(r"^step_(\d{8,})$")


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_step(path: Path) -> int:
    """The step a complete checkpoint was saved at (from its completion marker), -1 without one."""
    return int((read_marker(Path(path)) or {}).get("step", -1))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """`{relative name: {"bytes", "sha256"}}` of every file of a checkpoint being completed."""
    return {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": file_digest(f)}
            for f in sorted(path.rglob("*")) if f.is_file() and f.name != MARKER and not f.name.endswith(".part")}


def content_problem(path: Path, marker: dict[str, Any], *, hashes: bool = True) -> str | None:
    """Why the files of `path` are not the ones its marker lists (missing, resized, other
    bytes), or None. Checkpoints written before checksums existed (format 1) are not checked.
    A result is remembered per marker, so resolving and then loading reads the files once. With
    `hashes` False only presence and sizes are checked (no file is read)."""
    files = marker.get("files")
    if not isinstance(files, dict):
        return None
    try:
        stat = (path / MARKER).stat()
    except OSError as exc:
        return f"completion marker unreadable ({exc.strerror})"
    cache_key = (str((path / MARKER).resolve()), stat.st_mtime_ns, stat.st_size)
    if cache_key in _verified:
        return _verified[cache_key]
    cache_key = cache_key if hashes else None
    problem = None
    for rel, expected in sorted(files.items()):
        file = path / rel
        try:
            size = file.stat().st_size
            if isinstance(expected.get("bytes"), int) and size < expected["bytes"]:
                problem = f"data file {rel} is truncated ({size} < {expected['bytes']} bytes)"
            elif size != expected.get("bytes"):
                problem = f"data file {rel} is {size} bytes, {expected.get('bytes')} when saved"
            elif hashes and file_digest(file) != expected.get("sha256"):
                problem = f"data file {rel} does not match its checksum (its bytes changed after the save: corrupt)"
        except OSError as exc:
            problem = f"data file {rel} cannot be read ({exc.strerror or exc})"
        if problem:
            break
    if cache_key is not None:
        _verified[cache_key] = problem
    return problem


def checkpoint_problem(path: Path, *, hashes: bool = True) -> str | None:
    """Why `path` is not a complete kiln checkpoint, or None when it is. `hashes=False` skips reading
    the data files for their checksums (sizes are still checked): for a message about a checkpoint
    this process's ranks have just written, not for one about to be loaded."""
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
    problem = content_problem(path, marker, hashes=hashes)
    if problem is not None:
        return problem
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
        log.warning("skipping checkpoint %s: %s; using an older one", path, problem)
    return None


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints (renamed and marked), oldest first. Only the marker is checked: this
    decides retention, where reading every checkpoint's metadata would be wasted work."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found) if read_marker(p) is not None]
