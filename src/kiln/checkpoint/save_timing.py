"""How long checkpoint saves take, and word while a long one runs.

Each save records three times: `stall_s`, how long the training loop was held in `save()` (a
blocking save: all of it; an async one: waiting for the previous save, then staging the state in
host memory), `wait_s`, the part of it spent waiting for the previous save to complete (saves
closer together than one save takes), and `total_s`, from its start to the checkpoint being
complete on disk. The newest finished save's figures go into the next metrics record, all of
them into summary.json.

A save that takes long (an 8B model's end-of-run checkpoint) logs a line every
`PROGRESS_EVERY_S` seconds on rank 0 with the bytes written so far, so a run past its last step
is visibly writing, not hung.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

log = logging.getLogger("kiln.checkpoint")

PROGRESS_EVERY_S = 30.0
"""Seconds between the progress lines of a save still running."""
KEPT = 50
"""The newest saves summary.json lists one by one (all count in its totals)."""


class SaveTimes:
    """Per-save stall and total times of one run's checkpoints (every rank its own)."""

    def __init__(self) -> None:
        self.saves: list[dict] = []
        self.prepare_s: float | None = None  # staging the state once before the first async save
        self._reported = 0  # saves whose figures went into a metrics record
        self._lock = threading.Lock()  # an async save completes in DCP's thread

    def begin(self, step: int, *, asynchronous: bool, final: bool) -> dict:
        entry = {"step": step, "async": asynchronous, "final": final, "stall_s": None, "wait_s": None, "total_s": None}
        with self._lock:
            self.saves.append(entry)
        return entry

    @staticmethod
    def waited(entry: dict, seconds: float) -> None:
        entry["wait_s"] = round(seconds, 4)

    @staticmethod
    def stalled(entry: dict, seconds: float) -> None:
        entry["stall_s"] = round(seconds, 4)

    def done(self, entry: dict, seconds: float) -> None:
        with self._lock:
            entry["total_s"] = round(seconds, 4)

    def fresh(self) -> dict[str, float]:
        """The newest completed save not yet reported, as metrics keys (empty when none)."""
        with self._lock:
            finished = [i for i, e in enumerate(self.saves) if e["total_s"] is not None]
            if not finished or finished[-1] < self._reported:
                return {}
            self._reported = finished[-1] + 1
            entry = self.saves[finished[-1]]
        return {"ckpt_step": entry["step"], "ckpt_stall_s": entry["stall_s"], "ckpt_total_s": entry["total_s"]}

    def summary(self) -> dict | None:
        """For summary.json: counts, the worst stall and total, the newest saves one by one."""
        with self._lock:
            saves = [dict(e) for e in self.saves]
        if not saves and self.prepare_s is None:
            return None
        stalls = [e["stall_s"] for e in saves if e["stall_s"] is not None]
        totals = [e["total_s"] for e in saves if e["total_s"] is not None]
        return {"count": len(saves), "stall_s_max": max(stalls, default=None),
                "stall_s_sum": round(sum(stalls), 4), "total_s_max": max(totals, default=None),
                "prepare_s": self.prepare_s, "saves": saves[-KEPT:]}


def _bytes_under(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for file in path.rglob("*"):
            with contextlib.suppress(OSError):
                if file.is_file():
                    total += file.stat().st_size
    return total


@contextlib.contextmanager
def save_progress(tmp: Path, step: int, *, enabled: bool, every_s: float | None = None,
                  since: float | None = None) -> Iterator[None]:
    """While the body runs (a save, or the wait for an async one), log every `every_s` seconds
    (PROGRESS_EVERY_S) how long the save of `step` into `tmp` has run (since the perf_counter
    `since`, else the body's start) and how much it wrote; nothing when the body ends sooner."""
    if not enabled:
        yield
        return
    period = PROGRESS_EVERY_S if every_s is None else every_s
    stop = threading.Event()
    started = time.perf_counter() if since is None else since

    def report() -> None:
        while not stop.wait(period):
            log.info("checkpoint step %d: still saving after %.0f s, %.2f GiB in %s so far", step,
                     time.perf_counter() - started, _bytes_under(tmp) / 2**30, tmp)

    thread = threading.Thread(target=report, name="kiln-ckpt-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def pinned_stager():
    """DCP's stager for async saves with page-locked host buffers (fast device-to-host copies),
    on CUDA; None (DCP's default copy) elsewhere or on a torch without it. Its owner closes it."""
    if not torch.cuda.is_available():
        return None
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        return DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False, use_async_staging=False,
                                            use_non_blocking_copy=True))
    except (ImportError, TypeError):  # an older torch's staging API
        return None


