"""kiln's recipes at `kiln bench train-llm --nproc-per-node N` (N > 1): each row is `kiln train` on N
ranks started through torchrun (kiln.distributed.launch.launch_kiln, the launcher `kiln train
--nproc-per-node N` uses), reading the bench's tokens and writing its own run dir.

The ranks read the bench's batches through kiln's own data path: `data.source=files` over two
arrays (inputs, targets) laid out so that kiln's `DistributedSampler` without shuffling hands rank
r exactly its rows of each global batch (kiln.bench.train_llm.llm_train_data.rank_sample_order).
The run logs every step (`training.log_interval=1`: the loss averaged over ranks, the slowest
rank's step time, the peak memory of the fullest rank), keeps no checkpoint and no eval; the
row's figures come from its metrics.jsonl, its applied strategy and memory plan from summary.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.scale.scale_run import log_error_line, rank_env
from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow, set_figures
from kiln.distributed.launch import LaunchSpec, launch_kiln
from kiln.monitor.records import read_records

# Keys of the data and device in the bench's base config that a launched row replaces.
_REPLACED = ("data.source=", "data.path=", "data.token_dtype=", "training.device=")
PLAN_KEY = "memory_plan"
"""summary.json's key for kiln's memory plan, when the run wrote one (else the first key naming a plan)."""


def launched_overrides(base: list[str], files: tuple[Path, Path], device_type: str) -> list[str]:
    """The bench's base config with the rank files as data and measurement settings: every step
    logged, nothing saved or evaluated, no console or TensorBoard output."""
    kept = [o for o in base if not o.startswith(_REPLACED)]
    return [*kept, "data.source=files", f"data.path={files[0]}", f"data.labels_path={files[1]}", "data.shuffle=false",
            f"training.device={device_type}", "training.log_interval=1", "training.eval_interval=0",
            "metrics.console=false", "metrics.tensorboard=false", "checkpoint.save_final=false",
            "checkpoint.interval=0", "checkpoint.resume=never"]


def plan_peak(plan: Any) -> int | None:
    """The planned peak bytes per rank of a summary.json `memory_plan` (kiln.train.gpu_plan.plan_record), or None."""
    total = plan.get("total_bytes") if isinstance(plan, dict) else None
    return int(total) if isinstance(total, (int, float)) else None


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """The per-step training records of a run's metrics.jsonl (eval and event records left out)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in read_records(path, warn=False) if "step_ms" in r and "loss" in r]


def read_run(row: TrainRow, run: RowRun, run_dir: Path, code: int, timeout_s: float) -> TrainRow:
    """Fill `row` from a finished launched run: status, per-step losses and times, peak, plan."""
    ctx = run.ctx
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    records = step_records(run_dir)
    if code == 124:
        row.status, row.reason = "error", f"stopped after {timeout_s:.0f} s; {log_error_line(run_dir / 'launch.log')}"
    elif code != 0 or summary.get("status") != "completed":
        tail = log_error_line(run_dir / "launch.log")
        row.status = "oom" if "out of memory" in tail.lower() or "OutOfMemoryError" in tail else "error"
        row.reason = summary.get("error") or tail or f"exit code {code}"
    elif len(records) < run.opts.steps:
        row.status, row.reason = "error", f"logged {len(records)} of {run.opts.steps} steps"
    row.applied_strategy, row.params = summary.get("strategy"), summary.get("num_params")
    row.memory_plan = summary.get(PLAN_KEY)
    row.plan_bytes = plan_peak(row.memory_plan)
    if records:
        set_figures(row, [r["step_ms"] / 1e3 for r in records[1:]], ctx, run.opts.warmup)
        row.first_step_s = records[0]["step_ms"] / 1e3
        row.losses = [float(r["loss"]) for r in records]
        row.loss_first, row.loss_last = row.losses[0], row.losses[-1]
        if ctx.device.type == "cuda":
            row.peak_mem_bytes = int(max(r.get("peak_mem_bytes_max_rank", r.get("peak_mem_bytes", 0)) for r in records))
        if row.status == "ok" and not all(np.isfinite(row.losses)):
            row.status, row.reason = "error", "non-finite loss"
    return row


def launched_kiln_row(run: RowRun) -> TrainRow:
    """One kiln recipe trained by `kiln train` on the bench's ranks."""
    ctx, spec = run.ctx, run.spec
    assert ctx.rows_dir is not None and ctx.rank_files is not None
    run_dir = ctx.rows_dir / spec.name
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [*launched_overrides(ctx.base_overrides, ctx.rank_files, ctx.device.type), *spec.overrides]
    args = ["train", "--run-dir", str(run_dir), *overrides]
    left = run.deadline_left_s
    timeout = run.opts.row_timeout_s if left is None else min(run.opts.row_timeout_s, left + 60)
    code = launch_kiln(LaunchSpec(nproc_per_node=ctx.nproc), args, timeout_s=timeout,
                       log_path=run_dir / "launch.log", env=rank_env(ctx.device.type))
    row = TrainRow(spec.name, spec.kind, overrides=list(spec.overrides), nproc=ctx.nproc, log=str(run_dir / "launch.log"),
                   config={"command": ["kiln", *args], "nproc_per_node": ctx.nproc, "run_dir": str(run_dir)})
    return read_run(row, run, run_dir, code, timeout)
