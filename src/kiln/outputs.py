"""Where a command will write, checked before it does any work: a file path that cannot be
written (a directory, a missing or read-only folder) or an output directory another live kiln
process is writing to is bad input (exit 2), found before minutes of benchmarking or generating.

`claim_output_dir` creates the directory, takes the same advisory lock a training run takes on
its run dir (kiln.train.rundir.RunDirLock) and holds it until the process exits, so two commands
given one `--out` never both write there: the second is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from pathlib import Path

from kiln.config.errors import ConfigError

_held: dict[str, object] = {}


def _probe(directory: Path, flag: str, shown: Path) -> None:
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".kiln-write-probe-")
    except OSError as exc:
        raise ConfigError(flag, f"{shown}: cannot write there ({exc.strerror or exc})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def check_writable_file(path: str | Path, flag: str) -> Path:
    """`path` can be created or replaced as a file: not a directory, its folder exists and takes
    a file. Writes nothing that stays."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(flag, f"{path}: its directory {parent} does not exist")
    _probe(parent, flag, path)
    return path


def claim_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` (a directory) if needed, check it takes files, and hold its lock until this
    process exits; ConfigError when another live kiln process holds it."""
    from kiln.train.rundir import RunDirLock

    path = Path(path)
    key = os.path.abspath(path)
    if key in _held:
        return path
    lock = RunDirLock(path)
    try:
        lock.acquire()
    except ConfigError as exc:
        raise ConfigError(flag, str(exc).split(": ", 1)[1]) from None
    _held[key] = lock
    atexit.register(lock.release, remove_if_created=True)  # an output dir left empty goes again
    _probe(path, flag, path)
    return path


def release_output_dir(path: str | Path) -> None:
    """Give up a claimed directory early (a refusal found under its lock)."""
    lock = _held.pop(os.path.abspath(path), None)
    if lock is not None:
        lock.release(remove_if_created=True)
