"""Planning `kiln bench compile`: matrix expansion, presets, recipe -> config, validation."""

from __future__ import annotations

import pytest
import torch

from kiln.bench.compile.recipes import Axes, Recipe, check_axes, cuda_graph_reason, expand_matrix, recipe_config
from kiln.bench.compile.seed_presets import PRESETS, plan_preset
from kiln.config import Config, ConfigError


def _compiled(rows):
    return [r for r in rows if r.compiled]


def test_matrix_has_eager_per_precision_and_modes_only_for_inductor():
    axes = Axes(modes=["default", "reduce-overhead"], precisions=["bf16-mixed"], backends=["inductor", "aot_eager"],
                scopes=["model", "model+loss"])
    rows = expand_matrix(axes)
    # eager fp32 is added: it is the reference of speedup_vs_eager_fp32
    assert rows[0] == Recipe.eager("fp32") and Recipe.eager("bf16-mixed") in rows
    compiled = _compiled(rows)
    assert len(compiled) == 2 * 2 + 1 * 2  # inductor: 2 modes x 2 scopes; aot_eager: default x 2 scopes
    assert {r.mode for r in compiled if r.backend == "aot_eager"} == {"default"}
    assert len(set(rows)) == len(rows)


def test_seed001_plan_reproduces_the_articles_tables():
    preset, axes, rows = plan_preset("seed001-vit")
    assert "model.name=vit" in preset.overrides and "model.kwargs.depth=12" in preset.overrides
    got = {(r.precision, r.mode, r.backend, r.scope, r.loss) for r in rows}
    for precision in ("fp32", "bf16-mixed"):  # AMP/FP32 x eager/compile
        assert (precision, "eager", None, None, "task") in got
        assert (precision, "default", "inductor", "model", "task") in got
    assert ("bf16-mixed", "reduce-overhead", "inductor", "model", "task") in got  # modes at AMP
    assert ("bf16-mixed", "default", "aot_eager", "model", "task") in got  # backends at AMP
    assert ("bf16-mixed", "default", "cudagraphs", "model", "task") in got
    for scope in ("model", "model/loss", "model+loss"):  # loss eager / alone / in the graph
        assert ("bf16-mixed", "default", "inductor", scope, "distill") in got
    assert ("bf16-mixed", "eager", None, None, "distill") in got and ("fp32", "eager", None, None, "distill") in got
    assert not any(r.mode.startswith("max-autotune") for r in rows)  # opt-in: they tune for minutes
    assert len(rows) == 12


