"""kiln profile on CPU through the CLI: the same training path, a trace, a summary; bad input."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.profile.trace import load_trace, step_annotations

TINY = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
        "data.batch_size=8", "training.device=cpu", "metrics.console=false"]


def test_cpu_profile_writes_trace_and_summary(tmp_path, capsys):
    out = tmp_path / "prof"
    assert main(["profile", "--out", str(out), "--steps", "3", "--warmup", "1", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "Host ops by self time" in printed and "n/a" in printed
    summary = json.loads((out / "profile_summary.json").read_text())
    assert summary["window"]["steps"] == 3 and summary["window"]["step_ms"] > 0
    assert summary["gpu"]["status"] == "n/a" and "CPU run" in summary["gpu"]["reason"]
    assert summary["cpu"]["cpu_self_ms_per_step"] > 0
    assert any(r["name"] in ("aten::addmm", "aten::mm") for r in summary["cpu"]["top"])
    assert summary["memory"]["by_category"]["status"] == "ok"
    assert summary["memory"]["by_category"]["at_peak"]["parameter"] > 0
    assert summary["memory"]["cuda_snapshot"]["status"] == "n/a"
    # The trace holds exactly the profiled steps (ProfilerStep markers) and is the file named.
    steps = step_annotations(load_trace(out / summary["trace"]))
    assert len(steps) == 3
    # It is a kiln training run: 1 + warm-up 1 + window 3 + memory 2 + a last, logged step.
    run = json.loads((out / "summary.json").read_text())
    assert run["status"] == "completed" and run["steps"] == 8
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 8]
    md = (out / "profile_summary.md").read_text()
    assert "## Memory" in md and "parameter" in md


def test_the_profilers_native_usdt_lines_stay_off_the_console(tmp_path, capfd):
    """torch's profiler prints `USDT:` probe lines from native code at start and stop: they go to
    the output dir's dependencies.log, not between kiln's lines."""
    out = tmp_path / "prof"
    assert main(["profile", "--out", str(out), "--steps", "2", "--warmup", "1", "--memory-steps", "0", *TINY]) == 0
    captured = capfd.readouterr()
    assert "USDT" not in captured.out + captured.err
    assert "profiled 2 steps" in captured.out + captured.err


@pytest.mark.parametrize(("args", "needle"), [
    (["--steps", "0"], "--steps"),
    (["--warmup", "0"], "--warmup"),
    (["compile.mode=max-performance"], "compile.mode"),
    (["model.name=nope_model"], "model.name"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, needle):
    out = tmp_path / "prof"
    assert main(["profile", "--out", str(out), *TINY, *args]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()
