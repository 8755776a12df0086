"""Where metric records go: metrics.jsonl, TensorBoard, the console.

A record is a flat dict of Python numbers (and the odd string) with at least `step`; the trainer
builds one per log interval, after its single device read, and hands it to `MetricsLogger.log`.
Sinks never touch the device, so logging adds no synchronisation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kiln.config.choices import SWITCH_CHOICES
from kiln.config.schema import MetricsConfig
from kiln.errors import ConfigError
from kiln.monitor.prometheus import PrometheusSink
from kiln.monitor.records import keep_through, torn_tail
from kiln.monitor.sink import MetricsSink, scalars
from kiln.monitor.summary import json_safe
from kiln.monitor.trackers import build_tracker
from kiln.safe_io import open_append

log = logging.getLogger("kiln.monitor")

__all__ = [
    "ConsoleSink",
    "JsonlSink",
    "MetricsLogger",
    "TensorBoardSink",
    "build_sinks",
    "format_record",
    "scalars",
    "tensorboard_importable",
]

_TB_HINT = "tensorboard is not installed: pip install 'kiln[tb]'"


class JsonlSink(MetricsSink):
    """`metrics.jsonl`: one strict-JSON object per line (NaN/inf written as null, see `json_safe`).

    The file is opened for append, so a resumed run continues the same file. Each record goes out
    in one write(2) of the whole line; a write that fails part-way (a full disk) is cut back off,
    so the file only ever holds whole records; half a line a killed process left at the end is
    cut off when the next run opens the file. Nothing is fsynced: surviving a process crash needs
    only the OS page cache, and an fsync per log would stall the loop on slow disks.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = open_append(self.path, 0o644)
        torn = torn_tail(self.path)
        if torn:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - torn)
            log.warning("%s: dropped its last line (%d bytes, cut short by an earlier crash)", self.path, torn)

    def log(self, record: Mapping[str, Any]) -> None:
        if self._fd is None:
            raise RuntimeError(f"JsonlSink({self.path}) is closed")
        data = (json.dumps(json_safe(record), allow_nan=False) + "\n").encode("utf-8")
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            with contextlib.suppress(OSError):  # keep whole records only
                os.ftruncate(self._fd, start)
            raise

    def cut_after(self, step: int) -> None:
        """Drop the records past `step` (a resume fell back to an older checkpoint after the file
        was opened): rewritten aside, then appended to again."""
        self.close()
        keep_through(self.path, step)
        self._fd = open_append(self.path, 0o644)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def tensorboard_importable() -> bool:
    """Whether the `tensorboard` package is installed (found without importing it: imports are slow)."""
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardSink(MetricsSink):
    """TensorBoard event files: one scalar per number of the record (see `scalars`), at `record["step"]`."""

    def __init__(self, log_dir: str | os.PathLike[str]):
        try:
            # Imported here: tensorboard is an optional extra (kiln[tb]), and slow to import.
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(_TB_HINT) from exc
        self.log_dir = Path(log_dir)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, record: Mapping[str, Any]) -> None:
        if self._writer is None:
            raise RuntimeError(f"TensorBoardSink({self.log_dir}) is closed")
        step = int(record.get("step", 0))
        for tag, value in scalars(record):
            self._writer.add_scalar(tag, value, global_step=step)
        # Log steps are rare (log_interval), so flushing each keeps `tensorboard --logdir` live.
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# --------------------------------------------------------------------------------------------------
# Console


