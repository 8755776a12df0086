"""The one timing helper (docs/architecture.md#one-timing-helper): warm up, synchronize, median of many, interleave.

Every kiln figure goes through here, so a benchmark and a training run time things the same way.
Device work is asynchronous: each sample is bracketed by a device synchronize, and samples of
the sides of a comparison alternate, so drift (clocks, thermals, other tenants) hits both alike.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is None and torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    def quantile_s(self, q: float) -> float:
        ordered = sorted(self.samples_s)
        k = (len(ordered) - 1) * q
        lo = int(k)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    def as_dict(self, per: int = 1) -> dict[str, float]:
        """Milliseconds per call (`per` calls in each sample)."""
        scale = 1e3 / per
        return {
            "median_ms": self.median_s * scale,
            "p10_ms": self.quantile_s(0.1) * scale,
            "p90_ms": self.quantile_s(0.9) * scale,
            "samples": len(self.samples_s),
        }


@contextlib.contextmanager
def side_stream(device: torch.device) -> Iterator[None]:
    """Run the block on a fresh side stream ordered after the current stream's work and before what
    follows it: the warm-up before a CUDA-graph capture (lazy initialisation of compiled code,
    cuBLAS and Triton state must not happen during capture). On a non-CUDA device, in place."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


def cuda_graph_of(fn: Callable[[], object], calls: int, *, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """`calls` back-to-back calls of `fn` captured as one CUDA graph, after `warmup` calls on a side
    stream (lazy initialisation must not happen during capture). The graph does not keep `fn`'s
    tensors alive: the caller must, or replays read freed memory."""
    with side_stream(torch.device("cuda", torch.cuda.current_device())):
        for _ in range(warmup):
            fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def replay_rounds(graphs: dict, repeats: int) -> dict:
    """Milliseconds of each CUDA graph's replay in each of `repeats` rounds, the graphs interleaved
    (the order reversed every other round, so neither side always runs first): {key: [ms, ...]}."""
    times = {key: [] for key in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(repeats):
        for key in (list(graphs) if r % 2 == 0 else list(reversed(graphs))):
            start.record()
            graphs[key].replay()
            end.record()
            end.synchronize()
            times[key].append(start.elapsed_time(end))
    return times


def time_calls(fn: Callable[[], object], *, calls: int, device: torch.device | str | None) -> float:
    """Seconds for `calls` back-to-back calls, synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return time.perf_counter() - start


def time_each(fn: Callable[[], object], n: int, *, device: torch.device | str | None,
              after: Callable[[int], object] | None = None) -> list[float]:
    """Seconds of each of `n` calls, each synchronized; `after(i)` runs untimed after call i (e.g.
    to read a result before the next call overwrites it: CUDA-graph outputs are reused)."""
    out = []
    for i in range(n):
        out.append(time_calls(fn, calls=1, device=device))
        if after is not None:
            after(i)
    return out


def measure(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 20, calls_per_sample: int = 1,
            device: torch.device | str | None = None) -> Timing:
    for _ in range(warmup):
        fn()
    return Timing(tuple(time_calls(fn, calls=calls_per_sample, device=device) for _ in range(repeats)))


def measure_interleaved(fns: dict[str, Callable[[], object]], *, warmup: int = 3, repeats: int = 20,
                        calls_per_sample: int = 1, device: torch.device | str | None = None) -> dict[str, Timing]:
    """Time several functions round-robin: sample i of each is taken back to back."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(time_calls(fn, calls=calls_per_sample, device=device))
    return {name: Timing(tuple(vals)) for name, vals in samples.items()}


class StepClock:
    """Timestamps of the steps inside one call without a host sync per step: CUDA events on a GPU
    (recorded in stream order, read after one synchronize), `perf_counter` elsewhere (where every
    step has finished when it returns). `start()`, then `mark()` after each step, then `marks_s()`."""

    def __init__(self, device: torch.device | str | None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._cuda = self.device.type == "cuda"
        self._start = None
        self._marks: list = []

    def _now(self):
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._marks = []
        self._start = self._now()

    def mark(self) -> None:
        self._marks.append(self._now())

    def marks_s(self) -> list[float]:
        """Seconds from `start()` to each mark (synchronizes the device once)."""
        if self._start is None:
            raise RuntimeError("StepClock.marks_s() before start()")
        if self._cuda:
            synchronize(self.device)
            return [self._start.elapsed_time(m) / 1e3 for m in self._marks]
        return [m - self._start for m in self._marks]
