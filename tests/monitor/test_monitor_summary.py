from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kiln.monitor.memory import memory_stats, reset_peak
from kiln.monitor.summary import StepStats, json_safe, write_summary


def test_write_summary_atomic(tmp_path: Path) -> None:
    path = tmp_path / "run" / "summary.json"
    write_summary(path, {"status": "ok", "steps": 3, "final_loss": float("nan")})
    write_summary(path, {"status": "ok", "steps": 4, "final_loss": 1.5})
    assert json.loads(path.read_text()) == {"status": "ok", "steps": 4, "final_loss": 1.5}
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]
    assert path.read_text().startswith("{\n  ")  # indent 2


def test_write_summary_failure_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "summary.json"
    write_summary(path, {"status": "ok"})

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("kiln.monitor.summary.os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_summary(path, {"status": "failed"})
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


def test_json_safe() -> None:
    import numpy as np

    value = {"a": float("inf"), "b": [np.float32(2.0), torch.tensor(3.0)], "c": np.int64(4), "d": Path("x")}
    assert json_safe(value) == {"a": None, "b": [2.0, 3.0], "c": 4, "d": "x"}


def test_step_stats() -> None:
    stats = StepStats()
    assert stats.median() is None
    for t in [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]:
        stats.add(t)
    assert stats.median() == 6.0
    assert stats.p10() == 2.0
    assert stats.p90() == 10.0
    ms = stats.summary_ms()
    assert ms["step_ms_median"] == 6000.0
    assert all(math.isfinite(v) for v in ms.values() if v is not None)


def test_step_stats_skip_first() -> None:
    stats = StepStats(skip_first=1)
    stats.add(100.0)  # the compile interval
    assert stats.median() == 100.0  # nothing else yet: keep it rather than report nothing
    stats.add(1.0)
    stats.add(3.0)
    assert stats.median() == 2.0
    assert len(stats) == 3


def test_memory_stats_cpu() -> None:
    stats = memory_stats(torch.device("cpu"))
    assert stats["max_rss_bytes"] is not None and stats["max_rss_bytes"] > 0
    assert stats["max_allocated_bytes"] is None and stats["max_reserved_bytes"] is None
    assert stats["peak_mem_bytes"] == stats["max_rss_bytes"]
    reset_peak("cpu")  # a no-op, but must not fail
