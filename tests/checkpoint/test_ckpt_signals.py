"""SIGTERM/SIGINT become a stop request checked between steps; handlers are restored."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from kiln.checkpoint import StopOnSignal, any_rank


def test_sigterm_sets_the_flag_and_handlers_are_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with StopOnSignal() as stop:
        assert not stop.stop_requested()
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next bytecode
        assert stop.stop_requested()
        assert stop.signal_name == "SIGTERM"
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_second_sigint_interrupts_at_once() -> None:
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
