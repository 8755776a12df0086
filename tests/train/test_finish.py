"""kiln.train.finish: a run's end status, and cleanup that never hides the error being raised."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

from kiln.checkpoint.signals import SignalExit
from kiln.train.finish import call_failure_hook, finish_run, record_end, release_run
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


def _finish(tmp_path, events: list[str], summary: dict, sinks, *, failing: bool, ckpt_fails: bool = False):
    return finish_run(summary, sinks=sinks, health=None, checkpointer=_Checkpointer(events, ckpt_fails), started=0.0,
                      failing=failing, steps_done=7, first_step=1, resumed_from=None, history=RunHistory(),
                      summary_path=tmp_path / "summary.json")


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
def test_the_end_status_of_an_error(exc, status):
    summary = {"status": "running"}
    assert record_end(summary, exc) == status
    assert summary["status"] == status
    assert ("error" in summary) == (status == "failed")


def test_the_failure_hook_gets_the_error_and_a_failing_hook_is_kept_not_raised():
    seen = []
    error = RuntimeError("boom")
    assert call_failure_hook(seen.append, error) == [] and seen == [error]
    assert call_failure_hook(None, error) == []

    def hook(exc):
        raise OSError("cannot publish")

    assert [label for label, _ in call_failure_hook(hook, error)] == ["publishing the failure"]


def test_a_clean_end_writes_the_summary_and_leaves(tmp_path):
    events: list[str] = []
    summary = {"status": "completed", "run_dir": str(tmp_path)}
    end = _finish(tmp_path, events, summary, _sinks(events), failing=False)
    assert end.errors == [] and end.first is None
    assert release_run(contextlib.ExitStack(), lambda: events.append("leave_group"), failing=False,
                       keep_group_on_failure=False) == []
    assert events == ["sinks.close", "leave_group"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["status"] == "completed" and written["steps"] == 7


def test_on_the_failure_path_every_cleanup_step_runs_and_none_raises(tmp_path):
    events: list[str] = []
    summary = {"status": "failed", "error": "the real error"}
    end = _finish(tmp_path, events, summary, _sinks(events, fail=True), failing=True, ckpt_fails=True)
    release_run(contextlib.ExitStack(), lambda: events.append("leave_group"), failing=True,
                keep_group_on_failure=False)
    assert events == ["sinks.close", "close(collective=False)", "remove_partial", "leave_group"]
    assert end.first is None
    assert [label for label, _ in end.errors] == ["closing the metric sinks", "waiting for the in-flight checkpoint save"]
    assert json.loads((tmp_path / "summary.json").read_text())["error"] == "the real error"


def test_after_a_clean_run_the_first_cleanup_error_is_the_failure(tmp_path):
    events: list[str] = []
    summary = {"status": "completed"}
    end = _finish(tmp_path, events, summary, _sinks(events, fail=True), failing=False)
    assert isinstance(end.first, RuntimeError) and "sink broken" in str(end.first)
    assert summary["status"] == "failed" and "sink broken" in summary["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_a_failed_run_kept_in_its_group_leaves_later(tmp_path):
    events: list[str] = []
    released: list[str] = []
    lock = contextlib.ExitStack()
    lock.callback(lambda: released.append("lock"))
    _finish(tmp_path, events, {"status": "failed"}, _sinks(events), failing=True)
    assert release_run(lock, lambda: events.append("leave_group"), failing=True, keep_group_on_failure=True) == []
    assert "leave_group" not in events and released == []
