"""Running one `kiln bench scale` point: `kiln train` through the same torchrun launcher as
`kiln train --nproc-per-node N`, then reading what the run wrote (summary.json, metrics.jsonl).

The bench adds only measurement settings to the user's config: a fixed number of steps and log
interval (the trainer's step-time median skips the first interval, which holds compilation), no
checkpoints, no console or TensorBoard output. Each point's run dir and its ranks' output
(`launch.log`) stay under `OUT/points/` for inspection.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from kiln.bench.scale.scale_plan import Point
from kiln.distributed.launch import LaunchSpec, launch_kiln
from kiln.monitor.records import read_records

LOG_TAIL = 1500


def bench_overrides(steps: int) -> list[str]:
    log_interval = max(1, steps // 6)
    return [f"training.steps={steps}", f"training.log_interval={log_interval}", "metrics.console=false",
            "metrics.tensorboard=false", "checkpoint.save_final=false", "checkpoint.interval=0",
            "checkpoint.resume=never", "training.eval_interval=0"]


def point_overrides(point: Point, overrides: list[str], steps: int) -> list[str]:
    """The user's overrides, then the variant's, then the bench's own (later overrides win)."""
    return [*overrides, *point.variant.config_overrides(), f"data.batch_size={point.batch}", *bench_overrides(steps)]


def point_args(point: Point, run_dir: Path, config: str | None, overrides: list[str], steps: int) -> list[str]:
    """`kiln` arguments of one point."""
    args = ["train", "--run-dir", str(run_dir)]
    if config:
        args += ["--config", config]
    return [*args, *point_overrides(point, overrides, steps)]


def log_error_line(path: Path) -> str:
    """The ranks' own error line (kiln prints one), else the last exception line, else the tail."""
    if not path.exists():
        return ""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    for pattern in (r"kiln: (error|failed):", r"^(\[rank\d+\]: )?\w*(Error|Exception)\b"):
        hits = [ln for ln in lines if re.search(pattern, ln) and "ChildFailedError" not in ln]
        if hits:
            return hits[0][-LOG_TAIL:]
    return " | ".join(lines[-4:])[-LOG_TAIL:]


def _last_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}

    records = read_records(path)
    return records[-1] if records else {}


def read_point(point: Point, run_dir: Path, code: int, timeout_s: float | None) -> dict[str, Any]:
    """The row of one finished point: status and the figures its run wrote."""
    row: dict[str, Any] = {"kind": "point", "variant": point.variant.name, "strategy": point.variant.strategy,
                           "world": point.world, "role": point.role, "batch_per_rank": point.batch,
                           "run_dir": str(run_dir)}
    log = run_dir / "launch.log"
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if code == 124:
        return {**row, "status": "error", "reason": f"timed out after {timeout_s:.0f} s; {log_error_line(log)}"}
    if code != 0 or summary.get("status") != "completed":
        tail = log_error_line(log)
        status = "oom" if "out of memory" in tail.lower() or "OutOfMemoryError" in tail else "error"
        return {**row, "status": status, "reason": summary.get("error") or tail or f"exit code {code}"}
    last = _last_record(run_dir)
    peak = last.get("peak_mem_bytes_max_rank") or summary.get("peak_mem_bytes")
    row.update({
        "status": "ok",
        "applied_strategy": summary.get("strategy"),
        "global_batch": summary.get("global_batch"),
        "step_ms": summary.get("step_ms_median"),
        "step_ms_p10": summary.get("step_ms_p10"),
        "step_ms_p90": summary.get("step_ms_p90"),
        "throughput": summary.get("samples_per_s"),
        "throughput_per_device": summary.get("samples_per_s_per_device"),
        "peak_mem_bytes": peak,
        "straggler_ratio": last.get("straggler_ratio"),
        "mfu": summary.get("mfu"),
        "first_step_s": summary.get("first_step_s"),
        "final_loss": summary.get("final_loss"),
        "graphs": (summary.get("compile") or {}).get("graphs"),
        "recompiles": (summary.get("compile") or {}).get("recompiles"),
        # FSDP2's choice as the run made it (under `auto` its memory plan decides, on the device)
        "reshard_after_forward": (summary.get("fsdp_layout") or {}).get("reshard_after_forward"),
    })
    if row["applied_strategy"] != point.variant.strategy:
        # The trainer chose otherwise (e.g. a one-process run without torchrun): not this point.
        row.update(status="error", reason=f"ran as {row['applied_strategy']!r}, not {point.variant.strategy!r}")
    return row


def rank_env(device_type: str) -> dict[str, str]:
    """On CPU every rank runs one intra-op thread unless the user chose otherwise: torchrun already
    does so for several ranks, and a 1-rank point with all cores would not compare like for like
    (nor survive a loaded machine: idle OpenMP threads spin)."""
    env = dict(os.environ)
    if device_type == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_point(point: Point, run_dir: Path, *, config: str | None, overrides: list[str], steps: int,
              timeout_s: float | None, device_type: str = "cuda") -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = LaunchSpec(nproc_per_node=point.world)
    code = launch_kiln(spec, point_args(point, run_dir, config, overrides, steps), timeout_s=timeout_s,
                       log_path=run_dir / "launch.log", env=rank_env(device_type))
    return read_point(point, run_dir, code, timeout_s)


def skipped_row(point: Point) -> dict[str, Any]:
    return {"kind": "point", "variant": point.variant.name, "strategy": point.variant.strategy,
            "world": point.world, "role": point.role, "batch_per_rank": point.batch, "status": "skipped",
            "reason": point.skip}
