"""The plain row of `kiln bench train-llm --nproc-per-node N` (N > 1): the hand-written FSDP2 loop
(plain_fsdp.py beside this module) run by torchrun on N ranks from the bench's initial weights on
the rank files kiln's launched rows read too, its per-step losses and times read back."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kiln.bench.peers.torchtitan.job_file import last_error, read_metrics
from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow, set_figures
from kiln.distributed.launch import run_bounded

MIXED = {"bf16-mixed": "bf16", "fp32": "fp32"}
"""The bench's precision -> the loop's FSDP2 MixedPrecisionPolicy (bf16: param bf16, reduce fp32)."""


def script_path() -> Path:
    return Path(__file__).resolve().with_name("plain_fsdp.py")


def job(run: RowRun, workdir: Path) -> dict[str, Any]:
    """The loop's job file: the bench's weights, rank files, steps, batch and optimisation."""
    opts, ctx = run.opts, run.ctx
    assert ctx.rank_files is not None
    h = opts.hyper
    return {"weights_dir": str(ctx.weights_dir), "inputs": str(ctx.rank_files[0]), "labels": str(ctx.rank_files[1]),
            "steps": opts.steps, "batch": opts.batch, "lr": h.lr, "betas": list(h.betas), "eps": h.eps,
            "weight_decay": h.weight_decay, "warmup_steps": h.warmup_steps, "max_norm": h.max_norm,
            "mixed": MIXED[opts.precision], "compile": opts.plain_compile, "ac": opts.plain_ac,
            "device": ctx.device.type, "metrics": str(workdir / "metrics.jsonl"), "info": str(workdir / "info.json")}


def command(nproc: int, job_path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(script_path()), "--job", str(job_path)]


def plain_fsdp_row(run: RowRun) -> TrainRow:
    """Run the loop on the bench's ranks; the row with its figures, or its error."""
    opts, ctx, spec = run.opts, run.ctx, run.spec
    assert ctx.rows_dir is not None
    workdir = ctx.rows_dir / spec.name
    workdir.mkdir(parents=True, exist_ok=True)
    fields = job(run, workdir)
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(fields, indent=1), encoding="utf-8")
    cmd = command(ctx.nproc, job_path)
    env = dict(os.environ)
    if ctx.device.type == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    left = run.deadline_left_s
    timeout = opts.row_timeout_s if left is None else min(opts.row_timeout_s, left + 60)
    code, out, err = run_bounded(cmd, timeout, env=env, cwd=workdir)
    (workdir / "plain.log").write_text(out + err, encoding="utf-8")
    row = TrainRow(spec.name, spec.kind, nproc=ctx.nproc, log=str(workdir / "plain.log"),
                   config={"job": fields, "command": cmd})
    steps = read_metrics(workdir / "metrics.jsonl")
    info_path = workdir / "info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    if code is None:
        row.status, row.reason = "error", f"stopped after {timeout:.0f} s (its time limit)"
    elif code != 0:
        text = out + err
        row.status = "oom" if "OutOfMemoryError" in text or "CUDA out of memory" in text else "error"
        row.reason = f"exit {code}: {last_error(text)}"
    elif len(steps) < opts.steps:
        row.status, row.reason = "error", f"logged {len(steps)} of {opts.steps} steps"
    if steps:
        set_figures(row, [s["step_s"] for s in steps[1:]], ctx, opts.warmup)
        row.first_step_s, row.losses = steps[0]["step_s"], [s["loss"] for s in steps]
        row.loss_first, row.loss_last = row.losses[0], row.losses[-1]
    row.params, row.peak_mem_bytes = info.get("params"), info.get("peak_mem_bytes_max_rank")
    return row
