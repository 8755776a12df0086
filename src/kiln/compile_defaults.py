"""What `compile.enabled=true` alone means: the fastest recipe kiln measured for the model family.

Each entry was the fastest recipe that passed `kiln bench compile`'s accuracy check on a GPU, with
the results it came from committed under `benchmarks/results/`. It applies when the user asks for
speed and leaves the how to kiln: `compile.enabled=true` with every other compile key at its
default, one process that no DDP/FSDP wrapper wraps, a CUDA device, and
`compile.defaults=measured` (the default; `compile.defaults=torch` keeps torch.compile's own
defaults). Any compile key the user sets, a family without evidence, a CPU or several processes
leave the config as it is. So does a one-rank torchrun job with `distributed.strategy` ddp or fsdp
(how `kiln bench scale` measures a wrapper's own cost): the recipe's whole-step capture cannot
hold a wrapper's hooks and falls back, and regional compile without capture is slower than
torch's default there (benchmarks/results/h100/scale_1gpu: one-rank DDP 44.1 ms and FSDP2 64.0 ms
ran that way, against 22.8 ms for the captured step). The keys applied are logged and saved in the
run's config.toml, so a rerun resolves to the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kiln.config.schema import CompileConfig, Config
from kiln.distributed.strategy import wraps_one_rank


@dataclass(frozen=True)
class MeasuredRecipe:
    keys: dict[str, object]
    """compile.<key> values to set."""
    evidence: str
    """Where the measurement is committed, and what it showed."""


MEASURED: dict[str, MeasuredRecipe] = {
    "mlp": MeasuredRecipe(
        {"regional": True, "cudagraphs": True},
        "benchmarks/results/h100/speed_mlp: seed MLP b128 fp32 1.53 ms/step, 5.97x kiln eager and 3.1x the "
        "plain reduce-overhead loop in the same run; compile 2.6 s",
    ),
    "vit": MeasuredRecipe(
        {"cudagraphs": True},
        "benchmarks/results/h100/speed_vit_best and speed_vit_best_2026-11-25: ViT-B/16 b64 bf16-mixed, "
        "whole-model compile with whole-step capture 21.8-21.9 ms/step, the fastest accurate recipe at that "
        "precision (regional + capture 22.5 ms in speed_vit, plain reduce-overhead 22.7-22.8 ms); it compiles "
        "in ~27 s, compile.regional=true in ~4 s",
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


def apply_measured_defaults(cfg: Config, device_type: str, world_size: int, *, launched: bool = False) -> str | None:
    """Set the family's measured recipe on `cfg.compile` where it applies; returns a log line
    (also when a wrapper keeps it from applying). `launched`: the process runs under torchrun."""
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
    return (f"compile: kiln's measured recipe for {family(cfg.model.name)}: {shown} ({recipe.evidence}); "
            "compile.defaults=torch keeps torch's defaults")
