"""SIGTERM/SIGINT/SIGHUP become a stop request checked between steps; handlers are restored."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import kiln.distributed.signal_relay
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
    monkeypatch.setattr(kiln.distributed.signal_relay, "REPEAT_WINDOW_S", 0.0)  # the second comes "later"
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


# A model factory whose import makes every checkpoint write after step 4's block until the process
# is signalled: the window "in the middle of a save", deterministically. Test-only, via model.name.
# The write also leaves a thread busy for minutes, as a writer thread still in the middle of a large
# tensor is when the main thread takes the signal: stopping "at once" must not wait for it.
SLOW_SAVE_FACTORY = """
import os, threading, time
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from kiln.models.mlp import build_mlp
from kiln.models.spec import InputSpec

_write = FileSystemWriter.write_data

def _blocking_write(self, plan, planner):
    if "step_00000004" not in str(self.path):
        threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: exit would wait for it
        open(os.environ["KILN_TEST_SAVING"], "w").close()
        while True:  # until the second signal ends the process
            time.sleep(0.05)
    return _write(self, plan, planner)

FileSystemWriter.write_data = _blocking_write

def build(hidden_size=32, num_layers=2, num_classes=4, dropout=0.0):
    return build_mlp(hidden_size, num_layers, num_classes, dropout), InputSpec("features", (hidden_size,), num_classes=num_classes)
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_during_a_save_stops_the_cli_at_once(tmp_path, tiny_overrides, sig, code) -> None:
    """`kiln train`, signalled once (stop after this step, saving) and again while that save writes:
    exit 128 + the signal, the partial save removed, the step-4 checkpoint kept and named, and no
    failure advice (the user insisted; nothing is wrong with their model)."""
    import subprocess
    import sys
    import time

    (tmp_path / "slow_save.py").write_text(SLOW_SAVE_FACTORY)
    saving = tmp_path / "SAVING"
    run_dir = tmp_path / "run"
    over = [o for o in tiny_overrides if not o.startswith("training.steps")]
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir), *over,
                             f"model.name={tmp_path / 'slow_save.py'}:build", "training.steps=1000000",
                             "checkpoint.interval=4"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "KILN_TEST_SAVING": str(saving)})
    kept = run_dir / "checkpoints" / "step_00000004"
    try:
        deadline = time.monotonic() + 120
        while not kept.is_dir():  # complete: renamed from step_00000004.tmp
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.05)
        first = time.monotonic()
        proc.send_signal(sig)  # stop after this step: a save (or the step-8 save already under way)
        while not saving.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.05)
        time.sleep(max(0.0, first + 1.5 - time.monotonic()))  # past kiln's window for one signal sent twice
        proc.send_signal(sig)  # again, in the middle of that save: now
        second = time.monotonic()
        _, err = proc.communicate(timeout=120)
        stopped_after = time.monotonic() - second
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert stopped_after < 60, f"the process lingered {stopped_after:.0f} s after the second signal"
    assert "fix your model" not in err and "your model, data or factory code" not in err, err[-3000:]
    (said,) = [line for line in err.splitlines() if "interrupted while saving checkpoint" in line]
    assert f"the newest complete checkpoint, {kept}, is intact" in said, err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000004"]
