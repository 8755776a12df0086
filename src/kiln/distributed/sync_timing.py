"""How long a rank is blocked in gradient collectives, measured without a host sync per step.

DDP calls a communication hook for each gradient bucket as soon as its gradients are ready;
`GradBucket.is_last()` marks the last bucket of the backward pass, i.e. the moment this rank's
backward compute is done. kiln wraps the hook (the plain all-reduce or the bf16/fp16
compression hook) and, for that last bucket only, marks the time when it is handed over and the
time its all-reduce completes. The difference is the *exposed* communication of the step: waiting
for slower peers plus the transfer that backward could not hide. Earlier buckets overlap with
backward; their waits show up here only if they are still unfinished when the last one is.

Marks are CUDA events on the compute stream (the completion event is recorded in the future's
callback, whose stream waits on the collective: see `torch.futures.Future.then`), or host clock
readings on CPU (gloo runs the collective on its own threads and backward waits for it). Events
are read at log steps, after the meter synchronises the device anyway.

Not captured: FSDP2's all-gathers and reduce-scatters (no hook), DDP's buffer broadcasts,
communication overlapped with compute, steps replayed inside a captured CUDA graph, and
collectives of eval and of the non-finite guard. The meter adds the wait at the log-step
gather, which every strategy has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class SyncTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pairs: list[tuple[Any, Any]] = []
        self._free: list[torch.cuda.Event] = []
        self._lock = threading.Lock()  # gloo runs future callbacks on its own threads
        self.hooked = False  # set when a DDP hook feeds this timer

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wrap(self, inner: Callable[[Any, Any], torch.futures.Future]) -> Callable[[Any, Any], torch.futures.Future]:
        """A DDP comm hook that calls `inner(state, bucket)` and times the last bucket's wait."""
        self.hooked = True

        # No annotations: DDP checks them against its own types, and this module's are strings.
        def timed_hook(state, bucket):
            if not bucket.is_last() or (self.cuda and torch.cuda.is_current_stream_capturing()):
                return inner(state, bucket)
            start = self._mark()
            fut = inner(state, bucket)

            def done(f: torch.futures.Future) -> Any:
                end = self._mark()
                with self._lock:
                    self._pairs.append((start, end))
                return f.value()

            return fut.then(done)

        return timed_hook

    def collect_s(self) -> float:
        """Seconds blocked since the last call. CUDA: call after synchronising the device."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        if not self.cuda:
            return sum(end - start for start, end in pairs)
        total_ms = sum(start.elapsed_time(end) for start, end in pairs)
        for start, end in pairs:
            self._free += (start, end)
        return total_ms / 1e3
