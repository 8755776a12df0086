from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from kiln.config import ConfigError, MetricsConfig
from kiln.monitor import sinks as sinks_mod
from kiln.monitor.sinks import ConsoleSink, JsonlSink, MetricsLogger, TensorBoardSink, build_sinks, format_record

RECORD = {"step": 10, "loss": 2.5, "lr": 1e-3, "samples_per_s": 1234.5, "step_ms": 12.25, "mfu": 0.42}


def test_jsonl_lines_parse_and_reopen_appends(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(RECORD)
    sink.log({"step": 20, "loss": float("nan"), "lr": float("inf")})
    # flushed per write: readable before close, as after a crash
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    sink.close()
    sink.close()  # idempotent

    resumed = JsonlSink(path)
    resumed.log({"step": 30, "loss": 1.0})
    resumed.close()

    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0] == RECORD
    assert records[1] == {"step": 20, "loss": None, "lr": None}  # strict JSON: non-finite -> null
    assert records[2] == {"step": 30, "loss": 1.0}


def test_tensorboard_writes_events(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log({**RECORD, "note": "text is skipped", "flag": True})
    sink.close()
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "lr", "samples_per_s", "step_ms", "mfu"}
    (event,) = acc.Scalars("loss")
    assert event.step == 10 and event.value == pytest.approx(2.5)


def test_console_sink_non_tty_prints_lines() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)
    sink = ConsoleSink(total_steps=100, console=console)
    sink.log(RECORD)
    sink.log({"step": 20, "loss": 2.0, "tokens_per_s": 5000.0, "eval_loss": 2.25, "[bold]x": 1})
    sink.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "step 10/100 | loss 2.5 | lr 1.00e-03 | 1,234.5 samples/s | 12.25 ms/step | MFU 42.0%"
    assert lines[1] == "step 20/100 | loss 2 | 5,000 tok/s | eval_loss=2.25"  # other keys: JSONL only


def test_console_sink_never_wraps_off_a_terminal() -> None:
    # A log file or pipe: rich would wrap at its width (80 columns when it cannot ask a terminal).
    buffer = io.StringIO()
    sink = ConsoleSink(total_steps=100, console=Console(file=buffer, force_terminal=False, width=40))
    record = {**RECORD, "grad_norm": 4.109, "eval_loss": 2.25, "eval_accuracy": 0.5, "straggler_ratio": 1.01}
    sink.log(record)
    sink.close()
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) > 40
    assert lines[0].startswith("step 10/100 | ") and lines[0].endswith("straggler_ratio=1.01")


def test_console_sink_terminal_progress() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    sink = ConsoleSink(total_steps=100, console=console)
    sink.log(RECORD)
    sink.close()
    out = buffer.getvalue()
    assert "10/100" in out and "loss 2.5" in out


def test_console_sink_disabled() -> None:
    buffer = io.StringIO()
    sink = ConsoleSink(total_steps=5, enabled=False, console=Console(file=buffer))
    sink.log(RECORD)
    sink.close()
    assert buffer.getvalue() == ""


def test_format_record_minimal() -> None:
    assert format_record({"step": 1}) == "step 1"


def test_format_record_keeps_the_line_short() -> None:
    line = format_record({**RECORD, "grad_norm": 0.5, "max_rss_bytes": 123, "step_ms_ranks": [1.0, 2.0],
                          "nonfinite_skipped": 0}, total_steps=100)
    assert line.startswith("step 10/100 | loss") and "grad_norm=0.5" in line
    assert "max_rss_bytes" not in line and "step_ms_ranks" not in line and "nonfinite" not in line


def _kinds(logger: MetricsLogger) -> set[str]:
    return {type(s).__name__ for s in logger.sinks}


