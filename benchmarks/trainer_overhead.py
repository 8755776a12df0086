"""What does kiln's trainer cost over a minimal hand-written loop with the same settings?

Runs one config through `kiln.train.Trainer` and through the loop an engineer would write by hand
(same model class, same batch size, precision, compile settings, fused AdamW, clipping, LR
schedule; a fixed batch already on the device, the most favourable data path there is), in
alternating rounds in one process. Each side's step time is the median over intervals of
`--interval` steps bracketed by a device synchronize (the trainer logs at the same interval).

    python benchmarks/trainer_overhead.py --config configs/seed_production.toml --steps 300 --out DIR

Prints and writes `ratio = kiln step ms / hand-loop step ms` (goal <= 1.02) to DIR/results.json.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kiln.bench.results import write_results
from kiln.compile import compile_kwargs
from kiln.config import load_config
from kiln.config.load import config_to_dict
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.precision import autocast, resolve_precision, tf32_enabled
from kiln.runtime import resolve_device, seed_everything
from kiln.timing import time_calls
from kiln.train.optim import build_optimizer, build_scheduler
from kiln.train.trainer import train


def hand_loop(cfg, device: torch.device, steps: int, interval: int) -> list[float]:
    """The loop a user writes by hand. Returns per-step milliseconds of each timed interval."""
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model)
    policy = resolve_precision(cfg.precision.policy, device)
    model = built.module.to(device=device, dtype=policy.param_dtype)
    spec = built.input_spec
    batch = cfg.data.batch_size
    if spec.kind == "tokens":
        seq = cfg.data.seq_len or spec.shape[0]
        x = torch.randint(0, spec.vocab_size, (batch, seq), device=device)
        y = torch.randint(0, spec.vocab_size, (batch, seq), device=device)
    else:
        x = torch.randn(batch, *spec.shape, device=device, dtype=policy.param_dtype)
        y = torch.randint(0, spec.num_classes, (batch,), device=device)
    if cfg.compile.enabled:
        model = torch.compile(model, **compile_kwargs(cfg.compile))
    opt = build_optimizer(model, cfg.optim, device, param_dtype=policy.param_dtype)
    sched = build_scheduler(opt, cfg.optim, steps)
    loss_fn = torch.nn.functional.cross_entropy

    def step() -> None:
        with autocast(policy, device):
            out = model(x)
            logits = out if isinstance(out, torch.Tensor) else out.logits
            loss = loss_fn(logits.flatten(0, -2), y.flatten()) if spec.kind == "tokens" else loss_fn(logits, y)
        loss.backward()
        if cfg.training.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()

    step()  # first step: compile and warm-up, untimed as in the trainer
    out: list[float] = []
    done = 1
    while done < steps:
        n = min(interval, steps - done)
        out.append(time_calls(step, calls=n, device=device) / n * 1e3)
        done += n
    return out


def kiln_run(cfg, steps: int, interval: int, workdir: Path, tag: str) -> tuple[list[float], dict]:
    from dataclasses import replace

    cfg = replace(cfg, training=replace(cfg.training, steps=steps, log_interval=interval, eval_interval=0),
                  metrics=replace(cfg.metrics, console=False, tensorboard=False))
    run_dir = workdir / tag
    summary = train(cfg, run_dir)
    import json

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step_ms"] for r in records if not r.get("first_step")], summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--interval", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default=None, help="row name (default: the config file stem)")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    device = resolve_device(cfg.training.device)
    kiln_ms: list[float] = []
    hand_ms: list[float] = []
    rounds: dict[str, list[float]] = {"kiln": [], "hand": []}  # per-round medians: the spread is the noise
    summaries = []
    with tempfile.TemporaryDirectory() as tmp, tf32_enabled(cfg.precision.tf32):
        for r in range(args.rounds):
            # Alternate which side goes first so warm caches and clocks favour neither.
            order = ("kiln", "hand") if r % 2 == 0 else ("hand", "kiln")
            for side in order:
                if side == "kiln":
                    ms, summary = kiln_run(cfg, args.steps, args.interval, Path(tmp), f"r{r}")
                    kiln_ms += ms
                    summaries.append(summary)
                else:
                    ms = hand_loop(cfg, device, args.steps, args.interval)
                    hand_ms += ms
                rounds[side].append(statistics.median(ms))
                print(f"round {r} {side}: done", file=sys.stderr, flush=True)
    kiln_med, hand_med = statistics.median(kiln_ms), statistics.median(hand_ms)
    row = {
        "status": "ok",
        "name": args.name or Path(args.config).stem,
        "model": cfg.model.name,
        "precision": cfg.precision.policy,
        "compile": (cfg.compile.mode or "default") if cfg.compile.enabled else "off",
        "batch": cfg.data.batch_size,
        "kiln_step_ms": kiln_med,
        "hand_step_ms": hand_med,
        "ratio": kiln_med / hand_med,
        "kiln_round_ms": rounds["kiln"],
        "hand_round_ms": rounds["hand"],
        "kiln_intervals": len(kiln_ms),
        "hand_intervals": len(hand_ms),
        "kiln_first_step_s": statistics.median(s["first_step_s"] for s in summaries),
        "kiln_mfu": summaries[-1].get("mfu"),
        "final_loss": summaries[-1]["final_loss"],
        "first_loss": summaries[-1]["first_loss"],
    }
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    write_results(args.out, env=collect_env(), config=config_to_dict(cfg), results=[row], command=command,
                  title=f"Trainer overhead: {row['name']}",
                  columns=["name", "model", "precision", "compile", "batch", "kiln_step_ms", "hand_step_ms", "ratio",
                           "kiln_first_step_s", "kiln_mfu"])
    print(f"{row['name']}: kiln {kiln_med:.3f} ms/step, hand loop {hand_med:.3f} ms/step, ratio {row['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
