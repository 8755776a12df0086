"""The continuous-batching loop: one thread owns the rows (kiln.serve.rows) and, per iteration,
drops cancelled requests, admits waiting ones (prefill, up to `prefill_tokens` prompt tokens per
iteration so decoding is never starved by a burst of prompts; the first waiting request always
gets its turn; the head of the queue and the requests right behind it in the same prompt bucket
are prefilled in one forward), then runs one decode step for every running request and hands the
new tokens on.

Admission control: at most `rows + max_queue` requests are in the server; `submit` refuses more
(`QueueFull`, HTTP 429). The KV cache is allocated once, so load never costs memory. Requests are
admitted first come, first served. Tokens go to `sink` once per iteration, as a list of events,
from this thread (the HTTP layer moves them onto its event loop).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.llm.engine import bucket_length
from kiln.serve.metrics import ServeMetrics
from kiln.serve.rows import Rows, RowSettings

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The server holds `rows + max_queue` requests already."""


@dataclass(eq=False)
class Job:
    """One request as the scheduler sees it; `cancel` may be called from any thread."""

    prompt: list[int]
    max_tokens: int
    settings: RowSettings
    stop_tokens: frozenset[int] = frozenset()
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    finished: bool = False
    """Out of the scheduler (done, cancelled or failed)."""
    generated: int = 0
    last: float = 0.0

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(frozen=True)
class Event:
    job: Job
    token: int | None
    """None with an error."""
    finish: str | None = None
    """`stop` (a stop token), `length` (max_tokens), `error` (then `error` says what failed)."""
    error: str | None = None


