"""A resumed run's summary.json (and report) describe the whole run: the first loss of its first
segment, wall time across segments, `resumed: true` with the segments listed."""

from __future__ import annotations

import json

import pytest

from kiln.config import load_config
from kiln.train.segments import RunHistory, describe_segments, read_history, whole_run
from kiln.train.trainer import train


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def failed_then_resumed(tmp_path, tiny_overrides, monkeypatch):
    """A run that fails after step 6 (checkpoint at 4), then the same config continues it."""
    over = [*tiny_overrides, "training.steps=12", "training.log_interval=2", "checkpoint.interval=4"]
    run_dir = tmp_path / "run"
    monkeypatch.setenv("KILN_FAULT", "host-oom@6")
    with pytest.raises(MemoryError):
        train(load_config(None, over), run_dir)
    first = json.loads((run_dir / "summary.json").read_text())
    monkeypatch.delenv("KILN_FAULT")
    return run_dir, over, first


def test_the_summary_of_a_resumed_run_covers_every_segment(failed_then_resumed):
    run_dir, over, first = failed_then_resumed
    assert first["status"] == "failed" and first["resumed"] is False and len(first["segments"]) == 1
    summary = train(load_config(None, over), run_dir)
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["resumed"] is True and written["status"] == "completed"
    assert [(s["first_step"], s["last_step"], s["status"]) for s in written["segments"]] == [
        (1, 5, "failed"), (5, 12, "completed")]  # the fault fires in step 6, before it counts as done
    assert written["segments"][1]["resumed_from"].endswith("step_00000004")
    # Run-level figures: the first segment's first loss (step 1), wall time of both segments.
    assert written["first_loss"] == _records(run_dir)[0]["loss"]  # the failed segment logged step 1
    assert written["segment_first_loss"] == summary["segment_first_loss"] != written["first_loss"]
    assert written["wall_s"] == pytest.approx(first["wall_s"] + written["segment_wall_s"], abs=2e-3)
    assert written["wall_s_complete"] is True
    assert describe_segments(written).startswith("2 segments: steps 1-5 (failed, ")


def test_a_segment_that_left_no_summary_is_listed_with_an_unknown_wall_time(failed_then_resumed):
    run_dir, over, first = failed_then_resumed
    (run_dir / "summary.json").unlink()  # as after a SIGKILL: nothing written at the end
    train(load_config(None, over), run_dir)
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["resumed"] is True and written["wall_s_complete"] is False
    assert written["segments"][0] == {"first_step": None, "last_step": 4, "wall_s": None,
                                      "status": "unknown (no summary.json: the process was killed)"}
    assert written["wall_s"] == written["segment_wall_s"]
    assert written["first_loss"] == _records(run_dir)[0]["loss"]  # from metrics.jsonl's step-1 record


def test_whole_run_of_a_single_segment_changes_nothing_but_adds_the_list():
    summary = {"status": "completed", "steps": 10, "wall_s": 3.5, "first_loss": 2.0}
    out = whole_run(summary, RunHistory(), 1, None)
    assert out == {"resumed": False, "segments": [{"first_step": 1, "last_step": 10, "wall_s": 3.5,
                                                  "status": "completed"}],
                   "segment_wall_s": 3.5, "wall_s": 3.5, "wall_s_complete": True, "segment_first_loss": 2.0}


def test_history_after_a_killed_segment_that_followed_a_summary(tmp_path):
    # Segment 1 stopped at step 8 (summary written); segment 2 resumed, checkpointed step 16, was killed.
    (tmp_path / "summary.json").write_text(json.dumps({
        "status": "stopped", "steps": 8, "wall_s": 4.0, "first_loss": 2.5,
        "segments": [{"first_step": 1, "last_step": 8, "wall_s": 4.0, "status": "stopped"}]}))
    history = read_history(tmp_path, 16)
    assert history.first_loss == 2.5
    assert [(s["first_step"], s["last_step"], s["wall_s"]) for s in history.segments] == [(1, 8, 4.0), (9, 16, None)]
