"""After a failed save: why it failed when the error does not say, and what it left behind.

torch.save writes DCP's files through its zip writer, which reports a full disk as
`RuntimeError: [enforce fail at inline_container.cc] . unexpected pos N vs M` and drops the
errno. So after a failed save whose errors carry no errno, rank 0 looks at the filesystem while
the partial files still fill it: almost no free space means the disk is full; otherwise a small
probe write shows a lost permission, a read-only remount or an exhausted quota with their real
errno. Then the partial directory goes; the previous complete checkpoint is never touched.
`kept` says what a failed run left: its newest intact checkpoint and the partial saves removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

from kiln.checkpoint.layout import checkpoint_problem, complete_checkpoints, read_marker
from kiln.failure.classify import diagnose, short_error

FULL_BELOW_BYTES = 1 << 20
"""Less free space than this (or than 0.5 % of the filesystem) right after a failed write: full."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed. Rank 0 has removed the partial `.tmp` directory; the previous
    complete checkpoint is untouched. `cause` is the error as raised (DCP's CheckpointException,
    an OSError, ...), `storage` what examining the filesystem found (or None)."""

    def __init__(self, step: int, path: Path, cause: BaseException, *, storage: OSError | None = None,
                 rank: int = 0) -> None:
        self.step, self.path, self.cause, self.storage, self.rank = step, Path(path), cause, storage, rank
        # The deciding error, not DCP's wrapper (whose text is every rank's traceback).
        reason = short_error(storage) if storage is not None else diagnose(cause).detail
        super().__init__(f"checkpoint save of step {step} to {path} failed: {reason}")


def probe_storage(root: Path, error: BaseException | None = None) -> OSError | None:
    """The storage's problem under `root` as an OSError with its errno, or None when writing there
    works. Skipped (None) when `error` already names its cause precisely."""
    if error is not None:
        if diagnose(error).kind != "error":
            return None
    where = root if root.is_dir() else root.parent
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        return exc
    if usage.free < max(FULL_BELOW_BYTES, usage.total // 200):
        return OSError(errno.ENOSPC, f"No space left on device ({_size(usage.free)} free of {_size(usage.total)})",
                       str(where))
    probe: str | None = None
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".kiln_write_probe_")  # O_EXCL: a fresh file
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):  # a probe that cannot be removed is a 4 KiB footnote
                os.unlink(probe)
    return None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def discard_partial(root: Path, tmp: Path, error: BaseException | None) -> tuple[OSError | None, list[Path]]:
    """Rank 0, after a failed save: examine the storage first (a full disk is only visible while
    the partial files still fill it; not after an interruption, `error` None), then remove the
    partial directory `tmp`. Returns the storage's problem (or None) and what was removed."""
    storage = probe_storage(root, error) if error is not None else None
    if not tmp.exists():
        return storage, []
    try:
        shutil.rmtree(tmp)
    except OSError:  # the failure itself is what gets reported; a leftover is swept on the failure path
        return storage, []
    return storage, [tmp]


def remove_partial(root: Path) -> list[Path]:
    """Remove every `step_*.tmp` directory under `root` (saves cut short: never resumed from, and
    they hold space). Only while no save is running. Returns what it removed."""
    removed = []
    for tmp in sorted(root.glob("step_*.tmp")) if root.is_dir() else []:
        if tmp.is_symlink():  # the name goes, never what it points at
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
        elif tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            if not tmp.exists():
                removed.append(tmp)
    return removed


def newest_intact(root: Path, *, hashes: bool = True) -> Path | None:
    """Newest complete checkpoint under `root`, fully checked (without checksums when `hashes` is
    False), without logging what it skips (the failure message names what was kept; warnings
    about skipped ones would only add noise)."""
    for path in reversed(complete_checkpoints(root)):
        if checkpoint_problem(path, hashes=hashes) is None:
            return path
    return None


def kept(root: Path, removed: list[Path]) -> tuple[str, bool]:
    """What a failed run left under `root` (its checkpoints), for the failure's report: ("checkpoint
    step 5 is intact (path); the partial save ... was removed", whether the run can resume)."""
    newest = newest_intact(root)
    if newest is not None:
        step = (read_marker(newest) or {}).get("step", "?")
        text = f"checkpoint step {step} is intact ({newest})"
    else:
        text = "no complete checkpoint was saved before the failure"
    if removed:
        names = ", ".join(p.name for p in removed)
        text += f"; the partial save{'s' if len(removed) > 1 else ''} ({names}) {'were' if len(removed) > 1 else 'was'} removed"
    return text, newest is not None