class Scheduler:
    def __init__(self, rows: Rows, *, max_queue: int, prefill_tokens: int, sink: Callable[[list[Event]], None],
                 metrics: ServeMetrics, clock: Callable[[], float] = time.monotonic):
        self.rows, self.max_queue, self.prefill_tokens = rows, max_queue, prefill_tokens
        self.sink, self.metrics, self.clock = sink, metrics, clock
        self.waiting: deque[Job] = deque()
        self.running: dict[int, Job] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._pending = None
        """The decode step started last iteration and the jobs of its rows then, not yet read."""
        self._rows_s = 0.0
        """Seconds inside the rows' calls this iteration."""
        self._thread: threading.Thread | None = None

    # -- from other threads ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job`; QueueFull when the server is full."""
        with self._cond:
            held = len(self.waiting) + sum(not j.cancelled for j in list(self.running.values()))
            if self._stopping or held >= self.rows.rows + self.max_queue:
                self.metrics.refused()
                raise QueueFull
            self.waiting.append(job)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="kiln-serve-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop; requests still in it end with an error event."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def load(self) -> tuple[int, int]:
        return len(self.waiting), len(self.running)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.waiting and not self.running and self._pending is None:
                    self._cond.wait(0.5)
                if self._stopping:
                    break
            try:
                self.iterate()
            except Exception as exc:  # a device failure ends every request in flight, not the server
                log.exception("kiln serve: the decode loop failed")
                self._pending = None
                self._fail_all(f"the server's decode loop failed: {type(exc).__name__}: {exc}")
        self._fail_all("the server is shutting down")

    def iterate(self) -> None:
        """One scheduler iteration: cancellations, admissions, start a decode step, then hand on the
        tokens of the step started last time (the device computes while the host does this).
        Records the iteration's host time: its wall time less the time inside the rows' calls
        (prefill, shifts, the step's launch and the wait for it), so what the scheduler itself
        costs per step shows on /metrics; it must stay below a decode step or the device waits."""
        begun = self.clock()
        self._rows_s = 0.0
        events: list[Event] = []
        self._drop_cancelled()
        self._admit(events)
        started = self._on_rows(self.rows.launch) if self.running else None
        if started is None and self._pending is None:
            for row in list(self.running):  # at the rows' end (never, by admission): end them, not spin
                events.append(Event(self.running[row], None, "error", "the KV rows ran out of slots"))
                self._release(row, "error")
        if self._pending is not None:
            launched, jobs = self._pending
            tokens = self._on_rows(self.rows.collect, launched)
            if (times := self.rows.step_times(launched)) is not None:
                self.metrics.decode_step(*times)
            now = self.clock()
            gaps = []
            for row, job in jobs.items():
                if job.finished:  # ended (or cancelled) after this step was started: its token is spare
                    continue
                gaps.append(now - job.last)
                job.last = now
                events.append(self._advance(row, job, tokens[row]))
            self.metrics.gaps(gaps)
            self.metrics.generated(len(gaps))
        self._pending = (started, dict(self.running)) if started is not None else None
        self.metrics.set_load(*self.load)
        if events:
            self.sink(events)
        self.metrics.host_time(self.clock() - begun - self._rows_s)

    def _on_rows(self, call, *args):
        """`call(*args)`, its time counted as the rows' (device work and waits), not the host's."""
        start = self.clock()
        try:
            return call(*args)
        finally:
            self._rows_s += self.clock() - start

    def _advance(self, row: int, job: Job, token: int) -> Event:
        job.generated += 1
        finish = "stop" if token in job.stop_tokens else "length" if job.generated >= job.max_tokens else None
        if finish is not None:
            self._release(row, finish)
        return Event(job, token, finish)

    def _release(self, row: int, reason: str) -> None:
        self.rows.leave(row)
        job = self.running.pop(row, None)
        if job is not None:
            job.finished = True
        self.metrics.finished(reason)

    def _drop_cancelled(self) -> None:
        for row, job in list(self.running.items()):
            if job.cancelled:
                self._release(row, "cancelled")
        with self._cond:
            kept = [j for j in self.waiting if not j.cancelled]
            for _ in range(len(self.waiting) - len(kept)):
                self.metrics.finished("cancelled")
            self.waiting = deque(kept)

    def _admit(self, events: list[Event]) -> None:
        budget = self.prefill_tokens
        while True:
            with self._cond:
                group = self._group(budget)
            rows = self.rows.free_rows(len(group))
            group = group[:len(rows)]
            if not group:
                return
            if not self._on_rows(self.rows.place, max(len(j.prompt) for j in group), max(j.max_tokens for j in group)):
                if len(group) == 1 or not self._on_rows(self.rows.place, len(group[0].prompt), group[0].max_tokens):
                    return
                group = group[:1]
            with self._cond:
                for _ in group:
                    self.waiting.popleft()
            firsts = self._on_rows(self.rows.join_many, [(row, job.prompt, job.max_tokens, job.settings)
                                                         for row, job in zip(rows, group)])
            now = self.clock()
            for row, job, first in zip(rows, group, firsts):
                job.last = now
                self.metrics.first_token(now - job.arrived, len(job.prompt))
                self.metrics.generated(1)
                self.running[row] = job
                events.append(self._advance(row, job, first))
                budget -= len(job.prompt)

    def _group(self, budget: int) -> list[Job]:
        """The waiting requests prefilled together next: the head of the queue (if `budget` prompt
        tokens are left for it, or none was prefilled yet this iteration) and those right behind it
        in its prompt bucket, while their prompts fit `budget`, their number a warmed batch size and
        the longest prompt with the longest answer a row."""
        if not self.waiting:
            return []
        head = self.waiting[0]
        if budget < len(head.prompt) and budget < self.prefill_tokens:
            return []
        bucket = bucket_length(len(head.prompt))
        most = max(k for k in self.rows.prefill_sizes(bucket) if k == 1 or k * bucket <= budget)
        group, used = [head], len(head.prompt)
        longest, answer = len(head.prompt), head.max_tokens
        for job in itertools.islice(self.waiting, 1, most):
            n = len(job.prompt)
            if bucket_length(n) != bucket or used + n > budget or \
                    max(longest, n) + max(answer, job.max_tokens) > self.rows.capacity:
                break
            group.append(job)
            used, longest, answer = used + n, max(longest, n), max(answer, job.max_tokens)
        return group

    def _fail_all(self, message: str) -> None:
        with self._cond:
            jobs = [*self.running.values(), *self.waiting]
            self.waiting.clear()
        for row in list(self.running):
            self._release(row, "error")
        for job in jobs:
            job.finished = True
        if jobs:
            self.sink([Event(j, None, "error", message) for j in jobs])
