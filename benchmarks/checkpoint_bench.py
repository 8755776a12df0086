"""Checkpoint cost: sync save time, async save time (blocking part and until complete), and how
much an in-flight async save slows the training steps that overlap it.

Builds the config's model through kiln's own path (build_train_step, the Checkpointer the
trainer uses), trains a few warm-up steps, then in one process:
  1. baseline step time (median over `--steps`, each step synchronized);
  2. `--saves` blocking saves, timed;
  3. `--saves` async saves: the call's blocking time (staging to host memory), then training
     steps run while the save completes in the background; their median step time over the
     baseline is the slowdown while saving.

    python benchmarks/checkpoint_bench.py --config configs/vit_b16.toml --out DIR [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kiln.bench.results import write_results
from kiln.checkpoint import AppState, Checkpointer
from kiln.config import load_config
from kiln.config.load import config_to_dict
from kiln.data import build_data
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.precision import apply_precision, resolve_precision, tf32_enabled
from kiln.runtime import resolve_device, seed_everything
from kiln.timing import synchronize, time_calls
from kiln.train.assemble import build_train_step


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--name", default=None)
    ap.add_argument("--steps", type=int, default=30, help="baseline steps")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    device = resolve_device(cfg.training.device)
    policy = resolve_precision(cfg.precision.policy, device)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model)
    model = apply_precision(built.module.to(device), policy)
    data = build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed)
    it = iter(data)
    with tf32_enabled(cfg.precision.tf32), tempfile.TemporaryDirectory() as tmp:
        step_fn = build_train_step(model, built.task, built.blocks, cfg, policy, device)

        def one_step() -> float:
            return time_calls(lambda: step_fn([next(it)]), calls=1, device=device)

        for _ in range(10):  # compile and warm up
            one_step()
        baseline = [one_step() for _ in range(args.steps)]
        rows = []
        for mode in ("sync", "async"):
            ck = Checkpointer(Path(tmp) / mode, replace(cfg.checkpoint, async_save=mode == "async", keep=1),
                              rank=0, world_size=1)
            app = AppState(step_fn.model, step_fn.optimizer, step_fn.scheduler, step_fn.scaler, data=data,
                           device=device)
            blocking, complete, during, steps_during = [], [], [], []
            for i in range(args.saves):
                synchronize(device)
                t = time.perf_counter()
                target = ck.save(1000 + i, app, block=mode == "sync")
                blocking.append(time.perf_counter() - t)
                n = 0
                while ck.in_flight():  # train while the save completes in the background
                    during.append(one_step())
                    n += 1
                ck.wait()
                complete.append(time.perf_counter() - t)
                steps_during.append(n)
            size = _dir_bytes(target)
            base_ms = statistics.median(baseline) * 1e3
            row = {
                "status": "ok", "model": args.name or cfg.model.name, "mode": mode,
                "precision": cfg.precision.policy, "checkpoint_bytes": size,
                "save_blocking_s": statistics.median(blocking), "save_complete_s": statistics.median(complete),
                "write_gb_s": size / statistics.median(complete) / 1e9,
                "baseline_step_ms": base_ms,
                "steps_overlapped": statistics.median(steps_during) if steps_during else 0,
                "step_ms_during_save": statistics.median(during) * 1e3 if during else None,
            }
            row["slowdown_during_save"] = (row["step_ms_during_save"] / base_ms) if during else None
            rows.append(row)
            print(row, flush=True)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    write_results(args.out, env=collect_env(), config=config_to_dict(cfg), results=rows, command=command,
                  title=f"Checkpoint save cost: {args.name or cfg.model.name}",
                  columns=["model", "mode", "precision", "checkpoint_bytes", "save_blocking_s", "save_complete_s",
                           "write_gb_s", "baseline_step_ms", "steps_overlapped", "step_ms_during_save",
                           "slowdown_during_save"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
