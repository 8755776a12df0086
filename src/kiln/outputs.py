"""Where a command will write, checked before it does any work: a file path that cannot be
written (a directory, a missing or read-only folder) or an output directory another live kiln
process is writing to is bad input (exit 2), found before minutes of benchmarking or generating.

`claim_output_dir` creates the directory, takes the same advisory lock a training run takes on
its run dir (RunDirLock, below) and holds it until the process exits, so two commands
given one `--out` never both write there: the second is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kiln.errors import ConfigError
from kiln.safe_io import LinkRefused, open_truncate, read_text, refuse_links

LOCK_FILE = ".kiln.lock"
_held: dict[str, object] = {}
_mine: set[str] = set()
"""The directories whose RunDirLock this process holds now."""


def probe_writable(directory: Path, flag: str, shown: Path) -> None:
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
    probe_writable(parent, flag, path)
    return path


def claim_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` (a directory) if needed, check it takes files, and hold its lock until this
    process exits; ConfigError when another live kiln process holds it."""
    path = Path(path)
    key = os.path.abspath(path)
    if key in _held:
        return path
    lock = RunDirLock(path)
    try:
        lock.acquire()
    except LinkRefused:
        raise  # names the link itself
    except ConfigError as exc:
        raise ConfigError(flag, exc.message, exc.choices) from None
    _held[key] = lock
    atexit.register(lock.release, remove_if_created=True)  # an output dir left empty goes again
    probe_writable(path, flag, path)
    return path


def release_output_dir(path: str | Path) -> None:
    """Give up a claimed directory early (a refusal found under its lock)."""
    lock = _held.pop(os.path.abspath(path), None)
    if lock is not None:
        lock.release(remove_if_created=True)


LOCK_ENV = "KILN_RUN_DIR_LOCK"
"""Set by the `kiln train --nproc-per-node` launcher for its ranks: `PID:PATH` of the lock it holds
for them, so rank 0 trains under its launcher's lock instead of being refused by it."""


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def lock_holder(path: Path) -> str | None:
    """The pid of the live kiln process holding the run dir's lock ("?" when it recorded none),
    or None when the dir is free. Takes and drops the lock when free; writes nothing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no advisory locks on this platform
        return None
    try:
        fd = _open_dir(path)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                return read_text(path / LOCK_FILE, 64, errors="replace").strip() or "?"
            except OSError:
                return "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held_by_another(path: str | Path) -> tuple[Path, str] | None:
    """(folder, pid) when `path` or a folder above it is locked by another live kiln process: that
    process's run or output dir, where this one must not write. None when no lock is held there, or
    when this process holds it (or its launcher does for it). Reads only: `lock_holder` is asked
    only of folders holding a `.kiln.lock` note."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if not (folder / LOCK_FILE).exists():
            continue
        if str(folder) in _mine or held_for_me(folder):
            return None
        pid = lock_holder(folder)
        if pid is not None:
            return folder, pid
    return None


def refuse_held_by_another(path: str | Path, flag: str, hint: str) -> None:
    """ConfigError (exit 2) naming `flag` when `path` lies in a dir another live kiln process holds."""
    held = held_by_another(path)
    if held is not None:
        where = "" if Path(os.path.abspath(path)) == held[0] else f" is inside {held[0]}, which"
        raise ConfigError(flag, f"{path}{where} is in use by a running kiln process (pid {held[1]}); {hint}")


def _launcher_pid(path: Path) -> str | None:
    """The pid LOCK_ENV names as holding `path`'s lock for this process, or None."""
    pid, _, where = os.environ.get(LOCK_ENV, "").partition(":")
    if not pid or not where:
        return None
    with contextlib.suppress(OSError):
        if os.path.samefile(where, path):
            return pid
    return None


def held_for_me(path: Path) -> bool:
    """True when this process's launcher holds `path`'s lock on its behalf (LOCK_ENV names it and
    the lock is held by that pid)."""
    pid = _launcher_pid(path)
    return pid is not None and lock_holder(Path(path)) == pid


class RunDirLock:
    """An exclusive advisory lock (flock) on the run dir itself, held by the one process that may
    write or delete in it: rank 0 of a run, or the launcher of a multi-rank run. The OS drops it
    when the process dies (SIGKILL included), so a crash never leaves a stale lock; `.kiln.lock`
    only records the holder's pid for other processes' messages. Taken *before* the run dir is
    inspected, so two kiln processes never both decide a dir is theirs.

    A dir that did not exist is created to be locked; if the holder releases it with
    `remove_if_created=True` (bad input, nothing trained) and the dir is empty, it is removed.
    A dir this process's launcher holds for it (LOCK_ENV) is not taken again: `acquire` returns
    without holding it, and the process works under its launcher's lock."""

    def __init__(self, path: Path) -> None:
        self.dir = Path(path)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None
        self.created = False

    def acquire(self) -> RunDirLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover
            return self
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError("--run-dir", f"{self.dir} exists and is not a directory")
        if not self.dir.exists():
            try:
                self.dir.mkdir(parents=True)
                self.created = True
            except FileExistsError:  # another process made it first: the lock decides
                self.created = False
            except OSError as exc:
                raise ConfigError("--run-dir", f"{self.dir}: cannot create it ({exc.strerror})") from None
        try:
            fd = _open_dir(self.dir)
        except OSError as exc:
            raise ConfigError("--run-dir", f"{self.dir}: cannot open it ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            launcher = _launcher_pid(self.dir)
            pid = lock_holder(self.dir) or "?"
            if pid == launcher:  # held for this process by its launcher: it works under that lock
                return self
            raise ConfigError("--run-dir", f"{self.dir} is in use by a running kiln process (pid {pid}); "
                              "choose another directory") from None
        try:  # a link or a special file anywhere in the dir: refused before anything is written
            refuse_links(self.dir)
        except LinkRefused:
            os.close(fd)
            raise
        self._fd = fd
        _mine.add(os.path.abspath(self.dir))
        with contextlib.suppress(OSError):  # the pid note is for messages only
            with os.fdopen(open_truncate(self.path), "w") as note:
                note.write(f"{os.getpid()}\n")
        return self

    def release(self, *, remove_if_created: bool = False) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)  # while still holding it (a name: a link is never followed)
        if remove_if_created and self.created:
            with contextlib.suppress(OSError):
                self.dir.rmdir()  # only if empty: never anything a run wrote
        os.close(self._fd)  # closing releases the lock
        self._fd = None
        _mine.discard(os.path.abspath(self.dir))

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[None]:
        """Release the lock if the block raises, removing the dir if acquiring it created it (and it
        is still empty): a run refused on bad input leaves the dir as it was."""
        try:
            yield
        except BaseException:
            self.release(remove_if_created=True)
            raise

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