def test_build_sinks_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logger = build_sinks(MetricsConfig(tensorboard=None, console=False), tmp_path / "a", 10, is_main=True)
    assert _kinds(logger) == {"TensorBoardSink", "JsonlSink"}
    logger.log(RECORD)
    logger.close()
    assert (tmp_path / "a" / "metrics.jsonl").exists() and (tmp_path / "a" / "tb").is_dir()

    logger = build_sinks(MetricsConfig(tensorboard=True), tmp_path / "b", 10, is_main=True)
    assert _kinds(logger) == {"TensorBoardSink", "JsonlSink", "ConsoleSink"}
    logger.close()

    logger = build_sinks(MetricsConfig(tensorboard=False, jsonl=False), tmp_path / "c", 10, is_main=True)
    assert _kinds(logger) == {"ConsoleSink"}
    logger.close()

    logger = build_sinks(MetricsConfig(), tmp_path / "d", 10, is_main=False)
    assert logger.sinks == []
    logger.log(RECORD)
    logger.close()
    assert not (tmp_path / "d").exists()


def test_build_sinks_without_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sinks_mod, "tensorboard_importable", lambda: False)
    logger = build_sinks(MetricsConfig(tensorboard=None, console=False), tmp_path, 10, is_main=True)
    assert _kinds(logger) == {"JsonlSink"}
    logger.close()
    for is_main in (True, False):  # every rank fails alike, so none waits on the others
        with pytest.raises(
            ConfigError, match=r"metrics.tensorboard: tensorboard is not installed: pip install 'kiln\[tb\]'"
        ):
            build_sinks(MetricsConfig(tensorboard=True), tmp_path, 10, is_main=is_main)


def test_build_sinks_bad_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid: auto, true, false"):
        build_sinks(MetricsConfig(tensorboard="yes"), tmp_path, 10, is_main=True)


def test_tensorboard_charts_every_number_including_per_rank_lists(tmp_path: Path) -> None:
    record = {"step": 4, "loss": 1.0, "step_ms_ranks": [10.0, 12.0], "sync_wait_ms_ranks": [2.0, 0.5],
              "gpu_util_pct": 88.0, "gpu_throttle_reasons": ["gpu_idle"], "stragglers": [1], "straggler_count": 1}
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log(record)
    sink.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {
        "loss", "gpu_util_pct", "straggler_count", "step_ms_ranks/rank_0", "step_ms_ranks/rank_1",
        "sync_wait_ms_ranks/rank_0", "sync_wait_ms_ranks/rank_1"}
    assert acc.Scalars("step_ms_ranks/rank_1")[0].value == pytest.approx(12.0)


def test_console_names_stragglers_and_throttling() -> None:
    line = format_record({"step": 8, "loss": 1.0, "stragglers": [1, 3], "gpu_util_pct": 97.5,
                          "gpu_throttle_frac": 0.5, "gpu_throttle_reasons": ["sw_thermal_slowdown"]})
    assert "stragglers=rank 1,rank 3" in line and "gpu_util_pct=97.5" in line
    assert "throttled: sw_thermal_slowdown" in line


def test_waiting_is_one_line_when_piped_and_a_ticking_bar_on_a_terminal():
    from kiln.config.schema import CompileConfig
    from kiln.monitor.sinks import first_step_message

    message = first_step_message(CompileConfig(enabled=True, mode="", scope="model", cudagraphs=True), 1, 30)
    assert message == ("step 1/30: compiling the training step (torch.compile, mode default, scope model), then "
                       "capturing it as one CUDA graph after the warm-up steps; the first record follows when it is done")
    buffer = io.StringIO()
    sink = ConsoleSink(total_steps=30, console=Console(file=buffer, force_terminal=False))
    sink.waiting("step 1/30: compiling")
    sink.log({"step": 1, "loss": 2.0})
    assert buffer.getvalue().splitlines()[0] == "step 1/30: compiling"
    assert buffer.getvalue().splitlines()[1].startswith("step 1/30")
    live = ConsoleSink(total_steps=30, console=Console(file=io.StringIO(), force_terminal=True, width=100))
    live.waiting("step 1/30: compiling")
    stop, thread = live._ticking
    assert thread.is_alive()
    live.log({"step": 1, "loss": 2.0})  # the first record ends the ticking
    assert live._ticking is None and stop.is_set() and not thread.is_alive()
    live.close()
