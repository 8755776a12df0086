"""SIGTERM / SIGINT / SIGHUP as a request to stop at the next step boundary (save, then exit cleanly).

A signal can arrive in the middle of a step, a collective or a checkpoint write; acting there would
leave state half-updated. The handler only records the request; the trainer polls
`stop_requested()` between steps. SIGHUP (the terminal or SSH session closed) is a stop like
SIGTERM. A second signal of the same kind means "now": SIGINT raises KeyboardInterrupt, SIGTERM
and SIGHUP exit with 128 + the signal number — the user or the scheduler insisted. The same
signal again within `REPEAT_WINDOW_S` is not a second one: a scheduler signals every process of a
job and the launcher passes the signal on too (kiln.distributed.signal_relay).

Python runs signal handlers in the main thread only, and `signal.signal` may only be called from
it (Python docs, "signal — Set handlers for asynchronous events"); elsewhere this is a no-op.
`stopped_line` says what a stop kept of a job of several processes: the checkpoint the same
command continues from.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from kiln.checkpoint.storage import newest_intact
from kiln.distributed.signal_relay import STOP_SIGNALS, is_repeat

log = logging.getLogger("kiln.checkpoint")

DEFAULT_SIGNALS = STOP_SIGNALS  # SIGINT, SIGTERM and (where it exists) SIGHUP


class SignalExit(SystemExit):
    """The SystemExit a second SIGTERM raises (exit code 128 + signal): the user or the scheduler
    insisted. Told apart from a SystemExit that user code raised (which kiln reports as an error)."""


def interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SignalExit behind `exc`: itself, a cause, or one that DCP wrapped
    into its CheckpointException (a second Ctrl-C arriving in the middle of a save)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (KeyboardInterrupt, SignalExit)):
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return None


class StopOnSignal:
    """Context manager: while active, SIGTERM/SIGINT/SIGHUP set a flag instead of ending the process."""

    def __init__(self, signals: tuple[int, ...] = DEFAULT_SIGNALS, when: str = "after this step") -> None:
        self.signals = signals
        self.when = when
        """When the stop happens, for the message: a job of several ranks agrees on it at log steps."""
        self.received: int | None = None
        self._last: tuple[int, float] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is not threading.main_thread():
            log.debug("not the main thread: SIGTERM/SIGINT keep their handlers")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if is_repeat(signum, self._last, now):
            return  # one request delivered twice
        self._last = (signum, now)
        if self.received == signum:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SignalExit(128 + signum)
        self.received = signum
        log.warning("%s received: stopping %s (a checkpoint is saved first); send it again to stop at once",
                    signal.Signals(signum).name, self.when)

    def stop_requested(self) -> bool:
        """True once a signal arrived (this process only; see `any_rank` to agree across ranks)."""
        return self.received is not None

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None


def any_rank(flag: bool, group=None) -> bool:
    """True on every rank when `flag` is True on any rank; call it on all ranks at the same steps.

    torchrun forwards SIGTERM to every worker, but a signal sent to one rank only (`kill PID`)
    must still stop all of them together: a rank that stops while the others enter the next
    step's collectives would hang them. On a group with a CPU backend (gloo) the vote is a CPU
    round trip; on NCCL it reads a device value, so call it where the trainer syncs anyway (log
    intervals). With no process group it returns `flag`.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    backend = str(dist.get_backend(group))  # "gloo", "nccl" or "cpu:gloo,cuda:nccl"
    device = "cpu" if "gloo" in backend else "cuda"
    vote = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=group)
    return bool(vote.item())


def stopped_line(signal_name: str, summary: dict | None, run_dir: Path, command: str, *, saved: bool = True) -> str:
    """What a stop signal did to a multi-process run: which checkpoint is kept, how to continue.
    `saved`: the ranks stopped as asked (each saved its part of a checkpoint at the step they agreed on)."""
    if saved and summary is not None and summary.get("status") != "stopped":  # it came as the run ended
        return f"kiln: {signal_name} arrived as the run ended; nothing to continue"
    # The ranks have just written it (and checksummed it): sizes, not a second read of every byte.
    newest = newest_intact(run_dir / "checkpoints", hashes=False)
    if saved and newest is not None:
        return (f"kiln: stopped by {signal_name}: every rank saved its part of checkpoint {newest}; "
                f"the same command continues the run, as does: {command}")
    if newest is None:
        return (f"kiln: stopped by {signal_name} before any checkpoint of this run was saved; the same command "
                "starts it again")
    return (f"kiln: stopped by {signal_name} before the ranks saved; the newest complete checkpoint is {newest}: "
            f"the same command continues from there, as does: {command}")