@functools.cache
def stager_reusable() -> bool:
    """Whether DCP's DefaultStager stages more than once. torch 2.11's closes its copier after each
    stage (pytorch/pytorch#183413, fixed by #183424), so a second async save through the same
    stager fails with `KeyError: <class 'type'>`; found by staging a one-element state twice on
    the CPU (milliseconds, once per process)."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                              use_async_staging=False, use_non_blocking_copy=False))
    except (ImportError, TypeError):
        return False
    try:
        for _ in range(2):
            stager.stage({"x": torch.zeros(1)})
        return True
    except KeyError:
        return False
    finally:
        stager.close()


class _KeptOpen:
    """DCP's StateDictStager behind a close() that does nothing: torch 2.11's DefaultStager closes
    it after every stage (pytorch/pytorch#183413), which drops its cache of page-locked copies, so
    each save would pin its whole state again (seconds per GiB). PinnedStaging closes `inner`."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def stage(self, state_dict, non_blocking: bool = False):
        return self.inner.stage(state_dict, non_blocking=non_blocking)

    def close(self) -> None:
        """Called by DefaultStager after each stage: ignored (the cache is kept for the next save)."""


def keep_open(stager) -> _KeptOpen | None:
    """Put `stager`'s (a DefaultStager's) StateDictStager behind _KeptOpen; None, and `stager`
    unchanged, when this torch's DefaultStager has no such part."""
    inner = getattr(stager, "_state_dict_stager", None)
    if inner is None or not callable(getattr(inner, "stage", None)) or not callable(getattr(inner, "close", None)):
        return None
    stager._state_dict_stager = kept = _KeptOpen(inner)
    return kept


class PinnedStaging:
    """The `async_stager` of a run's async saves, made at the first save and kept, so its
    page-locked buffers are allocated and pinned once. Where DCP's stager stages only once
    (`stager_reusable`), its copier is kept open across saves (`keep_open`); where even that is not
    possible, each save gets a fresh stager and the previous one is closed."""

    def __init__(self, reusable: Callable[[], bool] = stager_reusable) -> None:
        self._stager, self._made, self._reusable = None, False, reusable
        self._kept: _KeptOpen | None = None
        self._fresh_each = False

    def kwargs(self) -> dict:
        if self._made and self._fresh_each:
            self.close()
        if not self._made:
            self._stager, self._made = pinned_stager(), True
            if self._stager is not None and not self._reusable():
                self._kept = keep_open(self._stager)
                self._fresh_each = self._kept is None
        return {"async_stager": self._stager} if self._stager is not None else {}

    def prepare(self, state: dict) -> float | None:
        """Stage `state` once and drop the copy, so the stager's page-locked host buffers exist
        before the first save: pinning tens of GB takes seconds, later copies into the same buffers
        a fraction of that. Returns the seconds; None, staging nothing, without a stager that keeps
        its buffers (on the CPU, or with a fresh stager per save)."""
        stager = self.kwargs().get("async_stager")
        if stager is None or self._fresh_each:
            return None
        started = time.perf_counter()
        stager.stage(state)
        return round(time.perf_counter() - started, 4)

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()  # frees its page-locked buffers
        if self._kept is not None:
            self._kept.inner.close()
        self._stager, self._made, self._kept = None, False, None
