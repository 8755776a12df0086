"""Stopping a multi-process run with a signal: each process in the chain passes it on once.

`kiln train --nproc-per-node N` is three levels of processes: the kiln launcher, torchrun's agent
(`kiln.distributed.agent`) and the ranks. A stop signal (SIGINT from Ctrl-C, SIGTERM from a
scheduler: Slurm ends every job that way, SIGHUP from a closed terminal or SSH session) must reach
every rank exactly as a request, so each saves its part of a checkpoint at the next step all ranks
agree on and exits 0 (`kiln.checkpoint.signals.StopOnSignal`). torchrun runs each rank in a session
of its own, so a terminal's Ctrl-C reaches the launcher only, and the launcher runs the agent in a
session of its own too: each level receives the signal once, from the level above, and
`SignalRelay` passes it on to the level below instead of ending its process.

A scheduler may signal every process of the job itself, and the level above passes it on as well:
the same signal arriving again within `REPEAT_WINDOW_S` is one request delivered twice, not the
user insisting, so it is not passed on again (a repeat after that is: a second Ctrl-C means
"stop now" to the ranks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("kiln.distributed")

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
REPEAT_WINDOW_S = 1.0
"""The same signal again within this many seconds is the same request delivered twice."""


def is_repeat(signum: int, last: tuple[int, float] | None, now: float | None = None) -> bool:
    """Whether `signum` at `now` repeats `last` ((signal, monotonic time) of the previous one)."""
    if last is None or last[0] != signum:
        return False
    return (time.monotonic() if now is None else now) - last[1] < REPEAT_WINDOW_S


class SignalRelay:
    """While active (a context manager, main thread only), SIGINT, SIGTERM and SIGHUP call
    `forward(signum)` instead of ending this process; repeats within REPEAT_WINDOW_S are dropped.
    `received` names the signals passed on, in order; `last` is the latest one's number. `forward`
    may be replaced while active (once the processes to pass signals to exist)."""

    def __init__(self, forward: Callable[[int], None], signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.forward = forward
        self.signals = signals
        self.received: list[str] = []
        self.last: int | None = None
        self._last: tuple[int, float] | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over the signals (again: torchrun's agent installs its own handlers when it starts
        the ranks, and this replaces them)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works in the main thread only
        for sig in self.signals:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> SignalRelay:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if is_repeat(signum, self._last, now):
            return
        self._last = (signum, now)
        self.received.append(signal.Signals(signum).name)
        self.last = signum
        self.forward(signum)

    @property
    def first(self) -> str | None:
        """The first signal passed on (the stop request), or None."""
        return self.received[0] if self.received else None


def signal_group(pid: int, signum: int) -> None:
    """Send `signum` to the process group `pid` leads (a process started in a session of its own,
    and what it started); nothing if it has ended."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
