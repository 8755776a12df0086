"""What one row of `kiln bench compile` runs: a recipe (mode, precision, backend, scope, loss),
the axes a matrix is expanded from, and their validation against the installed torch.

A recipe maps onto the same `Config` that `kiln train` takes (`recipe_config`), so every row is a
training (or inference) setting a user can run as is. Validation happens here, before any work:
an unknown value raises `ConfigError` naming the command-line flag and the valid choices.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kiln.config.errors import ConfigError
from kiln.config.schema import CHOICES, Config

EAGER = "eager"
PRECISIONS = CHOICES["precision.policy"]
# `model/loss`: the model and the loss compiled as two separate graphs (the seed article's
# "compile the loss function on its own"); the others are kiln's compile scopes.
SCOPES = ("model", "model/loss", "model+loss", "step")
# `task`: the model's own loss (cross-entropy for classifiers); `distill`: KL to a frozen
# teacher's softened logits + cross-entropy (kiln.bench.distill).
LOSSES = ("task", "distill")


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

    @property
    def compiled(self) -> bool:
        return self.mode != EAGER

    @property
    def label(self) -> str:
        if not self.compiled:
            return f"{self.precision} {self.loss} eager"
        return f"{self.precision} {self.loss} {self.backend}/{self.mode}/{self.scope}"

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
    from kiln.config.validate import compile_backends, validate_compile

    for flag, values, valid in (
        ("--precisions", axes.precisions, PRECISIONS),
        ("--scopes", axes.scopes, SCOPES),
        ("--losses", axes.losses, LOSSES),
    ):
        if not values:
            raise ConfigError(flag, "needs at least one value", valid)
        for value in values:
            if value not in valid:
                raise ConfigError(flag, f"unknown value {value!r}", valid)
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


def expand_matrix(axes: Axes) -> list[Recipe]:
    """Eager per (loss, precision), then every backend (modes apply to inductor only) x scope."""
    rows: list[Recipe] = []
    for loss in axes.losses:
        for precision in axes.precisions:
            rows.append(Recipe.eager(precision, loss))
            for backend in axes.backends:
                modes = axes.modes if backend == "inductor" else ["default"]
                for mode in modes:
                    for scope in axes.scopes:
                        rows.append(Recipe(precision, mode, backend, scope, loss))
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
    """Why a recipe needs CUDA graphs (mode or backend), or None."""
    if not recipe.compiled:
        return None
    if recipe.backend == "cudagraphs":
        return "backend cudagraphs records CUDA graphs"
    if recipe.backend == "inductor":
        import torch._inductor

        from kiln.config.validate import compile_modes

        options = torch._inductor.list_mode_options().get(recipe.mode, {}) if recipe.mode in compile_modes() else {}
        if options.get("triton.cudagraphs"):
            return f"mode {recipe.mode} uses CUDA graphs (triton.cudagraphs)"
    return None
