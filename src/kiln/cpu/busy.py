"""How busy the machine is with other work, and how many intra-op threads still pay.

PyTorch's intra-op pool splits each op into one chunk per thread and waits for the last chunk.
When other processes keep cores busy, some of those threads wait for a core, and every op waits
for them: on a loaded machine one thread too many can make a step many times slower, not a little.
So the thread count must leave out the cores that other work occupies.

Other work is read two ways, and the smaller counts: the 1-minute load average (minus this
process) and the threads runnable right now (/proc/loadavg's 4th field, minus this process's
own). A machine that was busy a minute ago but is quiet now (the previous run just ended) is not
counted as busy, nor is a momentary burst that the average does not confirm.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

BUSY_SHARE = 0.5
"""Other work counts as occupying a core once it keeps more than this share of one busy."""


@dataclass(frozen=True)
class LoadReading:
    """One reading of the machine's load (injected in tests)."""

    load1: float
    """1-minute load average (runnable + uninterruptible threads, averaged)."""
    runnable: int
    """Threads runnable at the moment of the reading, machine-wide."""
    own_runnable: int = 1
    """Of those, this process's own (the reading thread at least)."""
    cores: int = 1
    """Logical CPUs this process may run on."""

    @property
    def others(self) -> float:
        """Cores' worth of other processes' work: the smaller of the two readings, this process's
        own part taken out."""
        return max(0.0, min(self.load1 - self.own_runnable, float(self.runnable - self.own_runnable)))

    @property
    def busy_cores(self) -> int:
        """Whole cores taken by other work (a core counts once more than BUSY_SHARE of it is busy)."""
        return min(self.cores, math.floor(self.others + (1 - BUSY_SHARE)))

    def describe(self) -> str:
        return (f"load average {self.load1:.2f} and {self.runnable} runnable threads on {self.cores} "
                f"CPU{'s' if self.cores != 1 else ''}: other processes keep about {self.others:.1f} busy")


def free_cores(reading: LoadReading, cores: int | None = None) -> int:
    """Of `cores` (default: the reading's logical CPUs; kiln passes its physical cores), those
    other work leaves free, at least one."""
    return max(1, (reading.cores if cores is None else cores) - reading.busy_cores)


def oversubscribed(threads: int, reading: LoadReading, cores: int | None = None) -> bool:
    """`threads` intra-op threads plus the other work need more cores than there are."""
    return threads > free_cores(reading, cores)


def threads_under_load(threads: int, reading: LoadReading, cores: int | None = None) -> int:
    """The thread count to use: `threads`, reduced to the cores other work leaves free."""
    return max(1, min(threads, free_cores(reading, cores)))


def own_runnable_threads(pid: int | None = None) -> int:
    """This process's threads in state R (running or runnable), from /proc; 1 where unreadable."""
    base = f"/proc/{pid or os.getpid()}/task"
    count = 0
    try:
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/stat", encoding="ascii") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            count += state == "R"
    except OSError:
        return 1
    return max(1, count)


def read_load() -> LoadReading | None:
    """The machine's load now, or None where the OS does not say (no /proc/loadavg, no getloadavg)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            fields = f.read().split()
        load1, runnable = float(fields[0]), int(fields[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return LoadReading(load1=load1, runnable=runnable, own_runnable=own_runnable_threads(), cores=cores)
