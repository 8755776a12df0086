"""What one row of `kiln bench compile` runs: a recipe (mode, precision, backend, scope, loss),
the axes a matrix is expanded from, and their validation against the installed torch.

A recipe maps onto the same `Config` that `kiln train` takes (`recipe_config`), so every row is a
training (or inference) setting a user can run as is. Validation happens here, before any work:
an unknown value raises `ConfigError` naming the command-line flag and the valid choices.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import get_args

from kiln.config.schema import Config, Policy
from kiln.config.validate import compile_backends, compile_modes, validate_compile
from kiln.errors import ConfigError

EAGER = "eager"
PRECISIONS = get_args(Policy)
# `model/loss`: the model and the loss compiled as two separate graphs (the seed article's
# "compile the loss function on its own"); the others are kiln's compile scopes.
SCOPES = ("model", "model/loss", "model+loss", "step")
# `task`: the model's own loss (cross-entropy for classifiers); `distill`: KL to a frozen
# teacher's softened logits + cross-entropy (kiln.bench.compile.distill).
LOSSES = ("task", "distill")


RUNNERS = ("kiln", "plain")


@dataclass(frozen=True)
class Recipe:
    """One row: `mode` is `eager` for the uncompiled baseline, else a torch.compile mode."""

    precision: str
    mode: str = EAGER
    backend: str | None = None
    """torch.compile backend; None for eager rows."""
    scope: str | None = None
    """One of SCOPES; None for eager rows."""
    loss: str = "task"
    cudagraphs: bool = False
    """Whole-step CUDA-graph capture (compile.cudagraphs), with or without compile."""
    regional: bool = False
    """Compile each repeated block on its own (compile.regional, scope model)."""
    runner: str = "kiln"
    """`kiln` (the step `kiln train` runs) or `plain`: the loop a user writes by hand around
    `torch.compile(model, mode=...)` (kiln.bench.compile.plain), the baseline kiln must beat."""

    @property
    def compiled(self) -> bool:
        return self.mode != EAGER

    @property
    def is_baseline(self) -> bool:
        """The eager reference row of its precision (every other row is timed against it)."""
        return not self.compiled and not self.cudagraphs and self.runner == "kiln"

    @property
    def label(self) -> str:
        if self.runner == "plain":
            return f"{self.precision} {self.loss} plain " + (f"{self.backend}/{self.mode}" if self.compiled else "eager")
        extras = ("+regional" if self.regional else "") + ("+cudagraphs" if self.cudagraphs else "")
        if not self.compiled:
            return f"{self.precision} {self.loss} eager{extras}"
        return f"{self.precision} {self.loss} {self.backend}/{self.mode}/{self.scope}{extras}"

    @staticmethod
    def eager(precision: str, loss: str = "task") -> Recipe:
        return Recipe(precision=precision, loss=loss)


@dataclass
class Axes:
    """The values a matrix is the product of; presets give defaults, flags replace them."""

    modes: list[str] = field(default_factory=lambda: ["default"])
    precisions: list[str] = field(default_factory=lambda: ["fp32"])
    backends: list[str] = field(default_factory=lambda: ["inductor"])
    scopes: list[str] = field(default_factory=lambda: ["model"])
    losses: list[str] = field(default_factory=lambda: ["task"])
    cudagraphs: list[str] = field(default_factory=lambda: ["off"])
    """`off`, `on` (whole-step capture): each compiled recipe with and/or without it."""
    regional: list[str] = field(default_factory=lambda: ["off"])
    """`off`, `on`: scope-model recipes compiled whole and/or block by block."""
    baselines: list[str] = field(default_factory=list)
    """`plain`: add the hand-written loop with torch.compile(model, mode) for each mode."""


SWITCHES = ("off", "on")
BASELINES = ("plain",)


def split_values(raw: Iterable[str] | None) -> list[str] | None:
    """`["a,b", "c"]` (repeated and/or comma-separated flags) -> `["a", "b", "c"]`, order kept."""
    if raw is None:
        return None
    out: list[str] = []
    for item in raw:
        for value in item.split(","):
            value = value.strip()
            if value and value not in out:
                out.append(value)
    return out


def _reraise_as_flag(flag: str, exc: ConfigError) -> ConfigError:
    # validate_compile names the config key (compile.mode); on the command line the flag is at fault.
    message = str(exc).split(": ", 1)[-1]
    return ConfigError(flag, message)


def check_axes(axes: Axes, base: Config, *, eager_only: bool = False) -> None:
    """Raise ConfigError (naming the flag) for any value the installed torch or kiln lacks.
    `eager_only`: the user asked for `--modes eager` alone, so no compile mode is needed."""
    for flag, values, valid in (
        ("--precisions", axes.precisions, PRECISIONS),
        ("--scopes", axes.scopes, SCOPES),
        ("--losses", axes.losses, LOSSES),
        ("--cudagraphs", axes.cudagraphs, SWITCHES),
        ("--regional", axes.regional, SWITCHES),
    ):
        if not values:
            raise ConfigError(flag, "needs at least one value", valid)
        for value in values:
            if value not in valid:
                raise ConfigError(flag, f"unknown value {value!r}", valid)
    for value in axes.baselines:
        if value not in BASELINES:
            raise ConfigError("--baseline", f"unknown value {value!r}", BASELINES)
    if not axes.modes and not eager_only:
        raise ConfigError("--modes", "needs at least one value")
    if not axes.backends:
        raise ConfigError("--backends", "needs at least one value", compile_backends())
    probe = copy.deepcopy(base)
    probe.compile.options = {}
    probe.compile.fullgraph = False
    probe.compile.regional = False
    for mode in axes.modes:
        probe.compile.mode, probe.compile.backend = mode, "inductor"
        try:
            validate_compile(probe)
        except ConfigError as exc:
            raise _reraise_as_flag("--modes", exc) from None
    probe.compile.mode = ""
    for backend in axes.backends:
        probe.compile.backend = backend
        try:
            validate_compile(probe)
        except ConfigError as exc:
            raise _reraise_as_flag("--backends", exc) from None


def variants(recipe: Recipe, axes: Axes) -> list[Recipe]:
    """`recipe` under each regional / cudagraphs switch the axes ask for (regional needs scope
    `model`), then its plain hand-loop twin when `--baseline plain` (scope model, task loss)."""
    out = []
    can_be_regional = recipe.compiled and recipe.scope == "model"
    regionals = [r for r in dict.fromkeys(v == "on" for v in axes.regional) if can_be_regional or not r] or [False]
    for regional in regionals:
        for graphs in dict.fromkeys(v == "on" for v in axes.cudagraphs):
            out.append(dataclasses.replace(recipe, regional=regional, cudagraphs=graphs))
    if "plain" in axes.baselines and recipe.loss == "task" and recipe.scope in (None, "model"):
        out.append(dataclasses.replace(recipe, scope="model" if recipe.compiled else None, runner="plain"))
    return out


def expand_matrix(axes: Axes) -> list[Recipe]:
    """Eager per (loss, precision), then every backend (modes apply to inductor only) x scope,
    each under the regional/cudagraphs switches, with plain twins (see `variants`)."""
    rows: list[Recipe] = []
    for loss in axes.losses:
        for precision in axes.precisions:
            rows += variants(Recipe.eager(precision, loss), axes)
            for backend in axes.backends:
                modes = axes.modes if backend == "inductor" else ["default"]
                for mode in modes:
                    for scope in axes.scopes:
                        rows += variants(Recipe(precision, mode, backend, scope, loss), axes)
    return with_references(rows)


def with_references(rows: Sequence[Recipe]) -> list[Recipe]:
    """Add the eager rows every compiled row is compared with: eager at its precision and eager
    fp32 (the reference of `speedup_vs_eager_fp32`), each once per loss; duplicates dropped."""
    out: list[Recipe] = []
    for row in rows:
        needed = [Recipe.eager("fp32", row.loss), Recipe.eager(row.precision, row.loss), row]
        for item in needed:
            if item not in out:
                out.append(item)
    return out


def recipe_config(base: Config, recipe: Recipe) -> Config:
    """The Config that `kiln train` would run for this row (compile section set from the recipe)."""
    cfg = copy.deepcopy(base)
    cfg.precision.policy = recipe.precision
    c = cfg.compile
    c.enabled = recipe.compiled
    c.cudagraphs = recipe.cudagraphs
    c.regional = recipe.regional or (c.regional and recipe.runner == "kiln")
    if recipe.compiled:
        c.backend = recipe.backend or "inductor"
        # torch.compile takes a mode or options: `default` with options from the config keeps them.
        c.mode = recipe.mode if c.backend == "inductor" and not (recipe.mode == "default" and c.options) else ""
        if c.backend != "inductor":
            c.options = {}
        c.scope = "model" if recipe.scope in ("model", "model/loss") else (recipe.scope or "model")
        if c.scope != "model":
            c.regional = False
    return cfg


def cuda_graph_reason(recipe: Recipe) -> str | None:
    """Why a recipe needs CUDA graphs (mode, backend or whole-step capture), or None."""
    if recipe.cudagraphs:
        return "whole-step capture (compile.cudagraphs) records a CUDA graph"
    if not recipe.compiled:
        return None
    if recipe.backend == "cudagraphs":
        return "backend cudagraphs records CUDA graphs"
    if recipe.backend == "inductor":
        import torch._inductor

        options = torch._inductor.list_mode_options().get(recipe.mode, {}) if recipe.mode in compile_modes() else {}
        if options.get("triton.cudagraphs"):
            return f"mode {recipe.mode} uses CUDA graphs (triton.cudagraphs)"
    return None
