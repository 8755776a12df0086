"""What does the NVML GPU-health sampler cost the training step?

Builds the step `kiln train` runs (kiln.train.assemble.build_train_step, one fixed batch on the
device) and times it with kiln.timing in interleaved rounds, with the sampler off, at its
default 1 Hz, and at 20 Hz (20x the default work, to see the per-read cost above the noise).
Each sample lasts about `--sample-s` seconds so that every sample of an "on" side holds NVML
reads; the side order rotates every round. The goal for 1 Hz is "below noise": its ratio to
"off" within the round-to-round spread of "off" itself. Each round's "on"/"off" ratio pairs samples
taken seconds apart, so their median is reported beside the ratio of the pooled medians; the
direct cost (one read's time x reads per second) is the floor a sampler thread cannot go under.

    python benchmarks/nvml_overhead.py --config configs/seed_production.toml compile.enabled=false --out DIR

Writes DIR/results.json and DIR/results.md (rows: side, step ms, ratio vs off, per-round values).
`--fake-nvml` replaces NVML by a stub reader (CPU dry runs of this script only).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys

import torch

from kiln.bench.results import write_results
from kiln.config import load_config
from kiln.config.load import config_to_dict
from kiln.data import build_data
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.monitor.gpu_health import GpuHealthSampler, open_nvml_reader
from kiln.precision import apply_precision, resolve_precision, tf32_enabled
from kiln.runtime import resolve_device, seed_everything
from kiln.timing import measure, time_calls
from kiln.train.assemble import build_train_step


class FakeReader:
    static: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        return {"util": 50.0, "temp": 40.0}

    def close(self) -> None:
        pass


def reader_for(device: torch.device, fake: bool):
    if fake:
        return FakeReader()
    reader, reason = open_nvml_reader(device)
    if reader is None:
        raise SystemExit(f"nvml_overhead: NVML unavailable ({reason}); use --fake-nvml for a dry run")
    return reader


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--samples", type=int, default=2, help="timed samples per side per round")
    ap.add_argument("--sample-s", type=float, default=1.5, help="seconds per timed sample (sets steps per sample)")
    ap.add_argument("--fake-nvml", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    device = resolve_device(cfg.training.device)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model)
    policy = resolve_precision(cfg.precision.policy, device)
    model = apply_precision(built.module.to(device), policy)
    batch = next(iter(build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed)))
    step_fn = build_train_step(model, built.task, built.blocks, cfg, policy, device)

    def step() -> None:
        step_fn([batch])

    sides = {"off": None, "1 Hz": 1.0, "20 Hz": 0.05}
    per_side: dict[str, list[float]] = {s: [] for s in sides}
    rounds: dict[str, list[float]] = {s: [] for s in sides}
    reads: dict[str, list[int]] = {s: [] for s in sides}
    with tf32_enabled(cfg.precision.tf32):
        for _ in range(3):
            step()  # compile / warm-up
        probe = time_calls(step, calls=20, device=device) / 20
        calls = max(1, math.ceil(args.sample_s / probe))
        print(f"nvml_overhead: {probe * 1e3:.3f} ms/step; {calls} steps per sample", file=sys.stderr, flush=True)
        names = list(sides)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]  # rotate which side goes first
            for side in order:
                sampler = GpuHealthSampler(reader_for(device, args.fake_nvml), sides[side]).start() if sides[side] else None
                try:
                    timing = measure(step, warmup=2, repeats=args.samples, calls_per_sample=calls, device=device)
                finally:
                    if sampler is not None:
                        reads[side].append(sampler.fold()["gpu_health_samples"])
                        sampler.close()
                ms = [s / calls * 1e3 for s in timing.samples_s]
                per_side[side] += ms
                rounds[side].append(statistics.median(ms))
            print(f"round {r}: " + ", ".join(f"{s} {rounds[s][-1]:.3f} ms" for s in names), file=sys.stderr, flush=True)
        # The direct cost of one read, outside the training loop.
        reader = reader_for(device, args.fake_nvml)
        read_us = time_calls(reader.read, calls=50, device="cpu") / 50 * 1e6  # host work: no device sync
        reader.close()

    off = statistics.median(per_side["off"])
    off_rounds = rounds["off"]
    noise = (max(off_rounds) - min(off_rounds)) / statistics.median(off_rounds)
    rows = []
    for side in sides:
        ratios = [on / base for on, base in zip(rounds[side], off_rounds)]
        rows.append({
            "status": "ok", "side": side, "step_ms": statistics.median(per_side[side]),
            "ratio_vs_off": statistics.median(per_side[side]) / off,
            "round_ratio_min": min(ratios), "round_ratio_max": max(ratios),
            "off_round_spread": noise, "round_ms": rounds[side], "nvml_reads": sum(reads[side]),
            "round_ratio_median": statistics.median(ratios),
            "direct_cost_pct": 100 * read_us * 1e-6 / sides[side] if sides[side] else 0.0,
            "read_us": read_us if sides[side] else None, "steps_per_sample": calls,
            "reader": "fake" if args.fake_nvml else "nvml",
        })
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    write_results(args.out, env=collect_env(), config=config_to_dict(cfg), results=rows, command=command,
                  title=f"NVML sampler overhead: {cfg.model.name}, batch {cfg.data.batch_size}, "
                        f"{cfg.precision.policy}, compile {'on' if cfg.compile.enabled else 'off'}",
                  columns=["side", "step_ms", "ratio_vs_off", "round_ratio_median", "round_ratio_min", "round_ratio_max",
                           "direct_cost_pct",
                           "off_round_spread", "nvml_reads", "read_us", "steps_per_sample", "reader"])
    for row in rows:
        print(f"{row['side']:>6}: {row['step_ms']:.3f} ms/step, ratio vs off {row['ratio_vs_off']:.4f} "
              f"(paired rounds: median {row['round_ratio_median']:.4f}, "
              f"{row['round_ratio_min']:.4f}-{row['round_ratio_max']:.4f}), {row['nvml_reads']} NVML reads, "
              f"direct cost {row['direct_cost_pct']:.4f}% of wall time")
    print(f"round-to-round spread of 'off': {100 * noise:.2f}%; one NVML read: {read_us:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
