"""The DDP comm-hook wrapper times only the last bucket, from hand-over to completion."""

from __future__ import annotations

import inspect

import torch

from kiln.distributed.sync_timing import SyncTimer


class Bucket:
    def __init__(self, last: bool) -> None:
        self._last = last

    def is_last(self) -> bool:
        return self._last


def test_last_bucket_is_timed_until_its_future_completes(monkeypatch):
    clock = iter([10.0, 10.25])
    monkeypatch.setattr("kiln.distributed.sync_timing.time.perf_counter", lambda: next(clock))
    timer = SyncTimer(torch.device("cpu"))
    futures = []

    def inner(state, bucket):
        fut = torch.futures.Future()
        futures.append(fut)
        return fut

    hook = timer.wrap(inner)
    assert timer.hooked
    first = hook(None, Bucket(False))
    assert first is futures[0]  # earlier buckets pass through untouched
    last = hook(None, Bucket(True))  # mark 10.0 when handed over
    futures[1].set_result(torch.ones(2))  # mark 10.25 when the collective completes
    assert torch.equal(last.wait(), torch.ones(2))  # the value DDP copies back is unchanged
    assert timer.collect_s() == 0.25
    assert timer.collect_s() == 0.0  # collected once


def test_hook_signature_has_no_annotations_ddp_would_reject():
    hook = SyncTimer(torch.device("cpu")).wrap(lambda state, bucket: None)
    params = inspect.signature(hook).parameters
    assert list(params) == ["state", "bucket"]
    assert all(p.annotation is inspect.Parameter.empty for p in params.values())
