"""SIGTERM/SIGINT/SIGHUP become a stop request checked between steps; handlers are restored."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import kiln.distributed.signals
from kiln.checkpoint import StopOnSignal, any_rank


def test_sigterm_sets_the_flag_and_handlers_are_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with StopOnSignal() as stop:
        assert not stop.stop_requested()
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next bytecode
        assert stop.stop_requested()
        assert stop.signal_name == "SIGTERM"
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sighup_is_a_stop_request_like_sigterm() -> None:
    with StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal or SSH session
        assert stop.stop_requested() and stop.signal_name == "SIGHUP"


def test_the_same_signal_delivered_twice_at_once_is_one_request() -> None:
    # A scheduler signals every process of the job and the launcher passes it on too.
    with StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # no SystemExit: within REPEAT_WINDOW_S
        assert stop.signal_name == "SIGTERM"


def test_second_sigint_interrupts_at_once(monkeypatch) -> None:
    monkeypatch.setattr(kiln.distributed.signals, "REPEAT_WINDOW_S", 0.0)  # the second comes "later"
    with StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_outside_main_thread_is_a_no_op() -> None:
    seen = []

    def body() -> None:
        with StopOnSignal() as stop:
            seen.append(stop.stop_requested())

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False] and signal.getsignal(signal.SIGTERM) is before


def test_any_rank_without_process_group() -> None:
    assert any_rank(True) is True and any_rank(False) is False


def test_sighup_saves_and_stops_a_one_process_run(tmp_path, tiny_overrides) -> None:
    """An SSH session that closes sends SIGHUP: the run saves and exits 0 like on SIGTERM."""
    import json
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    over = [o for o in tiny_overrides if not o.startswith("training.steps")]
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir), *over,
                             "training.steps=1000000", "training.log_interval=1", "checkpoint.interval=0",
                             "checkpoint.save_final=false"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGHUP"
    assert (run_dir / "checkpoints" / f"step_{summary['steps']:08d}").is_dir()
    assert "checkpoint saved: the same command continues the run" in err  # as README says: rerun it


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, lambda: __import__("kiln.checkpoint.signals").checkpoint
                                       .signals.SignalExit(143)])
def test_an_interrupt_in_the_middle_of_a_save_is_an_interruption(tmp_path, monkeypatch, interrupt) -> None:
    """A second Ctrl-C (or SIGTERM) while DCP writes: DCP wraps it into its CheckpointException; kiln
    removes the partial save and re-raises the interruption, not a failed save ("fix your ...")."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from kiln.checkpoint import AppState, Checkpointer
    from kiln.config.schema import CheckpointConfig

    model = torch.nn.Linear(3, 3)
    app = AppState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ck = Checkpointer(tmp_path, CheckpointConfig(), rank=0, world_size=1)
    first = ck.save(1, app)

    def interrupted_write(self, plan, planner):
        raise interrupt()

    monkeypatch.setattr(FileSystemWriter, "write_data", interrupted_write)
    with pytest.raises((KeyboardInterrupt, SystemExit)) as caught:
        ck.save(2, app)
    assert not isinstance(caught.value, Exception)
    assert not (tmp_path / "checkpoints" / "step_00000002.tmp").exists()
    assert first.is_dir()
