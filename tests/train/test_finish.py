"""kiln.train.finish: a run's end status, and cleanup that never hides the error being raised."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

from kiln.checkpoint.signals import SignalExit
from kiln.train.finish import finish_run, record_end
from kiln.train.segments import RunHistory


class _Checkpointer:
    def __init__(self, events: list[str], fail: bool = False):
        self.events, self.fail = events, fail

    def close(self, collective: bool = True) -> None:
        self.events.append(f"close(collective={collective})")
        if self.fail:
            raise OSError("disk full")

    def remove_partial(self) -> None:
        self.events.append("remove_partial")


def _trainer(tmp_path, events: list[str], *, on_failure=None, keep_group=False, ckpt_fails=False):
    t = SimpleNamespace(on_failure=on_failure, failed_at=None, cleanup_errors=[], summary_error=None,
                        _steps_done=7, _start=1, _history=RunHistory(), _health=None, resume_path=None,
                        checkpointer=_Checkpointer(events, ckpt_fails), dist=SimpleNamespace(is_main=True),
                        run_dir=tmp_path, keep_group_on_failure=keep_group)
    t.leave_group = lambda: events.append("leave_group")
    return t


def _sinks(events: list[str], fail: bool = False):
    def close():
        events.append("sinks.close")
        if fail:
            raise RuntimeError("sink broken")
    return SimpleNamespace(close=close)


@pytest.mark.parametrize(("exc", "status"), [
    (KeyboardInterrupt(), "interrupted"),
    (SignalExit(15), "interrupted"),
    (RuntimeError("boom"), "failed"),
])
def test_the_end_status_of_an_error(tmp_path, exc, status):
    seen = []
    t = _trainer(tmp_path, [], on_failure=seen.append)
    summary = {"status": "running"}
    record_end(t, summary, exc)
    assert summary["status"] == status
    assert seen == ([exc] if status == "failed" else [])
    assert ("error" in summary) == (status == "failed") and (t.failed_at is not None) == (status == "failed")


def test_a_failing_failure_hook_is_kept_not_raised(tmp_path):
    def hook(exc):
        raise OSError("cannot publish")

    t = _trainer(tmp_path, [], on_failure=hook)
    summary = {"status": "running"}
    record_end(t, summary, RuntimeError("boom"))
    assert summary["status"] == "failed" and "boom" in summary["error"]
    assert [label for label, _ in t.cleanup_errors] == ["publishing the failure"]


def test_a_clean_end_writes_the_summary_and_leaves(tmp_path):
    events: list[str] = []
    t = _trainer(tmp_path, events)
    summary = {"status": "completed", "run_dir": str(tmp_path)}
    finish_run(t, summary, _sinks(events), 0.0, contextlib.ExitStack(), failing=False)
    assert events == ["sinks.close", "leave_group"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["status"] == "completed" and written["steps"] == 7


def test_on_the_failure_path_every_cleanup_step_runs_and_none_raises(tmp_path):
    events: list[str] = []
    t = _trainer(tmp_path, events, ckpt_fails=True)
    summary = {"status": "failed", "error": "the real error"}
    finish_run(t, summary, _sinks(events, fail=True), 0.0, contextlib.ExitStack(), failing=True)
    assert events == ["sinks.close", "close(collective=False)", "remove_partial", "leave_group"]
    assert [label for label, _ in t.cleanup_errors] == ["closing the metric sinks",
                                                         "waiting for the in-flight checkpoint save"]
    assert json.loads((tmp_path / "summary.json").read_text())["error"] == "the real error"


def test_after_a_clean_run_the_first_cleanup_error_is_the_failure(tmp_path):
    events: list[str] = []
    t = _trainer(tmp_path, events)
    summary = {"status": "completed"}
    with pytest.raises(RuntimeError, match="sink broken"):
        finish_run(t, summary, _sinks(events, fail=True), 0.0, contextlib.ExitStack(), failing=False)
    assert summary["status"] == "failed" and "sink broken" in summary["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_a_failed_run_kept_in_its_group_leaves_later(tmp_path):
    events: list[str] = []
    released: list[str] = []
    lock = contextlib.ExitStack()
    lock.callback(lambda: released.append("lock"))
    t = _trainer(tmp_path, events, keep_group=True)
    finish_run(t, {"status": "failed"}, _sinks(events), 0.0, lock, failing=True)
    assert "leave_group" not in events and released == []
