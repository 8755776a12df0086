"""`kiln profile`: torch.profiler over a window of the training steps `kiln train` runs.

The run is a real kiln training run (kiln.train.Trainer: the same build, apply and step
functions), shortened to the window and with a step hook that opens and closes the profiler;
its output dir is a run dir (config.toml, metrics.jsonl, summary.json) plus the trace, the
memory snapshot and the profile summary (profile_summary.json and .md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kiln.config.load import load_config
from kiln.config.schema import Config
from kiln.config.validate import validate
from kiln.errors import ConfigError
from kiln.monitor.summary import write_summary
from kiln.profile.profile_request import ProfileRequest
from kiln.profile.profile_summary import render_markdown, summarise_trace
from kiln.profile.window import ProfilerWindow
from kiln.runtime import default_run_dir
from kiln.safe_io import write_atomic
from kiln.train.trainer import Trainer


def profile_config(cfg: Config, *, steps: int, warmup: int, memory_steps: int) -> Config:
    """The config of the profiled run: as given, shortened to the window, logging only at its
    ends (a log step synchronises the device), no eval, no checkpoints, no background sampler."""
    for flag, value, minimum in (("--steps", steps, 1), ("--warmup", warmup, 1), ("--memory-steps", memory_steps, 0)):
        if value < minimum:
            raise ConfigError(flag, f"must be >= {minimum}, got {value}")
    total = 2 + warmup + steps + memory_steps
    rep = dataclasses.replace
    cfg = rep(cfg,
              training=rep(cfg.training, steps=total, log_interval=total, eval_interval=0),
              optim=rep(cfg.optim, warmup_steps=min(cfg.optim.warmup_steps, total)),
              checkpoint=rep(cfg.checkpoint, interval=0, save_final=False, resume="never"),
              metrics=rep(cfg.metrics, tensorboard=False, gpu_health=False, prometheus=False))
    validate(cfg)
    return cfg


def profile_plan(request: ProfileRequest) -> tuple[Config, Path]:
    """The config `request` names (ConfigError -> exit 2 before any work, the window's flags too) and
    the output dir (--out, or a new run dir)."""
    cfg = load_config(request.config, request.overrides)
    profile_config(cfg, steps=request.steps, warmup=request.warmup, memory_steps=request.memory_steps)
    out = Path(request.out) if request.out else default_run_dir(f"profile-{cfg.model.name}")
    return cfg, out


def profile_run(cfg: Config, out: Path, *, steps: int, warmup: int, memory_steps: int) -> dict[str, Any] | None:
    """Profile and write the summary; returns it (None on ranks other than 0)."""
    cfg = profile_config(cfg, steps=steps, warmup=warmup, memory_steps=memory_steps)
    trainer = Trainer(cfg, out)  # bad input exits 2 here, before anything is written
    window = ProfilerWindow(out, trainer.device, warmup=warmup, steps=steps, memory_steps=memory_steps,
                            rank=trainer.dist.rank, world_size=trainer.dist.world_size)
    trainer.step_hook = window
    try:
        run = trainer.fit()
    finally:
        window.close()
    if run.get("stopped_by"):  # Ctrl-C (or SIGTERM) in the window: the profile stops, not only its run
        raise KeyboardInterrupt(f"stopped by {run['stopped_by']} after step {run.get('steps')}")
    if not trainer.dist.is_main:
        return None
    c = cfg.compile
    summary: dict[str, Any] = {
        "status": "ok",
        "model": cfg.model.name,
        "device": run["device"],
        "device_name": run["device_name"],
        "precision": cfg.precision.policy,
        "compile": (f"{c.mode or 'default'}/{c.scope}" + ("/cudagraphs" if getattr(c, "cudagraphs", False) else "")
                    if c.enabled else "off"),
        "strategy": run["strategy"],
        "world_size": run["world_size"],
        "batch_size": cfg.data.batch_size,
        "window": {"warmup": warmup, "steps": steps, "memory_steps": memory_steps, "wall_ms": window.window_s * 1e3,
                   "step_ms": window.window_s * 1e3 / steps},
        "trace": window.trace_path.name,
        **summarise_trace(window.trace_path, steps, trainer.device.type),
        "memory": window.memory,
    }
    write_summary(out / "profile_summary.json", summary)
    write_atomic(out / "profile_summary.md", render_markdown(summary))
    return summary
