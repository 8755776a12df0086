"""`compile.enabled=true` alone takes the family's measured recipe on one CUDA GPU, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.config import load_config
from kiln.train.compile_defaults import MEASURED, apply_measured_defaults, family


def _cfg(*overrides):
    return load_config(None, ["compile.enabled=true", *overrides])


def test_measured_recipe_applies_when_the_user_asks_only_for_speed():
    cfg = _cfg()
    note = apply_measured_defaults(cfg, "cuda", 1)
    assert cfg.compile.regional is False and cfg.compile.cudagraphs is True
    assert "compile.cudagraphs=true" in note and "results h100/autotune/mlp" in note


def test_the_log_line_names_gpu_shape_and_results_and_what_differs():
    measured = ["model.kwargs.hidden_size=1024", "model.kwargs.num_layers=24", "model.kwargs.num_classes=1000",
                "data.batch_size=128", "precision.policy=fp32"]
    cfg = _cfg(*measured)
    note = apply_measured_defaults(cfg, "cuda", 1, device_name="NVIDIA H100 80GB HBM3")
    assert "measured on NVIDIA H100 80GB HBM3 at hidden_size 1024, num_layers 24" in note
    assert "batch_size 128, precision fp32 (kiln's benchmark results h100/autotune/mlp" in note
    assert "not the measured shape" not in note and "is not the one measured" not in note
    other = _cfg(*measured[:-2], "data.batch_size=32")  # the default model shape is the seed's small MLP
    note = apply_measured_defaults(other, "cuda", 1, device_name="NVIDIA A100-SXM4-80GB")
    assert "this run is not the measured shape (batch_size=32 (measured 128))" in note
    assert "this GPU (NVIDIA A100-SXM4-80GB) is not the one measured" in note
    default = apply_measured_defaults(_cfg(), "cuda", 1)
    assert "hidden_size=256 (measured 1024)" in default and "num_layers=4 (measured 24)" in default


def test_vit_defaults_are_the_measured_vit_b16():
    cfg = _cfg("model.name=vit", "data.batch_size=64", "precision.policy=bf16-mixed")
    note = apply_measured_defaults(cfg, "cuda", 1)
    assert cfg.compile.cudagraphs and not cfg.compile.regional
    assert "speed_vit_best_repeat" in note and "not the measured shape" not in note


@pytest.mark.parametrize(("overrides", "device", "world"), [
    ([], "cpu", 1),                                   # no evidence on CPU
    ([], "cuda", 2),                                  # measured on one GPU only
    (["compile.mode=reduce-overhead"], "cuda", 1),    # the user chose how
    (["compile.scope=step"], "cuda", 1),
    (["compile.defaults=torch"], "cuda", 1),          # opted out
    (["model.name=hf:llama-tiny"], "cuda", 1),        # a family without evidence
])
def test_anything_else_leaves_the_config_alone(overrides, device, world):
    cfg = _cfg(*overrides)
    before = repr(cfg.compile)
    assert apply_measured_defaults(cfg, device, world) is None
    assert repr(cfg.compile) == before


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_one_rank_wrapper_keeps_torchs_defaults(strategy):
    """A one-rank torchrun job that names ddp/fsdp wraps the model: capture would fall back and
    leave regional compile alone, slower there than torch's default (scale_1gpu)."""
    cfg = _cfg(f"distributed.strategy={strategy}")
    before = repr(cfg.compile)
    note = apply_measured_defaults(cfg, "cuda", 1, launched=True)
    assert repr(cfg.compile) == before
    assert f"distributed.strategy={strategy}" in note and "defaults apply" in note
    # Without a launcher one process runs unwrapped (strategy none): the recipe applies.
    unwrapped = _cfg(f"distributed.strategy={strategy}")
    assert apply_measured_defaults(unwrapped, "cuda", 1) and unwrapped.compile.cudagraphs
    auto = _cfg()  # `auto` on one rank under torchrun is unwrapped too
    assert apply_measured_defaults(auto, "cuda", 1, launched=True) and auto.compile.cudagraphs


def test_compile_off_is_left_alone():
    cfg = load_config(None, [])
    assert apply_measured_defaults(cfg, "cuda", 1) is None and not cfg.compile.cudagraphs


def test_each_recipe_names_committed_results_whose_readme_tells_what_they_showed():
    """The evidence prose lives beside the results, not in src/: the machine's results README
    names each recipe's folder and what it measured."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    for name, recipe in MEASURED.items():
        assert (results / recipe.results).is_dir(), name
        machine = recipe.results.split("/", 1)[0]
        readme = (results / machine / "README.md").read_text(encoding="utf-8")
        assert f"`{recipe.results}`" in readme and f"`kiln.train.compile_defaults` `{name}`" in readme, name


def test_families():
    assert family("mlp") == "mlp" and family("vit") == "vit" and family("timm:resnet50") == "timm"
    assert family("hf:llama-tiny") == "hf" and family("my.py:build") == "user"
    assert set(MEASURED) <= {"mlp", "vit"}
