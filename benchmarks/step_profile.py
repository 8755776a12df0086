"""Where one training step's time goes: device busy time vs host time, and the host's top ops.

    python benchmarks/step_profile.py --config configs/vit_b16.toml --out DIR [--steps 10] [KEY=VALUE ...]

Builds the step exactly as `kiln train` does (kiln.train.assemble.build_train_step; with
`distributed.strategy=ddp|fsdp` inside a 1-rank process group, as `kiln bench scale` runs its 1-rank
points), warms it up (compilation included), then records `--steps` steps with torch.profiler. It
reports the wall time per step, the device-busy time per step (the union of kernel intervals) and
their ratio: a busy fraction well below 1 means the step waits for the host (Python, hooks,
dispatch), which no GPU speed can fix. The top host ops by self time say which. Writes
DIR/results.json and results.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import torch
import torch.distributed as dist

from kiln.bench.results import write_results
from kiln.config import load_config
from kiln.data import build_data
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.precision import apply_precision, resolve_precision
from kiln.runtime import resolve_device
from kiln.timing import time_calls
from kiln.train.assemble import build_train_step


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    device = resolve_device(cfg.training.device)
    strategy = cfg.distributed.strategy if cfg.distributed.strategy in ("ddp", "fsdp") else "none"
    if strategy != "none":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1, **kwargs)
    policy = resolve_precision(cfg.precision.policy, device)
    torch.manual_seed(cfg.training.seed)
    built = build_model(cfg.model)
    model = apply_precision(built.module.to(device), policy)
    batch = next(iter(build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed)))
    step = build_train_step(model, built.task, built.blocks, cfg, policy, device, strategy=strategy)

    def run() -> None:
        step([batch])

    warm_s = time_calls(run, calls=args.warmup, device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        wall = time_calls(run, calls=args.steps, device=device)
    events = prof.events()
    kernels = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_seconds(kernels) / 1e6 if kernels else None
    per_step_ms = wall / args.steps * 1e3
    summary = {"status": "ok", "kind": "summary", "name": args.name, "strategy": strategy,
               "wall_ms_per_step": per_step_ms, "warmup_s": warm_s,
               "device_busy_ms_per_step": busy / args.steps * 1e3 if busy is not None else None,
               "device_busy_frac": busy / wall if busy is not None else None,
               "kernels_per_step": len(kernels) / args.steps}
    rows = [summary]
    for avg in sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:args.top]:
        rows.append({"status": "ok", "kind": "host_op", "name": avg.key, "calls_per_step": avg.count / args.steps,
                     "self_cpu_ms_per_step": avg.self_cpu_time_total / 1e3 / args.steps})
    if strategy != "none":
        dist.destroy_process_group()
    busy_text = "n/a (no device kernels)" if busy is None else (
        f"{summary['device_busy_ms_per_step']:.2f} ms/step ({summary['device_busy_frac']:.0%})")
    print(f"{args.name}: {per_step_ms:.2f} ms/step wall, device busy {busy_text}")
    for r in rows[1:]:
        print(f"  {r['self_cpu_ms_per_step']:7.3f} ms/step  x{r['calls_per_step']:6.1f}  {r['name'][:90]}")
    write_results(args.out, env=collect_env(), config={"config": args.config, "overrides": args.overrides,
                                                        "steps": args.steps, "warmup": args.warmup},
                  results=rows, command="python " + shlex.join(sys.argv), title=f"Step profile: {args.name}",
                  columns=["kind", "name", "strategy", "wall_ms_per_step", "device_busy_ms_per_step", "device_busy_frac",
                           "kernels_per_step", "calls_per_step", "self_cpu_ms_per_step", "status"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
