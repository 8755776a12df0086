"""Presets that reproduce the seed articles' tables, measured honestly: the same
rows, each timed against eager by kiln's one timing helper, with failures kept as rows.

A preset is a base configuration (config overrides, applied before the user's) plus a planner
that turns the axes (its defaults, or the flags the user gave) into rows. Users shrink a preset
with ordinary overrides (`model.kwargs.depth=2 data.batch_size=4`) and trim rows with the flags;
CI runs the very same planner on a tiny model.

- `seed001-vit` (seed 001, "torch.compile in practice"): ViT-B/16 fp32 vs bf16 autocast, each
  eager and compiled; the compile modes and backends at bf16; and a distillation loss computed
  eagerly (scope `model`), compiled as its own graph (`model/loss`) or inside the model's graph
  (`model+loss`). kiln's `vit` is used, not timm's, so the result does not depend on a timm
  release (same shapes and parameter count; `--model timm:vit_base_patch16_224` compares).
- `seed000-levels` (seed 000, "compile + distributed training"): the seed MLP at its production
  shapes (hidden 1024, 24 blocks, 1000 classes, batch 128) at every compile level, with compile
  times: default, reduce-overhead, max-autotune-no-cudagraphs, max-autotune.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.bench.compile.recipes import Axes, Recipe, variants, with_references
from kiln.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    overrides: tuple[str, ...]
    """Config overrides (dotted KEY=VALUE) applied before the user's own."""
    axes: Axes
    """Default axes; a flag the user gives replaces that axis."""
    plan: Callable[[Axes], list[Recipe]]
    train: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)


def _amp(precisions: list[str]) -> str:
    """The precision the seed calls AMP: the first non-fp32 one asked for (fp32 if none)."""
    return next((p for p in precisions if p != "fp32"), precisions[0])


def plan_seed001(axes: Axes) -> list[Recipe]:
    amp = _amp(axes.precisions)
    rows: list[Recipe] = []
    if "task" in axes.losses:
        # Table 1: AMP / FP32 x eager / compile (inductor, default mode, model compiled).
        for precision in axes.precisions:
            rows.append(Recipe.eager(precision))
            if "default" in axes.modes and "inductor" in axes.backends:
                rows.append(Recipe(precision, "default", "inductor", "model"))
        # Table 2: compile modes at AMP.
        if "inductor" in axes.backends:
            rows += [Recipe(amp, mode, "inductor", "model") for mode in axes.modes if mode != "default"]
        # Table 3: backends at AMP (each at its default settings).
        rows += [Recipe(amp, "default", backend, "model") for backend in axes.backends if backend != "inductor"]
    if "distill" in axes.losses:
        # Table 4: an expensive (distillation) loss left eager, compiled alone, or in the graph.
        backend = "inductor" if "inductor" in axes.backends else axes.backends[0]
        rows.append(Recipe.eager(amp, "distill"))
        rows += [Recipe(amp, "default", backend, scope, "distill") for scope in axes.scopes]
    return with_references(rows)


def plan_seed000(axes: Axes) -> list[Recipe]:
    rows: list[Recipe] = []
    for precision in axes.precisions:
        rows.append(Recipe.eager(precision))
        for backend in axes.backends:
            modes = axes.modes if backend == "inductor" else ["default"]
            rows += [Recipe(precision, mode, backend, scope) for mode in modes for scope in axes.scopes]
    return with_references(rows)


_VIT_B16 = (
    "model.name=vit",
    "model.kwargs.img_size=224",
    "model.kwargs.patch_size=16",
    "model.kwargs.embed_dim=768",
    "model.kwargs.depth=12",
    "model.kwargs.num_heads=12",
    "model.kwargs.num_classes=1000",
    "data.source=synthetic",
    "data.batch_size=64",
    # The seed's loop: Adam(W), no clipping, no LR warm-up; fused AdamW on CUDA (kiln's default).
    "optim.name=adamw",
    "optim.lr=1e-3",
    "optim.weight_decay=0.05",
    "optim.warmup_steps=0",
    "training.grad_clip=0",
    "precision.tf32=true",
)

_SEED_MLP_PRODUCTION = (
    "model.name=mlp",
    "model.kwargs.hidden_size=1024",
    "model.kwargs.num_layers=24",
    "model.kwargs.num_classes=1000",
    "model.kwargs.dropout=0.1",
    "data.source=synthetic",
    "data.batch_size=128",
    "optim.name=adamw",
    "optim.lr=1e-3",
    "optim.weight_decay=0.01",
    "training.grad_clip=1.0",
)

PRESETS: dict[str, Preset] = {
    "seed001-vit": Preset(
        name="seed001-vit",
        description="ViT-B/16: fp32 vs bf16 autocast x eager/compile, modes, backends, loss in/out of the graph",
        overrides=_VIT_B16,
        axes=Axes(
            modes=["default", "reduce-overhead"],
            precisions=["fp32", "bf16-mixed"],
            backends=["inductor", "aot_eager", "cudagraphs"],
            scopes=["model", "model/loss", "model+loss"],
            losses=["task", "distill"],
        ),
        plan=plan_seed001,
        notes=("max-autotune modes tune for minutes on ViT-B; add them with --modes",),
    ),
    "seed000-levels": Preset(
        name="seed000-levels",
        description="seed MLP (production shapes) at each compile level, with compile times",
        overrides=_SEED_MLP_PRODUCTION,
        axes=Axes(
            modes=["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"],
            precisions=["bf16-mixed"],
            backends=["inductor"],
            scopes=["model"],
            losses=["task"],
        ),
        plan=plan_seed000,
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError("--preset", f"unknown preset {name!r}", tuple(PRESETS))
    return PRESETS[name]


def plan_preset(name: str, given: dict[str, list[str]] | None = None) -> tuple[Preset, Axes, list[Recipe]]:
    """The preset's rows for its default axes with the user's axes (by name) swapped in."""
    preset = get_preset(name)
    axes = Axes(**{k: list(v) for k, v in vars(preset.axes).items()})
    for key, values in (given or {}).items():
        setattr(axes, key, list(values))
    # The regional / cudagraphs switches and plain twins apply to the rows the preset plans at the
    # precisions asked for (not to the eager fp32 reference row added for speedup_vs_eager_fp32).
    rows = [variant for row in preset.plan(axes)
            for variant in (variants(row, axes) if row.precision in axes.precisions else [row])]
    return preset, axes, with_references(list(dict.fromkeys(rows)))
