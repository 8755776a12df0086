"""Reading and writing the files of a run dir or an output dir, which may have been handed over
(`cp -a`, `tar`, a shared filesystem) and so are untrusted, all of them.

Writes never follow a link and never land outside their directory: a file is replaced by writing
a temporary created with O_EXCL beside it and renaming it over the name; appends and in-place
writes open with O_NOFOLLOW and take regular files only. A link (or a FIFO, a device) where kiln
writes its own file is bad input: `LinkRefused`, a ConfigError (exit 2) naming it. `refuse_links`
looks over a whole directory for them first, so a command refuses before any work.

Reads take regular files only, opened without blocking (a FIFO never hangs) and never more than a
stated size (`/dev/zero` or a huge file never fills memory); what is refused is an `UnsafeFile`, an
OSError, so callers that treat an unreadable file as absent keep doing so, and say why.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError

log = logging.getLogger("kiln")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
MiB = 1 << 20
SCAN_LIMIT = 200_000
"""Entries `refuse_links` looks at before it stops (a huge tree: the writers still refuse links)."""


class UnsafeFile(OSError):
    """A file kiln will not read: a link, not a regular file, or larger than its limit."""


class LinkRefused(ConfigError):
    """A link or a special file where kiln writes its own file (exit 2, naming it)."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(str(path), f"{problem}; kiln writes its own files here and never through a link or "
                         "into a special file: remove it, or use another directory")
        self.path = Path(path)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def describe(path: Path, mode: int) -> str:
    """`is a symbolic link to X`, `is a FIFO`, ...: what a refused entry is, for messages."""
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            return f"is a symbolic link to {os.readlink(path)}"
    return f"is {_kind(mode)}"


def check_target(path: str | os.PathLike[str]) -> None:
    """LinkRefused unless `path` is absent or a regular file (lstat: a link is never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise LinkRefused(path, describe(Path(path), mode))


CHECKPOINT_ENTRIES = ("checkpoints/step_*", "checkpoints/retired")
"""Left to kiln.checkpoint.layout by `refuse_links`: kiln never writes into a saved checkpoint, and a
checkpoint holding a link or a special file is skipped for an older one (a leftover `.tmp` link
removed), not the whole run refused."""


def refuse_links(root: str | os.PathLike[str], *, prune: tuple[str, ...] = CHECKPOINT_ENTRIES,
                 limit: int = SCAN_LIMIT) -> None:
    """LinkRefused naming the first link or special file anywhere under directory `root` (which may
    itself be a link: the user named it), except at entries matching `prune` (relative posix
    patterns). Nothing under it is followed."""
    seen = 0
    root = Path(root)
    stack = [root]
    while stack and seen < limit:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # unreadable: the command's own reads and writes say so
        for entry in entries:
            seen += 1
            rel = Path(entry.path).relative_to(root).as_posix()
            if any(fnmatch.fnmatchcase(rel, pattern) for pattern in prune):
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
            elif not stat.S_ISREG(info.st_mode):
                raise LinkRefused(entry.path, describe(Path(entry.path), info.st_mode))
            elif info.st_nlink > 1:  # a hard link: appending to it would write to its other names too
                raise LinkRefused(entry.path, f"is a hard link ({info.st_nlink} names)")


def _open_existing_or_new(path: Path, flags: int, mode: int) -> int:
    check_target(path)
    try:
        fd = os.open(path, flags | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):
            raise LinkRefused(path, describe(path, os.lstat(path).st_mode)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise LinkRefused(path, describe(path, info.st_mode) if not stat.S_ISREG(info.st_mode)
                          else f"is a hard link ({info.st_nlink} names)")
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def open_append(path: str | os.PathLike[str], mode: int = 0o666) -> int:
    """A file descriptor appending to the regular file `path` (created if absent), never through a link."""
    return _open_existing_or_new(Path(path), os.O_WRONLY | os.O_APPEND, mode)


def open_truncate(path: str | os.PathLike[str], mode: int = 0o666) -> int:
    """A file descriptor writing the regular file `path` from its start (created if absent, emptied
    only once it is known to be a regular file), never through a link."""
    fd = _open_existing_or_new(Path(path), os.O_WRONLY, mode)
    os.ftruncate(fd, 0)
    return fd


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells (a save finishes in a
    background thread: setting the umask to read it would race the threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def append_text(path: str | os.PathLike[str], text: str) -> None:
    with os.fdopen(open_append(path), "a", encoding="utf-8") as f:
        f.write(text)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False,
                 mode: int = 0o666) -> None:
    """Replace `path` with `data`: a temporary created beside it (O_EXCL: a planted name is never
    opened) renamed over it, so readers see the old file or the new. `durable` fsyncs first."""
    path = Path(path)
    check_target(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode & ~_umask())  # mkstemp makes it 0600; a new file gets mode less the umask
        check_target(path)
        os.replace(tmp, path)  # rename replaces a name, it never writes through one
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any, *, durable: bool = False) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n", durable=durable)


def _open_for_read(path: Path, limit: int, follow: bool) -> tuple[int, int]:
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise UnsafeFile(errno.ELOOP, describe(path, os.lstat(path).st_mode), str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFile(errno.EINVAL, f"is {_kind(info.st_mode)}, not a regular file", str(path))
    if info.st_size > limit:
        os.close(fd)
        raise UnsafeFile(errno.EFBIG, f"is {info.st_size} bytes, more than the {limit} kiln reads there",
                         str(path))
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd, info.st_size


def read_bytes(path: str | os.PathLike[str], limit: int, *, follow: bool = False) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (UnsafeFile otherwise). Without
    `follow`, a link is refused too; with it, reading through a link is logged."""
    path = Path(path)
    if follow and path.is_symlink():
        log.info("reading %s through a link to %s", path, os.path.realpath(path))
    fd, _ = _open_for_read(path, limit, follow)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise UnsafeFile(errno.EFBIG, f"holds more than the {limit} bytes kiln reads there", str(path))
    return data


def read_text(path: str | os.PathLike[str], limit: int, *, follow: bool = False, errors: str = "strict") -> str:
    return read_bytes(path, limit, follow=follow).decode("utf-8", errors=errors)


def read_json(path: str | os.PathLike[str], limit: int, *, follow: bool = False) -> Any:
    """Parsed JSON of a bounded regular file (ValueError when it is not JSON)."""
    return json.loads(read_bytes(path, limit, follow=follow))


@contextlib.contextmanager
def open_read(path: str | os.PathLike[str], limit: int, *, follow: bool = False) -> Iterator[Any]:
    """A binary file object over regular file `path` (checked as `read_bytes` does) for streaming."""
    fd, _ = _open_for_read(Path(path), limit, follow)
    with os.fdopen(fd, "rb") as f:
        yield f


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` is not a regular file kiln may read without following a link, or None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if stat.S_ISREG(mode) else describe(Path(path), mode)
