"""What `kiln autotune` searches: the recipes of each stage, the score that ranks them, and the rules
that drop what cannot win.

A candidate is a `kiln bench compile` recipe (precision x compile mode x scope x regional x
whole-step capture), so every row the search measures is a setting `kiln train` can run
(`recipe_config`). Rows are ranked by `speedup_vs_eager_fp32`: each row is timed interleaved with
the same eager fp32 runner, so the ratio is free of the drift between rows measured minutes apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args

from kiln.bench.compile.recipes import EAGER, Recipe
from kiln.config.schema import Config, Scope

# Modes that autotune kernels: searched last, on the best recipe only, when the budget affords
# their compile (minutes: they benchmark kernel candidates while compiling).
EXPENSIVE_MODES = ("max-autotune-no-cudagraphs", "max-autotune")
# Modes that record CUDA graphs themselves (cudagraph trees): GPU only, and redundant under
# whole-step capture (kiln compiles them without their graphs inside its own).
GRAPH_MODES = ("reduce-overhead", "max-autotune")
SCOPES = get_args(Scope)
# A value is "clearly slower" when its best row is this much below the best: far outside the
# spread of interleaved medians, so dropping it does not drop a winner by noise.
PRUNE_MARGIN = 0.10
# The winner must beat the config's own recipe by this much, else the config stays as it is.
MIN_GAIN = 0.02


@dataclass
class Space:
    """The values the user allows (flags) on this device."""

    precisions: list[str]
    modes: list[str]
    scopes: list[str] = field(default_factory=lambda: list(SCOPES))
    regional: bool = True
    """Search regional compile (needs a model with repeated blocks)."""
    cudagraphs: bool = True
    """Search whole-step capture (needs CUDA and one process)."""

    @property
    def cheap_modes(self) -> list[str]:
        return [m for m in self.modes if m not in EXPENSIVE_MODES]

    @property
    def expensive_modes(self) -> list[str]:
        return [m for m in self.modes if m in EXPENSIVE_MODES]


def config_recipe(cfg: Config) -> Recipe:
    """The recipe a config runs as it is (the row every candidate must beat)."""
    c = cfg.compile
    if not c.enabled:
        return Recipe(cfg.precision.policy, cudagraphs=c.cudagraphs)
    return Recipe(cfg.precision.policy, c.mode or "default", c.backend, c.scope, cudagraphs=c.cudagraphs,
                  regional=c.regional and c.scope == "model")


def score(row: dict[str, Any] | None) -> float | None:
    """Speed relative to eager fp32 measured inside the row (higher is faster); None for a row that
    failed, was skipped or failed its accuracy check."""
    if not row or row.get("status") != "ok" or row.get("accuracy") == "fail":
        return None
    return row.get("speedup_vs_eager_fp32") or row.get("speedup")


def speed(row: dict[str, Any] | None, stage: str | None) -> float | None:
    """How a row ranks among rows of `stage` (higher is faster): in the confirm stage, steps per
    second of the row's own median (the finalists are timed one after another within a minute, and
    a launch-bound eager fp32 reference can scatter between them by more than the finalists
    differ); in the search stages, rows minutes apart, `score` (the ratio to eager fp32 taken
    inside the row). The two are different units: compare rows of two stages with `relative`."""
    if score(row) is None:
        return None
    if stage == "confirm":
        return 1e3 / row["step_ms"] if row.get("step_ms") else None
    return score(row)


def relative(row: dict[str, Any] | None, stage: str | None, other: dict[str, Any] | None,
             other_stage: str | None) -> float | None:
    """How many times faster `row` is than `other`: by their own medians when both are confirm rows,
    else by their ratios to eager fp32 (the one measure rows of different stages share)."""
    both_confirm = stage == other_stage == "confirm"
    a, b = speed(row, stage if both_confirm else None), speed(other, other_stage if both_confirm else None)
    return a / b if a and b else None


def clearly_slower(value: float | None, best: float | None, margin: float = PRUNE_MARGIN) -> bool:
    return value is None or (best is not None and value < best * (1 - margin))


def mode_candidates(space: Space, precisions: list[str]) -> list[Recipe]:
    return [Recipe(p, mode, "inductor", "model") for p in precisions for mode in space.cheap_modes]


def variant_candidates(best_by_mode: list[Recipe], space: Space, has_blocks: bool, on_gpu: bool,
                       precisions: list[str] | None = None) -> list[Recipe]:
    """Capture and regional variants of each surviving (precision, mode), in the order they are
    tried: capture, regional + capture (regional's per-block overhead is hidden once the step is
    one graph), then regional alone; and eager with capture per precision."""
    out: list[Recipe] = []
    capture = space.cudagraphs and on_gpu
    regional = space.regional and has_blocks
    for recipe in best_by_mode:
        if capture and recipe.mode not in GRAPH_MODES:
            out.append(dataclasses.replace(recipe, cudagraphs=True))
            if regional:
                out.append(dataclasses.replace(recipe, cudagraphs=True, regional=True))
        if regional:
            out.append(dataclasses.replace(recipe, regional=True))
    if capture:
        for precision in precisions or dict.fromkeys(r.precision for r in best_by_mode):
            out.append(Recipe(precision, cudagraphs=True))
    return out


def scope_candidates(best: Recipe, space: Space) -> list[Recipe]:
    """The best recipe with the loss (`model+loss`) or the whole step (`step`) compiled; regional
    compile applies to scope `model` only, so those candidates compile whole."""
    base = best if best.compiled else Recipe(best.precision, "default", "inductor", "model", cudagraphs=best.cudagraphs)
    return [dataclasses.replace(base, scope=scope, regional=False)
            for scope in ("step", "model+loss") if scope in space.scopes and scope != base.scope]


def expensive_candidates(best: Recipe, space: Space) -> list[Recipe]:
    """The expensive modes on the best recipe's settings (max-autotune records CUDA graphs itself:
    redundant under capture, and GPU only)."""
    if not best.compiled or best.backend not in (None, "inductor"):
        return []
    out = []
    for mode in space.expensive_modes:
        if mode in GRAPH_MODES and best.cudagraphs:
            continue
        out.append(dataclasses.replace(best, mode=mode))
    return out


def uses_cuda_graphs(recipe: Recipe) -> bool:
    return recipe.cudagraphs or recipe.mode in GRAPH_MODES


def describe(recipe: Recipe) -> str:
    """A short label in config terms: `bf16-mixed default/model +regional +capture`."""
    if recipe.mode == EAGER:
        head = f"{recipe.precision} eager"
    else:
        backend = "" if recipe.backend in (None, "inductor") else f"{recipe.backend}:"
        head = f"{recipe.precision} {backend}{recipe.mode}/{recipe.scope}"
    return head + (" +regional" if recipe.regional else "") + (" +capture" if recipe.cudagraphs else "")


def recipe_fields(recipe: Recipe) -> dict[str, Any]:
    """The recipe's keys as a `kiln bench compile` row carries them."""
    return {"precision": recipe.precision, "loss": recipe.loss, "mode": recipe.mode, "backend": recipe.backend,
            "scope": recipe.scope, "runner": recipe.runner, "cudagraphs": recipe.cudagraphs,
            "regional": recipe.regional}


def versus_default(trials: list[Any], trial: Any, default: Recipe, fallback: Any | None) -> float | None:
    """How many times faster `trial` is than the config's own recipe, as every table row and the
    decision read it: against the default's row of the same stage when there is one (confirm
    rows by their own medians), else against `fallback` (the default's first row) by ratios to
    eager fp32."""
    mine = next((t for t in trials if t.recipe == default and t.stage == trial.stage), fallback)
    return trial.faster_than(mine) if mine is not None else None
