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
