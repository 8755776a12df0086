"""Reading a JSON-lines file a run appended to (`metrics.jsonl`), whatever a crash left at its end.

The writer (kiln.monitor.sinks.JsonlSink) appends whole records and cuts a record it could not
finish (a full disk) back off; a process killed in the middle of a write, or a file copied while
being written, can still end in half a line. Readers drop such a torn *last* line and say so,
naming the file; a line that is not JSON elsewhere in the file is damage, reported with its line
number.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kiln.safe_io import MiB, check_target, read_bytes, write_atomic

log = logging.getLogger("kiln.monitor")


RECORDS_LIMIT = 512 * MiB
"""The most of a JSON-lines file kiln reads (a long run logs well under a KiB per interval)."""


class BrokenRecordsError(ValueError):
    """A line that is not a JSON object in the middle of a JSON-lines file: `path`, 1-based `line`."""

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path, self.line = path, line


def read_records(path: Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """The records of `path` (one JSON object per line); a torn last line is dropped with a
    warning naming the file (`warn=False`: silently). Empty lines are skipped."""
    path = Path(path)
    text = read_bytes(path, RECORDS_LIMIT).decode("utf-8", errors="replace")
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            if n == len(lines) or (n == len(lines) - 1 and not lines[-1]):  # the last line
                if warn:
                    log.warning("%s: dropped its last line (%d bytes, cut short by a crash or a full disk)",
                                path, len(line.encode()))
                break
            raise BrokenRecordsError(f"{path}:{n} is not a JSON record ({exc})", path=path, line=n) from None
        records.append(record)
    return records


def keep_through(path: Path, last_step: int) -> None:
    """Rewrite `path` without the records past `last_step` (and a last line a crash cut short),
    aside and renamed, so a crash here loses nothing."""
    check_target(path)  # a link is refused (LinkRefused), not read through
    kept = [r for r in read_records(path) if r.get("step", 0) <= last_step]
    write_atomic(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))


def torn_tail(path: Path) -> int:
    """Bytes after the last newline of `path` (a record a crash cut short), 0 when it ends whole."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                return 0
            back = min(size, 1 << 20)
            f.seek(size - back)
            tail = f.read(back)
    except OSError:
        return 0
    cut = tail.rfind(b"\n")
    if cut < 0:
        return size if back == size else 0
    return len(tail) - cut - 1
