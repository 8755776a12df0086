"""What a long command shows while it works (kiln.activity): lines when piped, a live line on a terminal."""

from __future__ import annotations

import io
import time

from kiln.activity import Activity


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_piped_each_phase_is_one_flushed_line_and_rows_stay_plain():
    out = io.StringIO()
    with Activity(out) as act:
        act.phase("[1/2] fp32 task eager: building eager")
        act.log("[1/2] fp32 task eager: ok 1.000 ms")
        act.phase("[2/2] fp32 task inductor/default/model: compiling and warming up")
    assert out.getvalue().splitlines() == [
        "kiln: [1/2] fp32 task eager: building eager",
        "[1/2] fp32 task eager: ok 1.000 ms",
        "kiln: [2/2] fp32 task inductor/default/model: compiling and warming up",
    ]


def test_a_closed_pipe_silences_the_display_and_the_work_goes_on():
    act = Activity(_ClosedPipe())
    with act:
        act.phase("compiling")
        act.log("a row")
        act.phase("timing")
    assert act.current == "timing"


def test_on_a_terminal_a_live_line_and_finished_rows_above_it():
    out = io.StringIO()
    with Activity(out, live=True) as act:
        act.phase("[1/1] fp32 task inductor/default/model: compiling")
        started = act.phase_started
        act.log("[1/1] fp32 task inductor/default/model: ok")
        time.sleep(0.01)
    assert started is not None and "[1/1] fp32 task inductor/default/model: ok" in out.getvalue()