def _fmt_num(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_record(record: Mapping[str, Any], total_steps: int | None = None) -> str:
    """A one-line human summary of a record: the keys a person watches, in a fixed order."""
    parts: list[str] = []
    shown = {"step"}
    if "step" in record:
        parts.append(f"step {record['step']}" + (f"/{total_steps}" if total_steps else ""))

    def take(key: str, text: str) -> None:
        parts.append(text)
        shown.add(key)

    if isinstance(record.get("loss"), (int, float)):
        take("loss", f"loss {_fmt_num(float(record['loss']))}")
    if isinstance(record.get("lr"), (int, float)):
        take("lr", f"lr {float(record['lr']):.2e}")
    if isinstance(record.get("tokens_per_s"), (int, float)):
        take("tokens_per_s", f"{float(record['tokens_per_s']):,.0f} tok/s")
    if isinstance(record.get("samples_per_s"), (int, float)):
        take("samples_per_s", f"{float(record['samples_per_s']):,.1f} samples/s")
    if isinstance(record.get("step_ms"), (int, float)):
        take("step_ms", f"{float(record['step_ms']):.2f} ms/step")
    if isinstance(record.get("mfu"), (int, float)):
        take("mfu", f"MFU {100 * float(record['mfu']):.1f}%")
    # A few more that a person watching wants; memory peaks and per-rank lists stay in the JSONL.
    for key in ("grad_norm", "eval_loss", "eval_perplexity", "eval_accuracy", "straggler_ratio", "sync_wait_ms", "gpu_util_pct",
                "gpu_temp_c", "gpu_power_w", "nonfinite_skipped"):
        value = record.get(key)
        if isinstance(value, (int, float)) and not (key == "nonfinite_skipped" and value == 0):
            parts.append(f"{key}={_fmt_num(float(value)) if isinstance(value, float) else value}")
    if record.get("stragglers"):
        parts.append("stragglers=" + ",".join(f"rank {r}" for r in record["stragglers"]))
    if record.get("gpu_throttle_frac"):
        parts.append("throttled: " + ",".join(record.get("gpu_throttle_reasons") or []))
    return " | ".join(parts)


def first_step_message(compile_cfg, step: int, total: int) -> str:
    """What the console shows while the first step compiles (kiln.config CompileConfig)."""
    what = []
    if compile_cfg.enabled:
        what.append(f"compiling the training step (torch.compile, mode {compile_cfg.mode or 'default'}, "
                    f"scope {compile_cfg.scope}{', block by block' if compile_cfg.regional else ''})")
    if compile_cfg.cudagraphs:
        what.append("capturing it as one CUDA graph after the warm-up steps")
    return f"step {step}/{total}: {', then '.join(what)}; the first record follows when it is done"


class ConsoleSink(MetricsSink):
    """Live progress bar on a terminal; one plain log line per record elsewhere (CI, files, pipes).

    The bar redraws only in `log` (auto_refresh off): no background thread, and the console costs
    nothing between log steps. On a non-terminal, rich's live display would print nothing useful
    until the end, so lines are printed instead and the bar is never started.
    """

    def __init__(self, total_steps: int, enabled: bool = True, console: Console | None = None):
        self.total_steps = total_steps
        self.enabled = enabled
        self.console = console if console is not None else Console()
        self._live = enabled and (self.console.is_terminal or self.console.is_jupyter)
        self._progress: Progress | None = None
        self._task: Any = None
        if self._live:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
                auto_refresh=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, stats="")
            self._progress.start()
        self._ticking: tuple[threading.Event, threading.Thread] | None = None

    def waiting(self, message: str) -> None:
        """Show `message` until the next record: on a terminal in the bar, whose elapsed time then
        ticks every second (a refresh thread that the next record stops); elsewhere as one line."""
        if not self.enabled:
            return
        if self._progress is None:
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: the run goes on
                self.console.file.write(message + "\n")
                self.console.file.flush()
            return
        self._stop_ticking()
        self._progress.update(self._task, stats=message)
        self._progress.refresh()
        stop = threading.Event()
        progress = self._progress

        def tick() -> None:
            while not stop.wait(1.0):
                try:
                    progress.refresh()
                except Exception:  # the display is gone (closed terminal): stop ticking
                    return

        self._ticking = (stop, threading.Thread(target=tick, name="kiln-console-waiting", daemon=True))
        self._ticking[1].start()

    def _stop_ticking(self) -> None:
        if getattr(self, "_ticking", None) is not None:
            stop, thread = self._ticking
            self._ticking = None
            stop.set()
            thread.join(timeout=2.0)

    def log(self, record: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        self._stop_ticking()
        if self._progress is not None:
            stats = format_record({k: v for k, v in record.items() if k != "step"})
            completed = record.get("step")
            if isinstance(completed, int):
                self._progress.update(self._task, completed=completed, stats=stats)
            else:
                self._progress.update(self._task, stats=stats)
            self._progress.refresh()
        else:
            # A log file or pipe gets one record per line, never wrapped: written as plain text,
            # not through rich (which wraps at its width, 80 columns when it cannot ask a terminal).
            out = self.console.file
            out.write(format_record(record, self.total_steps) + "\n")
            out.flush()

    def close(self) -> None:
        self._stop_ticking()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


# --------------------------------------------------------------------------------------------------
# Fan-out


class MetricsLogger:
    """Sends each record to every sink. With no sinks (non-main ranks) every call is a no-op."""

    def __init__(self, sinks: Iterable[MetricsSink] = ()):
        self.sinks: list[MetricsSink] = list(sinks)

    def log(self, record: Mapping[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def waiting(self, message: str) -> None:
        for sink in self.sinks:
            sink.waiting(message)

    def cut_after(self, step: int) -> None:
        """Records past `step` leave the files that keep them (metrics.jsonl)."""
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.cut_after(step)

    def close(self) -> None:
        # Close every sink even if one fails, so files are flushed; then report the first error.
        first: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_sinks(cfg: MetricsConfig, run_dir: str | os.PathLike[str], total_steps: int, is_main: bool,
                run_config: Mapping[str, Any] | None = None) -> MetricsLogger:
    """The sinks `cfg` asks for, writing under `run_dir` (`metrics.jsonl`, `tb/`); `run_config` (the
    run's whole config) goes to an experiment tracker (`metrics.tracker`) as its parameters.

    Call before training starts, so `tensorboard = true` without tensorboard fails at once with
    a ConfigError. That check runs on every rank: if only rank 0 failed, the others would wait in
    the first collective until the timeout instead of exiting.
    """
    if cfg.tensorboard not in (None, True, False):
        raise ConfigError("metrics.tensorboard", f"unknown value {cfg.tensorboard!r}", SWITCH_CHOICES)
    if cfg.tensorboard is True and not tensorboard_importable():
        raise ConfigError("metrics.tensorboard", _TB_HINT)
    if not is_main:
        return MetricsLogger()

    run_dir = Path(run_dir)
    sinks: list[MetricsSink] = []
    if cfg.tensorboard is True or (cfg.tensorboard is None and tensorboard_importable()):
        try:
            sinks.append(TensorBoardSink(run_dir / "tb"))
        except ImportError as exc:
            # Installed but broken (e.g. a protobuf mismatch): "auto" means best effort.
            if cfg.tensorboard is True:
                raise ConfigError("metrics.tensorboard", f"{_TB_HINT} ({exc.__cause__ or exc})") from exc
    if cfg.jsonl:
        sinks.append(JsonlSink(run_dir / "metrics.jsonl"))
    if cfg.console:
        sinks.append(ConsoleSink(total_steps))
    if cfg.prometheus:
        try:
            prometheus = PrometheusSink(cfg.prometheus_host, cfg.prometheus_port, run=run_dir.name)
        except BaseException:
            MetricsLogger(sinks).close()
            raise
        sinks.append(prometheus)
        log.info("prometheus: serving metrics at %s", prometheus.url)
    if cfg.tracker != "none":
        try:
            sinks.append(build_tracker(cfg.tracker, run_dir, cfg.tracker_project, run_config or {}))
        except BaseException:
            MetricsLogger(sinks).close()
            raise
        log.info("%s: logging this run's metrics (project %s)", cfg.tracker, cfg.tracker_project or "kiln")
    return MetricsLogger(sinks)
