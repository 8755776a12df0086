"""The strategy stage of `kiln autotune` (several GPUs): the winning recipe under DDP and under FSDP2
over N processes, each a short `kiln train --nproc-per-node N` run (the launcher users call),
compared on the trainer's median step time. Whole-step capture needs one process, so these runs
and a multi-process best.toml leave it off."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.bench.compile.recipes import recipe_config
from kiln.config.load import save_config
from kiln.monitor.summary import read_summary
from kiln.safe_io import write_atomic
from kiln.tune import space as sp
from kiln.tune.search import TuneOptions, TuneResult

STRATEGIES = ("ddp", "fsdp")
STEPS = 40


def _row(strategy: str, nproc: int, label: str, run_dir: Path, code: int, reason: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"stage": "strategy", "candidate": f"{label} {strategy} x{nproc}", "role": "",
                           "strategy": strategy, "world": nproc, "status": "ok" if code == 0 else "error",
                           "reason": reason}
    summary = run_dir / "summary.json"
    if code == 0 and summary.exists():
        data = read_summary(run_dir) or {}
        row.update(step_ms=data.get("step_ms_median"), step_ms_p10=data.get("step_ms_p10"),
                   step_ms_p90=data.get("step_ms_p90"), throughput=data.get("samples_per_s"),
                   throughput_per_device=(data.get("samples_per_s") or 0) / nproc,
                   peak_mem_bytes=data.get("peak_mem_bytes"), compile_s=data.get("first_step_s"))
        if row["step_ms"] is None:
            row.update(status="error", reason="the run logged no step time")
    return row


def strategy_stage(result: TuneResult, opts: TuneOptions, nproc: int, out: Path,
                   log: Callable[[str], None]) -> None:
    """Measure the winner under each strategy; sets result.extra["strategy"] to the faster one
    and adds the rows to result.extra["rows"]."""
    winner = result.winner
    label = sp.describe(winner)
    cfg = recipe_config(opts.cfg, winner)
    cfg.compile.cudagraphs = False
    cfg.training.steps = STEPS
    cfg.training.log_interval = 10
    cfg.optim.warmup_steps = min(cfg.optim.warmup_steps, STEPS)
    cfg.checkpoint.save_final = False
    cfg.checkpoint.interval = 0
    cfg.metrics.console = False
    cfg.metrics.tensorboard = False
    rows = result.extra.setdefault("rows", [])
    measured = result.winner_trial.row if result.winner_trial is not None else {}
    compile_s = measured.get("compile_s") or 30.0
    step_s = (measured.get("step_ms") or 100.0) / 1e3
    start = time.monotonic()
    deadline = start + opts.budget_s - result.elapsed_s
    for strategy in STRATEGIES:
        left = deadline - time.monotonic()
        # Every rank compiles (FSDP2: block by block), then the steps at up to N times the step time.
        estimate = 2 * compile_s + STEPS * step_s * nproc + 30
        if estimate > left:
            result.not_tried.append({"recipe": f"{label} {strategy} x{nproc}", "stage": "strategy",
                                     "reason": f"estimated {estimate:.0f} s, {max(0.0, left):.0f} s of the budget left",
                                     "fields": sp.recipe_fields(winner)})
            continue
        cfg.distributed.strategy = strategy
        run_dir = out / "strategy" / strategy
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "input.toml")
        cmd = [sys.executable, "-m", "kiln", "train", "--nproc-per-node", str(nproc), "--run-dir", str(run_dir / "run"),
               "--config", str(run_dir / "input.toml")]
        log(f"[strategy] {label} {strategy} x{nproc}: kiln train --nproc-per-node {nproc} ...")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60.0, left), env=dict(os.environ))
            code, text = proc.returncode, proc.stdout + proc.stderr
            reason = (proc.stderr.strip().splitlines() or ["failed"])[0] if code else None
        except subprocess.TimeoutExpired as exc:
            code, text, reason = 1, str(exc), "stopped: the time budget ran out"
        write_atomic(run_dir / "train.log", text)
        row = _row(strategy, nproc, label, run_dir / "run", code, reason)
        rows.append(row)
        log(f"[strategy] {label} {strategy} x{nproc}: {row['status']}"
            + (f" {row['step_ms']:.3f} ms, {row['throughput']:.0f} samples/s" if row.get("step_ms") else "")
            + (f": {row['reason']}" if row.get("reason") else ""))
    result.elapsed_s += time.monotonic() - start
    ok = [r for r in rows if r["status"] == "ok" and r.get("throughput")]
    if ok:
        best = max(ok, key=lambda r: r["throughput"])
        best["role"] = "winner (strategy)"
        result.extra["strategy"] = best["strategy"]
        each = ", ".join(f"{r['strategy']} {r['throughput']:.0f}" for r in ok)
        result.notes.append(f"distributed.strategy={best['strategy']}: {best['throughput']:.0f} samples/s over {nproc} "
                            f"processes ({each}); "
                            "whole-step capture is off in best.toml (it needs one process)")
