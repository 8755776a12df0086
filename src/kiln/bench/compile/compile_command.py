"""The library side of `kiln bench compile` (request: kiln.bench.compile.compile_request): `check_compile`
checks every flag, the config and each recipe before any model is built (a ConfigError naming the
flag or key, exit 2); `run_compile_job` runs the recipes and writes the results."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.bench.compile.compile_bench import CompileBenchOptions, run_compile_bench
from kiln.bench.compile.compile_report import write_compile_results
from kiln.bench.compile.compile_request import AXES, CompileRequest
from kiln.bench.compile.recipes import EAGER, Axes, check_axes, expand_matrix, recipe_config, split_values
from kiln.bench.compile.seed_presets import Preset, get_preset, plan_preset
from kiln.config import load_config
from kiln.config.validate import validate_compile
from kiln.errors import ConfigError
from kiln.monitor.env import collect_env
from kiln.precision import resolve_precision
from kiln.runtime import resolve_device


def _count(flag: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


@dataclass
class CompileJob:
    """A checked `kiln bench compile`: the recipes to time, and the preset they came from."""

    opts: CompileBenchOptions
    preset: Preset | None

    @property
    def name(self) -> str:
        return self.preset.name if self.preset else self.opts.cfg.model.name


def check_compile(req: CompileRequest, say: Callable[[str], None]) -> CompileJob:
    """The recipes `req` asks for; ConfigError on any bad input. `say` gets a note the user should see."""
    _count("--steps", req.steps, 1)
    _count("--warmup", req.warmup, 0)
    _count("--accuracy-steps", req.accuracy_steps, 0)
    preset = get_preset(req.preset) if req.preset else None
    overrides = list(preset.overrides) if preset else []
    if req.model:
        overrides.append(f"model.name={req.model}")
    overrides += list(req.overrides)
    if req.batch_size is not None:
        _count("--batch-size", req.batch_size, 1)
        overrides.append(f"data.batch_size={req.batch_size}")
    if req.device:
        overrides.append(f"training.device={req.device}")
    cfg = load_config(req.config, overrides)
    given = {k: split_values(getattr(req, k)) for k in AXES if getattr(req, k) is not None}
    eager_only = False
    if "modes" in given and EAGER in given["modes"]:
        # Eager is every table's baseline, always run: asking for it is fine, not an error.
        given["modes"] = [m for m in given["modes"] if m != EAGER]
        eager_only = not given["modes"]
        say(f"kiln: --modes {EAGER}: eager is always run as the baseline of each precision"
            + ("; running the eager rows only" if eager_only else "; not a compile mode, ignored"))
    if preset:
        _, axes, recipes = plan_preset(preset.name, given)
    else:
        # Without flags, the config's own recipe against eager.
        axes = Axes(modes=[cfg.compile.mode or "default"], precisions=[cfg.precision.policy],
                    backends=[cfg.compile.backend], scopes=[cfg.compile.scope])
        for key, values in given.items():
            setattr(axes, key, values)
        recipes = []
    check_axes(axes, cfg, eager_only=eager_only)
    if not preset:
        recipes = expand_matrix(axes)
    if eager_only:
        recipes = [r for r in recipes if not r.compiled]
    for recipe in recipes:
        if recipe.compiled:
            validate_compile(recipe_config(cfg, recipe))
    device = resolve_device(cfg.training.device)
    for precision in dict.fromkeys(r.precision for r in recipes):
        resolve_precision(precision, device)
    train = req.train if req.train is not None else (preset.train if preset else True)
    opts = CompileBenchOptions(cfg=cfg, recipes=recipes, train=train, steps=req.steps, warmup=req.warmup,
                               accuracy_steps=req.accuracy_steps, fresh_cache=not req.warm_cache,
                               warm_start=req.warm_start)
    return CompileJob(opts, preset)


def run_compile_job(job: CompileJob, out: Path, command: str, *, log: Callable[[str], None],
                    phase: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Path], str]:
    """Time the recipes and write the results into `out`: (rows, files written, title)."""
    opts, preset = job.opts, job.preset
    cfg = opts.cfg
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    run = "train" if opts.train else "infer"
    title = f"kiln bench compile: {cfg.model.name} ({run}, batch {cfg.data.batch_size}, {where})"
    if opts.train:  # the loop settings a plain loop pays for too
        title += (f"; grad_clip {cfg.training.grad_clip:g}, {cfg.optim.schedule} schedule, "
                  f"warm-up {cfg.optim.warmup_steps} steps")
    phase(f"building {cfg.model.name} ({run}) on {where}")
    rows = run_compile_bench(opts, log=log, phase=phase)
    config = {
        "base": dataclasses.asdict(cfg),
        "bench": {"preset": preset.name if preset else None, "train": opts.train, "steps": opts.steps,
                  "warmup": opts.warmup, "accuracy_steps": opts.accuracy_steps, "fresh_cache": opts.fresh_cache,
                  "warm_start": opts.warm_start,
                  "recipes": [dataclasses.asdict(r) for r in opts.recipes], "device": str(device)},
    }
    written = write_compile_results(out, rows, env=collect_env(), config=config, command=command, title=title)
    return rows, written, title
