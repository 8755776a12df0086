"""Each checkpoint save's stall on the training step and total time (kiln.checkpoint.save_timing),
recorded by the Checkpointer for blocking and async saves, and the progress line of a long save."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from kiln.checkpoint.save_timing import SaveTimes, save_progress

from .ckpt_helpers import checkpointer, make_run


def test_fresh_reports_the_newest_finished_save_once():
    times = SaveTimes()
    first = times.begin(2, asynchronous=True, final=False)
    times.stalled(first, 0.25)
    assert times.fresh() == {}  # still being written: nothing to report yet
    times.done(first, 3.5)
    assert times.fresh() == {"ckpt_step": 2, "ckpt_stall_s": 0.25, "ckpt_total_s": 3.5}
    assert times.fresh() == {}  # reported once
    second = times.begin(4, asynchronous=False, final=True)
    times.stalled(second, 2.0)
    times.done(second, 1.75)
    summary = times.summary()
    assert summary["count"] == 2 and summary["stall_s_max"] == 2.0 and summary["stall_s_sum"] == 2.25
    assert summary["total_s_max"] == 3.5
    assert [s["step"] for s in summary["saves"]] == [2, 4] and summary["saves"][1]["final"] is True
    assert SaveTimes().summary() is None


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_checkpointer_records_stall_and_total_per_save(tmp_path: Path, async_save: bool) -> None:
    run = make_run()
    ck = checkpointer(tmp_path, async_save=async_save)
    run.step()
    ck.save(1, run.app)
    run.step()
    ck.save(2, run.app, final=True)  # waits for the async one first; final saves block
    ck.close()
    saves = ck.times.summary()["saves"]
    assert [(s["step"], s["async"], s["final"]) for s in saves] == [(1, async_save, False), (2, False, True)]
    for save in saves:
        assert save["stall_s"] > 0 and save["total_s"] > 0
        assert 0 <= save["wait_s"] <= save["stall_s"]  # waiting for the previous save is part of the stall
    assert saves[1]["stall_s"] >= saves[1]["total_s"]  # a blocking save stalls the step for all of it
    assert ck.times.fresh()["ckpt_step"] == 2


def test_a_long_save_says_it_is_still_writing(tmp_path: Path, caplog) -> None:
    (tmp_path / "shard.distcp").write_bytes(b"x" * 4096)
    caplog.set_level(logging.INFO, logger="kiln.checkpoint")
    seen = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            seen.set()

    handler = Seen()
    logging.getLogger("kiln.checkpoint").addHandler(handler)
    try:
        with save_progress(tmp_path, 7, enabled=True, every_s=0.01):
            assert seen.wait(60)  # the body outlives one period: a line is written meanwhile
    finally:
        logging.getLogger("kiln.checkpoint").removeHandler(handler)
    lines = [r.getMessage() for r in caplog.records if "still saving" in r.getMessage()]
    assert lines and "checkpoint step 7" in lines[0] and str(tmp_path) in lines[0]


def test_a_quick_save_writes_no_progress_line(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kiln.checkpoint")
    with save_progress(tmp_path, 3, enabled=True, every_s=3600):
        time.sleep(0)
    with save_progress(tmp_path, 3, enabled=False, every_s=0.0):
        time.sleep(0.05)
    assert not [r for r in caplog.records if "still saving" in r.getMessage()]


class _Stager:
    """Stands in for DCP's DefaultStager: counts its closes."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("reusable", [True, False], ids=["kept", "fresh-per-save"])
def test_pinned_staging_keeps_a_reusable_stager_and_replaces_one_that_is_not(monkeypatch, reusable: bool):
    from kiln.checkpoint import save_timing

    made: list[_Stager] = []
    monkeypatch.setattr(save_timing, "pinned_stager", lambda: made.append(_Stager()) or made[-1])
    staging = save_timing.PinnedStaging(reusable=lambda: reusable)
    first = staging.kwargs()["async_stager"]
    second = staging.kwargs()["async_stager"]
    if reusable:  # one stager, one set of page-locked buffers, for every save
        assert second is first and first.closed == 0 and len(made) == 1
    else:  # the spent stager is closed before the next save gets its own
        assert second is not first and first.closed == 1 and second.closed == 0 and len(made) == 2
    staging.close()
    assert made[-1].closed == 1 and all(s.closed == 1 for s in made)


