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
    lines = [r.getMessage() for r in caplog.records if "still writing" in r.getMessage()]
    assert lines and "checkpoint step 7" in lines[0] and str(tmp_path) in lines[0]


def test_a_quick_save_writes_no_progress_line(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kiln.checkpoint")
    with save_progress(tmp_path, 3, enabled=True, every_s=3600):
        time.sleep(0)
    with save_progress(tmp_path, 3, enabled=False, every_s=0.0):
        time.sleep(0.05)
    assert not [r for r in caplog.records if "still writing" in r.getMessage()]
