"""What `compile.enabled=true` alone means: the fastest recipe kiln measured for the model family.

Each entry is the fastest recipe that passed the accuracy check in the newest committed evidence
(`kiln bench compile` or `kiln autotune` results, named by their folder under the committed
results; what they showed is in that machine's results README), measured on one GPU at one shape; the log line names the GPU, the shape and the results, and says when the run's model,
batch, precision or GPU is not what was measured (the recipe is then expected, not measured, to
win). It applies when the user asks for speed and leaves the how to kiln: `compile.enabled=true` with every other compile key at its
default, one process that no DDP/FSDP wrapper wraps, a CUDA device, and
`compile.defaults=measured` (the default; `compile.defaults=torch` keeps torch.compile's own
defaults). Any compile key the user sets, a family without evidence, a CPU or several processes
leave the config as it is. So does a one-rank torchrun job with `distributed.strategy` ddp or fsdp
(how `kiln bench scale` measures a wrapper's own cost): the recipe's whole-step capture cannot
hold a wrapper's hooks and falls back, and regional compile without capture is slower than
torch's default there (the scale_1gpu results). The keys applied are logged and saved in the
run's config.toml, so a rerun resolves to the same run.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields

from kiln.config.schema import CompileConfig, Config
from kiln.models.registry import REGISTRY
from kiln.train.strategy import wraps_one_rank


@dataclass(frozen=True)
class MeasuredRecipe:
    keys: dict[str, object]
    """compile.<key> values to set."""
    gpu: str
    """The GPU it was measured on (as CUDA names it)."""
    shape: dict[str, object]
    """What was measured: model.kwargs values (factory defaults filled in), `batch_size`, `precision`."""
    results: str
    """The committed results the recipe comes from (the newest evidence): their folder under
    benchmarks' results directory, whose machine README says what they showed."""


MEASURED: dict[str, MeasuredRecipe] = {
    "mlp": MeasuredRecipe(
        {"cudagraphs": True},
        "NVIDIA H100 80GB HBM3",
        {"hidden_size": 1024, "num_layers": 24, "num_classes": 1000, "dropout": 0.1, "batch_size": 128,
         "precision": "fp32"},
        "h100/autotune/mlp",
    ),
    "vit": MeasuredRecipe(
        {"cudagraphs": True},
        "NVIDIA H100 80GB HBM3",
        {"img_size": 224, "patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12, "num_classes": 1000,
         "batch_size": 64, "precision": "bf16-mixed"},
        "h100/speed_vit_best_repeat",
    ),
}

_UNTOUCHED = CompileConfig()


def family(model_name: str) -> str:
    """`mlp`, `vit`, `timm`, `hf`, `llama` or `user` (a factory)."""
    if model_name in ("mlp", "vit"):
        return model_name
    return model_name.split(":", 1)[0] if model_name.startswith(("timm:", "hf:", "llama:")) else "user"


def _user_chose_how(c: CompileConfig) -> bool:
    """Any compile key other than `enabled`, `defaults`, the cache settings moved off its default."""
    skip = {"enabled", "defaults", "cache_dir", "save_cache"}
    return any(getattr(c, f.name) != getattr(_UNTOUCHED, f.name) for f in fields(c) if f.name not in skip)


def measured_shape(cfg: Config) -> dict[str, object]:
    """The run's values of the keys a recipe's `shape` names: model.kwargs with the factory's
    defaults filled in, the batch size and the precision policy."""
    entry = REGISTRY.get(cfg.model.name)
    params = inspect.signature(entry.factory).parameters if entry is not None else {}
    kwargs = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    return {**kwargs, **cfg.model.kwargs, "batch_size": cfg.data.batch_size, "precision": cfg.precision.policy}


def shape_differences(recipe: MeasuredRecipe, cfg: Config) -> list[str]:
    """`key=run value (measured: value)` for each measured key this run sets differently."""
    mine = measured_shape(cfg)
    return [f"{key}={mine.get(key)!r} (measured {value!r})" for key, value in recipe.shape.items()
            if mine.get(key) != value]


def evidence_line(recipe: MeasuredRecipe, cfg: Config, device_name: str | None) -> str:
    """Where the recipe was measured, and what differs in this run (shape, GPU)."""
    shown = ", ".join(f"{k} {v}" for k, v in recipe.shape.items())
    line = f"measured on {recipe.gpu} at {shown} (kiln's benchmark results {recipe.results}, docs/benchmarks.md)"
    caveats = shape_differences(recipe, cfg)
    if caveats:
        line += f"; this run is not the measured shape ({', '.join(caveats)}): the recipe is expected, not measured, to be fastest here"
    if device_name and device_name != recipe.gpu:
        line += f"; this GPU ({device_name}) is not the one measured"
    return line


def apply_measured_defaults(cfg: Config, device_type: str, world_size: int, *, launched: bool = False,
                            device_name: str | None = None) -> str | None:
    """Set the family's measured recipe on `cfg.compile` where it applies; returns a log line
    (also when a wrapper keeps it from applying). `launched`: the process runs under torchrun;
    `device_name`: the CUDA device's name, to say when it is not the GPU the recipe was measured on."""
    c = cfg.compile
    if not c.enabled or c.defaults != "measured" or _user_chose_how(c):
        return None
    recipe = MEASURED.get(family(cfg.model.name))
    if recipe is None or device_type != "cuda" or world_size > 1:
        return None
    if wraps_one_rank(cfg, world_size, launched):
        return (f"compile: kiln's measured recipe for {family(cfg.model.name)} is for an unwrapped step; with "
                f"distributed.strategy={cfg.distributed.strategy} torch.compile's defaults apply")
    for key, value in recipe.keys.items():
        setattr(c, key, value)
    shown = " ".join(f"compile.{k}={str(v).lower()}" for k, v in recipe.keys.items())
    return (f"compile: kiln's measured recipe for {family(cfg.model.name)}: {shown}, "
            f"{evidence_line(recipe, cfg, device_name)}; compile.defaults=torch keeps torch's defaults")