def test_seed000_plan_is_every_compile_level():
    _, _, rows = plan_preset("seed000-levels")
    assert [r.mode for r in _compiled(rows)] == [
        "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
    assert {r.precision for r in _compiled(rows)} == {"bf16-mixed"}
    assert Recipe.eager("fp32") in rows and Recipe.eager("bf16-mixed") in rows
    assert "model.kwargs.hidden_size=1024" in PRESETS["seed000-levels"].overrides


def test_preset_axes_given_by_flags_replace_the_defaults():
    _, axes, rows = plan_preset("seed001-vit", {"precisions": ["fp32"], "backends": ["aot_eager"],
                                                "losses": ["distill"], "scopes": ["model+loss"]})
    assert axes.modes == ["default", "reduce-overhead"]
    assert rows == [Recipe.eager("fp32", "distill"), Recipe("fp32", "default", "aot_eager", "model+loss", "distill")]


def test_recipe_config_maps_scopes_and_modes():
    base = Config()
    base.compile.regional = True
    cfg = recipe_config(base, Recipe("bf16-mixed", "max-autotune", "inductor", "model/loss"))
    assert (cfg.compile.enabled, cfg.compile.mode, cfg.compile.scope) == (True, "max-autotune", "model")
    assert cfg.precision.policy == "bf16-mixed" and base.precision.policy == "fp32"  # base untouched
    cfg = recipe_config(base, Recipe("fp32", "default", "aot_eager", "step"))
    assert (cfg.compile.mode, cfg.compile.backend, cfg.compile.scope, cfg.compile.regional) == (
        "", "aot_eager", "step", False)
    base.compile.options = {"coordinate_descent_tuning": True}
    cfg = recipe_config(base, Recipe("fp32", "default", "inductor", "model"))
    assert cfg.compile.mode == "" and cfg.compile.options  # `default` keeps the config's inductor options
    assert not recipe_config(base, Recipe.eager("fp32")).compile.enabled


def test_cuda_graph_recipes_are_recognised():
    assert "triton.cudagraphs" in cuda_graph_reason(Recipe("fp32", "reduce-overhead", "inductor", "model"))
    assert cuda_graph_reason(Recipe("fp32", "max-autotune", "inductor", "model"))
    assert cuda_graph_reason(Recipe("fp32", "default", "cudagraphs", "model"))
    assert cuda_graph_reason(Recipe("fp32", "max-autotune-no-cudagraphs", "inductor", "model")) is None
    assert cuda_graph_reason(Recipe.eager("fp32")) is None


@pytest.mark.parametrize(
    ("axes", "needles"),
    [
        (Axes(modes=["max-performance"]), ["--modes", "max-autotune"]),
        (Axes(backends=["nvfuser"]), ["--backends", "removed", "inductor"]),
        (Axes(backends=["tensorrt_typo"]), ["--backends", "unknown backend"]),
        (Axes(precisions=["fp8"]), ["--precisions", "bf16-mixed"]),
        (Axes(scopes=["all"]), ["--scopes", "model+loss"]),
        (Axes(losses=["mse"]), ["--losses", "distill"]),
        (Axes(modes=[]), ["--modes"]),
    ],
)
def test_bad_axis_values_name_the_flag_and_the_choices(axes, needles):
    with pytest.raises(ConfigError) as info:
        check_axes(axes, Config())
    for needle in needles:
        assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_distillation_loss_is_kd_plus_ce_and_trains_only_the_student():
    from kiln.bench.compile.distill import DistillationLoss, teacher_config
    from kiln.config import ModelConfig

    assert teacher_config(ModelConfig(name="vit", kwargs={"depth": 12})).kwargs["depth"] == 24
    torch.manual_seed(0)
    teacher = torch.nn.Linear(6, 5)
    inputs, targets = torch.randn(4, 6), torch.tensor([0, 1, 2, 3])
    student = torch.randn(4, 5, requires_grad=True)
    loss = DistillationLoss(teacher, temperature=2.0, alpha=0.5)(inputs, student, targets)
    with torch.no_grad():
        p_t = torch.softmax(teacher(inputs) / 2, -1)
        kl = (p_t * (p_t.log() - torch.log_softmax(student / 2, -1))).sum(-1).mean()
        expected = 0.5 * 4 * kl + 0.5 * torch.nn.functional.cross_entropy(student, targets)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert student.grad is not None and all(p.grad is None for p in teacher.parameters())


def test_switches_and_plain_twins_expand_each_recipe():
    axes = Axes(modes=["reduce-overhead"], precisions=["fp32"], scopes=["model", "step"], cudagraphs=["off", "on"],
                regional=["off", "on"], baselines=["plain"])
    labels = [r.label for r in expand_matrix(axes)]
    assert labels == [
        "fp32 task eager",
        "fp32 task eager+cudagraphs",
        "fp32 task plain eager",
        "fp32 task inductor/reduce-overhead/model",
        "fp32 task inductor/reduce-overhead/model+cudagraphs",
        "fp32 task inductor/reduce-overhead/model+regional",
        "fp32 task inductor/reduce-overhead/model+regional+cudagraphs",
        "fp32 task plain inductor/reduce-overhead",
        "fp32 task inductor/reduce-overhead/step",  # regional needs scope model; no plain twin for step
        "fp32 task inductor/reduce-overhead/step+cudagraphs",
    ]
    rows = expand_matrix(axes)
    assert [r for r in rows if r.is_baseline] == [Recipe.eager("fp32")]
    captured = recipe_config(Config(), rows[4])
    assert captured.compile.cudagraphs and captured.compile.mode == "reduce-overhead"
    assert recipe_config(Config(), rows[5]).compile.regional is True
    assert cuda_graph_reason(rows[1]).startswith("whole-step capture")


def test_presets_take_the_switches_too():
    _, _, rows = plan_preset("seed000-levels", {"modes": ["reduce-overhead"], "precisions": ["fp32"],
                                                "cudagraphs": ["on"], "baselines": ["plain"]})
    assert [r.label for r in rows] == [
        "fp32 task eager", "fp32 task eager+cudagraphs", "fp32 task plain eager",
        "fp32 task inductor/reduce-overhead/model+cudagraphs", "fp32 task plain inductor/reduce-overhead"]


@pytest.mark.parametrize(("field", "value", "flag"), [("cudagraphs", ["maybe"], "--cudagraphs"),
                                                      ("regional", ["yes"], "--regional"),
                                                      ("baselines", ["hand"], "--baseline")])
def test_switch_values_are_checked(field, value, flag):
    axes = Axes(**{field: value})
    with pytest.raises(ConfigError, match=flag):
        check_axes(axes, Config())


def test_regional_only_keeps_the_rows_that_cannot_be_regional():
    axes = Axes(modes=["default"], precisions=["fp32"], scopes=["model", "step"], regional=["on"])
    assert [r.label for r in expand_matrix(axes)] == [
        "fp32 task eager", "fp32 task inductor/default/model+regional", "fp32 task inductor/default/step"]
