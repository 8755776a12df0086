"""GPU idle gaps of one training step, eager vs compile recipes: the launch-bound signature.

Runs `kiln profile` (its own process per recipe: separate compile caches and CUDA-graph pools)
on one config for each recipe, then tabulates from each profile_summary.json: step time, kernels
per step, GPU busy and idle time per step, the idle fraction, gaps per step and the largest gap,
and the Triton and matmul shares. A recipe whose config keys this kiln does not know (e.g.
`compile.cudagraphs` before whole-step capture lands) becomes a `skipped` row with the reason.

    python benchmarks/profile_modes.py --config configs/seed_production.toml --out DIR

Writes DIR/<recipe>/ (each a kiln profile dir) and DIR/results.json + results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from kiln.bench.results import write_results
from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.monitor.env import collect_env

RECIPES = {
    "eager": ["compile.enabled=false"],
    "reduce-overhead": ["compile.enabled=true", "compile.mode=reduce-overhead", "compile.scope=model"],
    "whole-step capture": ["compile.enabled=true", "compile.mode=default", "compile.scope=step",
                           "compile.cudagraphs=true"],
}
COLUMNS = ["recipe", "status", "step_ms", "kernels_per_step", "busy_ms_per_step", "idle_ms_per_step", "idle_frac",
           "gaps_per_step", "largest_gap_us", "triton_share", "matmul_share", "first_step_s", "reason"]


def row_from(recipe: str, out: Path) -> dict:
    prof = json.loads((out / "profile_summary.json").read_text())
    run = json.loads((out / "summary.json").read_text())
    row = {"recipe": recipe, "status": "ok", "step_ms": prof["window"]["step_ms"], "first_step_s": run.get("first_step_s"),
           "dir": out.name}
    gpu = prof["gpu"]
    if gpu.get("status") == "ok":
        idle = gpu["idle"]
        row.update(kernels_per_step=gpu["kernels_per_step"], busy_ms_per_step=idle["busy_ms_per_step"],
                   idle_ms_per_step=idle["idle_ms_per_step"], idle_frac=idle["idle_frac"],
                   gaps_per_step=idle["gaps_per_step"],
                   largest_gap_us=max((g["us"] for g in idle["largest_gaps"]), default=None),
                   triton_share=gpu["by_kind"]["triton"]["share"], matmul_share=gpu["by_kind"]["matmul"]["share"])
    else:
        row["reason"] = f"GPU figures n/a: {gpu.get('reason')}"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated subset of {list(RECIPES)}")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per recipe (compile included)")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for recipe in args.recipes.split(","):
        over = [*args.overrides, *RECIPES[recipe]]
        try:
            load_config(args.config, over)
        except ConfigError as exc:
            rows.append({"recipe": recipe, "status": "skipped", "reason": f"config not accepted here: {exc}"})
            print(f"profile_modes: {recipe}: skipped ({exc})", file=sys.stderr, flush=True)
            continue
        target = out / recipe.replace(" ", "_")
        cmd = [sys.executable, "-m", "kiln", "profile", "--out", str(target), "--steps", str(args.steps),
               "--warmup", str(args.warmup), *(["--config", args.config] if args.config else []),
               "metrics.console=false", *over]
        print(f"profile_modes: {recipe}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=os.environ.copy())
        except subprocess.TimeoutExpired:
            rows.append({"recipe": recipe, "status": "error", "reason": f"timed out after {args.timeout:.0f} s"})
            continue
        (out / f"{target.name}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["?"]
            status = "skipped" if proc.returncode == 2 else "error"
            rows.append({"recipe": recipe, "status": status, "reason": last[0][-300:]})
            continue
        row = row_from(recipe, target)
        row["wall_s"] = time.perf_counter() - started
        rows.append(row)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    cfg = load_config(args.config, args.overrides)
    write_results(out, env=collect_env(), config={"config": args.config, "overrides": args.overrides,
                                                  "steps": args.steps, "warmup": args.warmup, "recipes": RECIPES},
                  results=rows, columns=COLUMNS, command=command,
                  title=f"GPU idle gaps per training step: {cfg.model.name}, batch {cfg.data.batch_size}, "
                        f"{cfg.precision.policy}")
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
