"""`kiln serve`'s Prometheus metrics: queue depth, running batch, TTFT and inter-token latency
histograms, generated tokens (a counter and a recent tokens/s gauge), requests by outcome, the
scheduler's host time per iteration, and each decode step's device time and the device's idle time
before it (on CUDA): a gap between tokens is the step, plus the prefills run between two steps,
plus the idle time the host left.

The scheduler thread records, `/metrics` reads; one lock keeps a scrape consistent. The text format
is written here (Prometheus text exposition 0.0.4: a histogram is cumulative `_bucket{le=...}`
samples, `_sum` and `_count`), as kiln.monitor.prometheus does for training without the client.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

from kiln.monitor.prometheus import CONTENT_TYPE

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HOST_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
"""Bounds of the scheduler's host time per iteration: tens of microseconds to a decode step."""
STEP_BUCKETS_S = (2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3, 3.5e-3, 4e-3, 5e-3, 7.5e-3, 1e-2, 2.5e-2, 0.1)
"""Bounds of a decode step's device time: fine around the milliseconds a step takes."""
RATE_WINDOW_S = 10.0
"""Span of the `tokens_per_second` gauge."""
__all__ = ["CONTENT_TYPE", "Histogram", "ServeMetrics"]


class Histogram:
    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return [*out, f"{name}_sum {self.sum!r}", f"{name}_count {running}"]


class ServeMetrics:
    def __init__(self, model: str, clock=time.monotonic):
        self.model = model
        self.clock = clock
        self.lock = threading.Lock()
        self.ttft = Histogram()
        self.itl = Histogram()
        self.host = Histogram(HOST_BUCKETS_S)
        self.step = Histogram(STEP_BUCKETS_S)
        self.idle = Histogram(HOST_BUCKETS_S)
        self.queue_depth = 0
        self.running = 0
        self.tokens = 0
        self.prompt_tokens = 0
        self.requests: dict[str, int] = {}
        self.rejected = 0
        self.warmup_s = 0.0
        """Seconds compiling the decode and prefill variants before the server bound its port."""
        self._recent: deque[tuple[float, int]] = deque()

    def set_load(self, queued: int, running: int) -> None:
        with self.lock:
            self.queue_depth, self.running = queued, running

    def first_token(self, seconds: float, prompt_tokens: int) -> None:
        with self.lock:
            self.ttft.observe(seconds)
            self.prompt_tokens += prompt_tokens

    def gaps(self, seconds: list[float]) -> None:
        with self.lock:
            for s in seconds:
                self.itl.observe(s)

    def host_time(self, seconds: float) -> None:
        with self.lock:
            self.host.observe(seconds)

    def decode_step(self, device_s: float, idle_s: float | None) -> None:
        """A decode step's device time and the device's idle time before it (None: unknown)."""
        with self.lock:
            self.step.observe(device_s)
            if idle_s is not None:
                self.idle.observe(idle_s)

    def generated(self, n: int) -> None:
        now = self.clock()
        with self.lock:
            self.tokens += n
            self._recent.append((now, n))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()

    def finished(self, reason: str) -> None:
        with self.lock:
            self.requests[reason] = self.requests.get(reason, 0) + 1

    def warmed(self, seconds: float) -> None:
        with self.lock:
            self.warmup_s = seconds

    def refused(self) -> None:
        with self.lock:
            self.rejected += 1

    def tokens_per_second(self) -> float:
        now = self.clock()
        recent = [(t, n) for t, n in self._recent if t >= now - RATE_WINDOW_S]
        return sum(n for _, n in recent) / RATE_WINDOW_S

    def text(self) -> str:
        """The exposition text of every metric."""
        with self.lock:
            lines = [
                "# HELP kiln_serve_queue_depth Requests waiting for a KV-cache row.",
                "# TYPE kiln_serve_queue_depth gauge", f"kiln_serve_queue_depth {self.queue_depth}",
                "# HELP kiln_serve_running Requests decoding in the running batch.",
                "# TYPE kiln_serve_running gauge", f"kiln_serve_running {self.running}",
                "# HELP kiln_serve_tokens_per_second Generated tokens per second over the last 10 s.",
                "# TYPE kiln_serve_tokens_per_second gauge",
                f"kiln_serve_tokens_per_second {self.tokens_per_second()!r}",
                "# HELP kiln_serve_generated_tokens_total Tokens generated.",
                "# TYPE kiln_serve_generated_tokens_total counter", f"kiln_serve_generated_tokens_total {self.tokens}",
                "# HELP kiln_serve_prompt_tokens_total Prompt tokens prefilled.",
                "# TYPE kiln_serve_prompt_tokens_total counter",
                f"kiln_serve_prompt_tokens_total {self.prompt_tokens}",
                "# HELP kiln_serve_rejected_total Requests refused with 429 (queue full).",
                "# TYPE kiln_serve_rejected_total counter", f"kiln_serve_rejected_total {self.rejected}",
                "# HELP kiln_serve_warmup_seconds Seconds compiling every decode and prefill variant before "
                "binding (0: --no-warmup).",
                "# TYPE kiln_serve_warmup_seconds gauge", f"kiln_serve_warmup_seconds {self.warmup_s!r}",
                "# HELP kiln_serve_requests_total Finished requests by finish reason.",
                "# TYPE kiln_serve_requests_total counter",
                *(f'kiln_serve_requests_total{{reason="{r}"}} {n}' for r, n in sorted(self.requests.items())),
                "# HELP kiln_serve_ttft_seconds Time from request arrival to its first token.",
                "# TYPE kiln_serve_ttft_seconds histogram", *self.ttft.lines("kiln_serve_ttft_seconds"),
                "# HELP kiln_serve_inter_token_seconds Time between consecutive tokens of a request.",
                "# TYPE kiln_serve_inter_token_seconds histogram",
                *self.itl.lines("kiln_serve_inter_token_seconds"),
                "# HELP kiln_serve_iteration_host_seconds Scheduler host time per iteration, the rows' calls "
                "(prefill, decode launch, the wait for the step) excluded.",
                "# TYPE kiln_serve_iteration_host_seconds histogram",
                *self.host.lines("kiln_serve_iteration_host_seconds"),
                "# HELP kiln_serve_decode_step_device_seconds Device time of a decode step (CUDA events).",
                "# TYPE kiln_serve_decode_step_device_seconds histogram",
                *self.step.lines("kiln_serve_decode_step_device_seconds"),
                "# HELP kiln_serve_device_idle_before_step_seconds Device idle time before a decode step: from "
                "the end of the work before it (a step, a join's prefill) to its start, the host's lateness.",
                "# TYPE kiln_serve_device_idle_before_step_seconds histogram",
                *self.idle.lines("kiln_serve_device_idle_before_step_seconds"),
            ]
        return "\n".join(lines) + "\n"
