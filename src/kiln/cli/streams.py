"""Console output that can never stop the work: a closed pipe or terminal ends the writing only.

`kiln train ... | head` closes the pipe after a few lines; an SSH session that ends takes the
terminal with it. Python then raises BrokenPipeError (EPIPE) or OSError EIO from the next `print`,
which would end a training run that had nothing wrong with it. While `guarded_output()` is active,
sys.stdout and sys.stderr are wrapped: the first such error on a stream marks it closed, points its
file descriptor at /dev/null (so the interpreter's final flush and native writes succeed, as the
Python docs advise for SIGPIPE) and every later write to it is dropped. The run's files
(metrics.jsonl, summary.json, error logs) keep everything; stderr gets one note (if it still can).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

CLOSED_ERRNOS = (errno.EPIPE, errno.EIO)
"""A reader that went away (a pipe's) or a terminal that hung up."""


def is_closed_stream_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in CLOSED_ERRNOS


class GuardedStream:
    """A text stream whose writes stop, silently, once its reader is gone (see the module docstring).
    Everything else (isatty, fileno, encoding, ...) is the wrapped stream's."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name
        self.closed_reader = False

    def write(self, text: str) -> int:
        if not self.closed_reader:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if not is_closed_stream_error(exc):
                    raise
                self._reader_gone(exc)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed_reader:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            if not is_closed_stream_error(exc):
                raise
            self._reader_gone(exc)

    def _reader_gone(self, exc: OSError) -> None:
        self.closed_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file (a test's capture)
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        logging.getLogger("kiln").warning("%s is closed (%s): no more output there; the work goes on and the run's "
                                          "files keep everything", self._name, os.strerror(exc.errno or 0))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """sys.stdout and sys.stderr wrapped in GuardedStream while active; the originals after."""
    saved = sys.stdout, sys.stderr
    sys.stdout = GuardedStream(saved[0], "stdout") if saved[0] is not None else None
    sys.stderr = GuardedStream(saved[1], "stderr") if saved[1] is not None else None
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
