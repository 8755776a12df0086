"""Messages from dependencies that are not the user's business: kept in a log file, off the console.

Importing transformers, timm or torchao prints deprecation warnings one library raises about
another (`torch.utils._pytree._register_pytree_node is deprecated`), torchao says it skipped its
C++ extensions (built for another torch or Python), and the profiler's native code prints
`USDT:` probe lines. None of it is something a kiln user can act on, and it buries kiln's own
output; all of it may still matter to someone debugging, so it is written, in full, to
`dependencies.log` in the command's output directory (or, for a command without one, a file in
the temp directory, named on stderr when the command ends and replaced by the next such command).

`is_noise` is the rule (pure, tested exactly); `install()` applies it to Python warnings and to
log records; `filtered_fds()` applies it to lines native code writes to stdout/stderr directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from kiln.safe_io import LinkRefused, append_text

LOG_NAME = "dependencies.log"

_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
_DEPENDENCY_DIRS = re.compile(r"[/\\](site|dist)-packages[/\\]")
# torch.utils._pytree: its deprecations name what another library registers (torchao's enums),
# written through torch's own log handler, not through warnings.
_DEPENDENCY_LOGGERS = ("torchao", "transformers", "timm", "torch.distributed.elastic", "huggingface_hub",
                       "torch.utils._pytree")
_NOISY_LOG_MESSAGES = re.compile(
    r"Skipping import of cpp extensions|Failed to load .*\.so|incompatible torch version"
    r"|is deprecated|will be removed in|Please use `torch\.utils\._pytree"
)
_NOISY_LINES = re.compile(r"^\s*USDT:")


def is_noise(text: str, *, category: type[Warning] | None = None, filename: str = "", logger: str = "") -> bool:
    """Whether a message is a dependency's business, not the user's:
    - a deprecation (Deprecation/PendingDeprecation/FutureWarning) raised from a file of an
      installed package (site-packages), i.e. one library about another's API, never about the
      user's code (whose warnings point at the user's file);
    - a record of a dependency's logger (torchao, transformers, ...) about its own extensions or
      deprecations;
    - a raw `USDT:` line (profiler probes)."""
    if category is not None:
        return issubclass(category, _DEPRECATIONS) and bool(_DEPENDENCY_DIRS.search(filename))
    if logger:
        ours = any(logger == name or logger.startswith(name + ".") for name in _DEPENDENCY_LOGGERS)
        return ours and bool(_NOISY_LOG_MESSAGES.search(text))
    return bool(_NOISY_LINES.match(text))


class NoiseLog:
    """The filtered messages: buffered until `attach(directory)`, then appended to its log file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self.path: Path | None = None
        self.count = 0

    def write(self, text: str) -> None:
        text = text if text.endswith("\n") else text + "\n"
        with self._lock:
            self.count += 1
            if self.path is None:
                self._pending.append(text)
                return
            try:
                append_text(self.path, text)
            except (OSError, LinkRefused):
                self._pending.append(text)

    def attach(self, directory: str | os.PathLike[str]) -> Path:
        """From now on write to `directory`/dependencies.log, starting with what was buffered."""
        path = Path(directory) / LOG_NAME
        with self._lock:
            self.path = path
            pending, self._pending = self._pending, []
        if pending:
            path.parent.mkdir(parents=True, exist_ok=True)
            append_text(path, "".join(pending))
        return path

    def detach(self) -> None:
        """Buffer again (the command that owned the directory is over)."""
        with self._lock:
            self.path = None
            self.count = 0

    def reset(self) -> None:
        """Start a command's log: forget what was buffered before it. In a CLI process nothing
        is (install() comes first); where kiln commands run one after another in one process
        (tests, notebooks), what ran in between is no command's business."""
        with self._lock:
            self.path = None
            self.count = 0
            self._pending = []

    def flush_unattached(self) -> Path | None:
        """Buffered messages of a command with no output directory go to one file per user in the
        temp directory, replaced by each such command (nothing piles up there)."""
        with self._lock:
            if self.path is not None:
                return None
            pending, self._pending = self._pending, []
        if not pending:
            return None
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        path = Path(tempfile.gettempdir()) / f"kiln-{uid}-{LOG_NAME}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)  # a shared dir: no symlinks
        try:
            with os.fdopen(os.open(path, flags, 0o600), "w", encoding="utf-8") as f:
                f.writelines(pending)
        except OSError:
            return None
        return path


NOISE = NoiseLog()
"""The process's filtered messages."""


class _RecordFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        if is_noise(message, logger=record.name):
            NOISE.write(f"{record.name} {record.levelname}: {message}")
            return False
        return True


_installed = False


def install() -> None:
    """Route dependency noise to NOISE: Python warnings (through warnings.showwarning) and log
    records reaching the root handlers or logging's last-resort handler. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if is_noise(str(message), category=category, filename=str(filename)):
            NOISE.write(warnings.formatwarning(message, category, filename, lineno, line).rstrip())
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    record_filter = _RecordFilter()
    for handler in [logging.lastResort, *logging.getLogger().handlers]:
        if handler is not None:
            handler.addFilter(record_filter)
    for name in _DEPENDENCY_LOGGERS:
        logger = logging.getLogger(name)
        logger.addFilter(record_filter)  # records logged at it, whichever handler (torch's) writes them
        for handler in logger.handlers:  # and its children's, through its own handlers (transformers')
            handler.addFilter(record_filter)


def keep(directory: str | os.PathLike[str] | None) -> Path | None:
    """At the end of a command: what was filtered goes to `directory`/dependencies.log, or, for a
    command without an output directory, to a temp file named on stderr. Returns the file."""
    count = NOISE.count
    if directory is not None and Path(directory).is_dir():
        path = NOISE.attach(directory)
        NOISE.detach()
        return path if count else None
    path = NOISE.flush_unattached()
    NOISE.detach()
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            print(f"kiln: {count} message(s) from dependencies kept in {path} (replaced by the next command)",
                  file=sys.stderr)
    return path


@contextlib.contextmanager
def filtered_fds(fds: tuple[int, ...] = (1, 2)) -> Iterator[None]:
    """Lines native code writes to these file descriptors pass through, except noise (USDT probe
    lines), which goes to NOISE. Python-level output is flushed first so the order holds."""
    saved: list[tuple[int, int, threading.Thread]] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        for fd in fds:
            try:
                original = os.dup(fd)
            except OSError:
                continue
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=_pump, args=(read_end, original), daemon=True, name=f"kiln-fd{fd}")
            thread.start()
            saved.append((fd, original, thread))
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, original, thread in saved:
            os.dup2(original, fd)  # closes the pipe's last write end: the pump sees EOF
            thread.join(timeout=5.0)
            os.close(original)


def _pump(read_end: int, out: int) -> None:
    """Copy lines from a pipe to `out`, diverting noise; ends at EOF."""
    with os.fdopen(read_end, "rb") as pipe:
        for raw in pipe:
            text = raw.decode("utf-8", "replace")
            if is_noise(text.rstrip("\n")):
                NOISE.write(text)
                continue
            with contextlib.suppress(OSError):
                os.write(out, raw)
