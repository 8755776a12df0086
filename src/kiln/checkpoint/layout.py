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
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kiln.checkpoint.dcp_io import check_files, inside, read_metadata
from kiln.safe_io import describe, open_read, read_json, regular_file_problem

log = logging.getLogger("kiln.checkpoint")

MARKER = "kiln_complete.json"
MARKER_LIMIT = 64 << 20
"""The largest completion marker kiln reads (one line per file of the checkpoint)."""
FORMAT_VERSION = 2
_CHUNK = 8 << 20
HASH_THREADS = min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
"""Files of one checkpoint hashed at once (writing its manifest, verifying it before a load)."""
_verified: dict[tuple[str, int, int], str | None] = {}  # (marker path, its mtime, size) -> problem
STEP_DIR = re.compile(r"^step_(\d{8,})$")


def marker_problem(marker: Any) -> str | None:
    """Why a parsed completion marker does not have the shape kiln writes, or None: `step` an int,
    `files` (format 2) a map of plain relative names to {"bytes": int, "sha256": str}."""
    if not isinstance(marker, dict):
        return "not a JSON object"
    if not isinstance(marker.get("step"), int) or isinstance(marker.get("step"), bool):
        return f"its step is {marker.get('step')!r}, not a number"
    files = marker.get("files")
    if files is None:
        return None
    if not isinstance(files, dict):
        return f"its files entry is {type(files).__name__}, not an object"
    for rel, entry in files.items():
        if not inside(rel):
            return f"it lists {rel!r}, not a file inside the checkpoint"
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and not isinstance(entry["bytes"], bool)
                and isinstance(entry.get("sha256"), str)):
            return f"its entry for {rel} is {entry!r}, not {{\"bytes\": int, \"sha256\": str}}"
    return None


def marker_status(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the completion marker of checkpoint `path`, None) or (None, why it is unusable). Read as
    untrusted input: a regular file, bounded, of the shape kiln writes."""
    try:
        marker = read_json(path / MARKER, MARKER_LIMIT)
    except FileNotFoundError:
        return None, f"no valid completion marker ({MARKER})"
    except OSError as exc:
        return None, f"completion marker {MARKER} {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"completion marker {MARKER} is not JSON ({exc})"
    problem = marker_problem(marker)
    if problem is not None:
        return None, f"completion marker {MARKER} is malformed: {problem}"
    return marker, None


def read_marker(path: Path) -> dict[str, Any] | None:
    return marker_status(Path(path))[0]


def checkpoint_step(path: Path) -> int:
    """The step a complete checkpoint was saved at (from its completion marker), -1 without one."""
    return int((read_marker(Path(path)) or {}).get("step", -1))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open_read(path, 1 << 62) as f:  # a regular file, never a FIFO or a device
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digests(files: list[Path], *, errors: bool = False) -> list[Any]:
    """`file_digest` of each file, several files at once: hashlib releases the GIL while it hashes,
    so a checkpoint of N ranks' files (DCP writes one or more per rank) hashes on up to
    HASH_THREADS cores instead of one. `errors`: a file that cannot be read gives its OSError in
    its place instead of raising."""
    def digest(file: Path) -> str | OSError:
        try:
            return file_digest(file)
        except OSError as exc:
            if not errors:
                raise
            return exc

    if len(files) <= 1:
        return [digest(f) for f in files]
    with ThreadPoolExecutor(max_workers=min(len(files), HASH_THREADS), thread_name_prefix="kiln-sha256") as pool:
        return list(pool.map(digest, files))


def content_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """`{relative name: {"bytes", "sha256"}}` of every file of a checkpoint being completed."""
    files = [f for f in sorted(path.rglob("*")) if f.is_file() and f.name != MARKER and not f.name.endswith(".part")]
    return {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": digest}
            for f, digest in zip(files, file_digests(files), strict=True)}


def _size_problem(path: Path, files: dict[str, Any]) -> str | None:
    for rel, expected in sorted(files.items()):
        file = path / rel
        try:
            kind = regular_file_problem(file)
            if kind is not None:
                return f"data file {rel} {kind}"
            size = file.stat().st_size
        except OSError as exc:
            return f"data file {rel} cannot be read ({exc.strerror or exc})"
        if isinstance(expected.get("bytes"), int) and size < expected["bytes"]:
            return f"data file {rel} is truncated ({size} < {expected['bytes']} bytes)"
        if size != expected.get("bytes"):
            return f"data file {rel} is {size} bytes, {expected.get('bytes')} when saved"
    return None


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
    problem = _size_problem(path, files)  # every file present and of its size, before any is read
    if problem is None and hashes:
        names = sorted(files)
        for rel, digest in zip(names, file_digests([path / rel for rel in names], errors=True), strict=True):
            if isinstance(digest, OSError):
                problem = f"data file {rel} cannot be read ({digest.strerror or digest})"
            elif digest != files[rel].get("sha256"):
                problem = f"data file {rel} does not match its checksum (its bytes changed after the save: corrupt)"
            if problem:
                break
    if cache_key is not None:
        _verified[cache_key] = problem
    return problem


def checkpoint_problem(path: Path, *, hashes: bool = True) -> str | None:
    """Why `path` is not a complete kiln checkpoint, or None when it is. `hashes=False` skips reading
    the data files for their checksums (sizes are still checked): for a message about a checkpoint
    this process's ranks have just written, not for one about to be loaded."""
    if path.is_symlink():
        return describe(path, path.lstat().st_mode)
    if not path.is_dir():
        return "not a directory"
    if path.name.endswith(".tmp"):
        return "its save did not finish (.tmp)"
    marker, problem = marker_status(path)
    if marker is None:
        return problem
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


def latest_complete(root: Path, *, ignore: Path | None = None, before: int | None = None) -> Path | None:
    """Newest complete checkpoint under `root` (a `checkpoints/` dir), older than step `before`
    when given; warns naming each newer incomplete or corrupt one it skips, and every leftover
    `.tmp` (other than `ignore`)."""
    if not root.is_dir():
        return None
    for tmp in sorted(root.glob("step_*.tmp")):
        if ignore is None or tmp != ignore:
            log.warning("skipping incomplete checkpoint %s: its save did not finish", tmp)
    candidates = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))), reverse=True
    )
    for step, path in candidates:
        if before is not None and step >= before:
            continue
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
