"""Run metrics: FLOPs and MFU, memory, step-time statistics, sinks (console, JSONL, TensorBoard), environment."""

from __future__ import annotations

from kiln.monitor.env import collect_env, render_env
from kiln.monitor.flops import count_step_flops, mfu, peak_flops, peak_flops_for_name
from kiln.monitor.memory import max_rss_bytes, memory_stats, reset_peak
from kiln.monitor.sink import MetricsSink
from kiln.monitor.sinks import (
    ConsoleSink,
    JsonlSink,
    MetricsLogger,
    TensorBoardSink,
    build_sinks,
    format_record,
    tensorboard_importable,
)
from kiln.monitor.summary import StepStats, json_safe, write_summary

__all__ = [
    "ConsoleSink",
    "JsonlSink",
    "MetricsLogger",
    "MetricsSink",
    "StepStats",
    "TensorBoardSink",
    "build_sinks",
    "collect_env",
    "count_step_flops",
    "format_record",
    "json_safe",
    "max_rss_bytes",
    "memory_stats",
    "mfu",
    "peak_flops",
    "peak_flops_for_name",
    "render_env",
    "reset_peak",
    "tensorboard_importable",
    "write_summary",
]