def test_stager_reusable_sees_a_stager_that_stages_only_once(monkeypatch):
    from torch.distributed.checkpoint import staging as dcp_staging

    from kiln.checkpoint import save_timing

    class Once:  # torch 2.11's DefaultStager: its copier is closed after the first stage
        def __init__(self, options) -> None:
            self.spent = False

        def stage(self, state):
            if self.spent:
                raise KeyError(type)
            self.spent = True
            return state

        def close(self) -> None:
            pass

    save_timing.stager_reusable.cache_clear()
    try:
        assert save_timing.stager_reusable() in (True, False)  # the installed torch, staged for real
        save_timing.stager_reusable.cache_clear()
        monkeypatch.setattr(dcp_staging, "DefaultStager", Once)
        assert save_timing.stager_reusable() is False
    finally:
        save_timing.stager_reusable.cache_clear()


def test_a_stager_that_closes_its_copier_after_each_stage_keeps_its_host_copies(monkeypatch):
    """torch 2.11's DefaultStager closes its StateDictStager after every stage, so a second save
    through it fails (or, made fresh, pins every byte again); PinnedStaging keeps the copier open and
    the second save copies into the first save's host buffers."""
    import torch
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from kiln.checkpoint import save_timing

    class Torch211Stager(DefaultStager):
        def stage(self, state_dict, **kwargs):
            staged = self._state_dict_stager.stage(state_dict, non_blocking=False)
            self._state_dict_stager.close()  # what torch 2.11 does after each stage
            return staged

    made: list[Torch211Stager] = []

    def make():
        made.append(Torch211Stager(StagingOptions(False, False, False, False)))
        return made[-1]

    monkeypatch.setattr(save_timing, "pinned_stager", make)
    staging = save_timing.PinnedStaging(reusable=lambda: False)
    weights = torch.arange(6.0)
    state = {"model": {"w": weights}, "step": 3}
    first = staging.kwargs()["async_stager"].stage(state)
    weights += 10  # training goes on after the first save
    second = staging.kwargs()["async_stager"].stage(state)
    assert len(made) == 1  # one stager for both saves
    assert torch.equal(second["model"]["w"], weights) and second["step"] == 3
    assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()  # the same host buffer, refilled
    inner = staging._kept.inner
    closed = []
    monkeypatch.setattr(inner, "close", lambda: closed.append(True))
    staging.close()
    assert closed == [True]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_prepare_async_stages_once_so_the_first_save_reuses_the_host_buffers(tmp_path: Path, monkeypatch):
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from kiln.checkpoint import save_timing

    run = make_run()
    run.step()
    assert checkpointer(tmp_path / "sync", interval=5).prepare_async(run.app) is None  # no async saves
    assert checkpointer(tmp_path / "end", async_save=True).prepare_async(run.app) is None  # only the final save
    assert checkpointer(tmp_path / "cpu", async_save=True, interval=5).prepare_async(run.app) is None  # no stager

    stager = DefaultStager(StagingOptions(False, False, False, False))  # the CUDA stager's CPU twin
    monkeypatch.setattr(save_timing, "pinned_stager", lambda: stager)
    ck = checkpointer(tmp_path / "run", async_save=True, interval=5)
    seconds = ck.prepare_async(run.app)
    assert seconds is not None and seconds >= 0
    copies = stager._state_dict_stager._cached_storage_mapping
    prepared = len(copies)
    assert prepared > 0  # the model's and optimizer's tensors have host copies now
    kept = {id(v) for v in copies.values()}
    run.step()
    ck.save(2, run.app)
    params = {id(copies[p.untyped_storage()]) for p in run.model.parameters()}
    assert params <= kept  # the save copied the weights into the host buffers prepare_async made
    ck.close()
    assert len(copies) == 0  # closed with the run: the host copies are freed
    summary = ck.times.summary()
    assert summary["prepare_s"] == seconds and summary["saves"][0]["async"] is True
    assert (tmp_path / "run" / "checkpoints" / "step_00000002").is_dir()


def test_file_digests_hash_several_files_at_once_and_equal_one_by_one(tmp_path: Path) -> None:
    from kiln.checkpoint.layout import file_digest, file_digests

    files = []
    for i in range(5):
        files.append(tmp_path / f"__{i}_0.distcp")
        files[-1].write_bytes(bytes([i]) * (3 << 20) + b"tail")
    assert file_digests(files) == [file_digest(f) for f in files]
    assert len(set(file_digests(files))) == 5
    missing = tmp_path / "gone.distcp"
    got = file_digests([files[0], missing], errors=True)
    assert got[0] == file_digest(files[0]) and isinstance(got[1], OSError)
    with pytest.raises(OSError):
        file_digests([files[0], missing])
