"""Naming the rank that holds a synchronous job back.

In data-parallel training every rank's wall-clock step time is the same: the fast ranks wait in
the gradient collectives for the slowest. What differs is each rank's *own* time per step, the
step time minus the time it was blocked in collectives (kiln.distributed.sync_timing). A rank is
slow in an interval when that exceeds the median of the other ranks by more than `margin`
(the others' median, so that two ranks compare with each other); after `intervals` slow log
intervals in a row it is named, in a warning and in the metric record, until it recovers.
"""

from __future__ import annotations

import logging
import math
import statistics

log = logging.getLogger("kiln.monitor")


class StragglerDetector:
    def __init__(self, margin: float, intervals: int) -> None:
        self.margin = margin
        self.intervals = intervals
        self._streak: dict[int, int] = {}
        self.named: list[int] = []
        self.ever: set[int] = set()

    def update(self, step: int, own_ms: list[float]) -> list[int]:
        """Feed one log interval's per-rank own time per step; returns the ranks named now."""
        for rank, value in enumerate(own_ms):
            others = [v for i, v in enumerate(own_ms) if i != rank and math.isfinite(v)]
            slow = bool(others) and math.isfinite(value) and value > statistics.median(others) * (1 + self.margin)
            self._streak[rank] = self._streak.get(rank, 0) + 1 if slow else 0
        named = sorted(r for r, n in self._streak.items() if n >= self.intervals)
        for rank in named:
            if rank not in self.named:
                others = [v for i, v in enumerate(own_ms) if i != rank and math.isfinite(v)]
                median = statistics.median(others)
                log.warning(
                    "straggler: rank %d spends %.2f ms/step of its own (step time minus waits in collectives) "
                    "vs a median of %.2f ms on the other ranks (+%.0f%%) for %d log intervals in a row, at step %d",
                    rank, own_ms[rank], median, 100 * (own_ms[rank] / median - 1), self._streak[rank], step)
        for rank in self.named:
            if rank not in named:
                log.info("straggler: rank %d is back within %.0f%% of the others at step %d",
                         rank, 100 * self.margin, step)
        self.named = named
        self.ever.update(named)
        return named
