"""Every rule in kiln.config.validate, each with a failing and a passing case."""

from __future__ import annotations

import ast
import inspect
import re
import typing

import pytest
import torch._dynamo
import torch._inductor

from kiln.config import Config, ConfigError, apply_override, is_import_path, validate
from kiln.config import validate as validate_module
from kiln.config.choices import field_choices
from kiln.config.schema import DATA_SOURCES

CHOICES = field_choices()

SECTIONS = set(typing.get_type_hints(Config))


def make(*assignments: str) -> Config:
    cfg = Config()
    for a in assignments:
        apply_override(cfg, a)
    return cfg


def check(*assignments: str) -> None:
    validate(make(*assignments))


def error_of(*assignments: str) -> ConfigError:
    """The error loading these overrides gives: from validate, or already from the override (a
    switch, `bool | None`, refuses a value it cannot hold)."""
    with pytest.raises(ConfigError) as info:
        validate(make(*assignments))
    return info.value


def test_default_config_is_valid():
    validate(Config())


def test_config_error_is_a_value_error_with_key_and_choices():
    err = ConfigError("a.b", "bad", ["x", "y"])
    assert isinstance(err, ValueError)
    assert err.key == "a.b" and err.choices == ("x", "y")
    assert str(err) == "a.b: bad (valid: x, y)"
    long = ConfigError("k", "bad", [str(i) for i in range(45)])
    assert "... (5 more)" in str(long)
    assert str(ConfigError("k", "bad")) == "k: bad"


# --------------------------------------------------------------------------- closed choices


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_choice_rejects_unknown_value(key):
    err = error_of(f"{key}=bogus-value")
    assert err.key == key
    assert key in str(err)
    assert err.choices == CHOICES[key]
    for allowed in CHOICES[key]:
        assert allowed in str(err)


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, values in sorted(CHOICES.items()) for v in values])
def test_choice_accepts_each_valid_value(key, value):
    check(f"{key}={value}")


# --------------------------------------------------------------------------- ranges

# (key, smallest valid value, a value just below it)
LOWER_BOUNDS = [
    ("data.batch_size", "1", "0"),
    ("data.seq_len", "0", "-1"),
    ("data.synthetic_samples", "1", "0"),
    ("data.num_workers", "0", "-1"),
    ("data.prefetch_factor", "1", "0"),
    ("training.steps", "1", "0"),
    ("training.grad_accum_steps", "1", "0"),
    ("training.grad_clip", "0", "-0.1"),
    ("training.log_interval", "1", "0"),
    ("training.eval_interval", "0", "-1"),
    ("training.eval_steps", "1", "0"),
    ("optim.lr", "1e-12", "0"),
    ("optim.weight_decay", "0", "-0.01"),
    ("optim.eps", "0", "-1e-8"),
    ("optim.momentum", "0", "-0.1"),
    ("optim.warmup_steps", "0", "-1"),
    ("optim.min_lr_ratio", "0", "-0.1"),
    ("optim.decay_steps", "0", "-1"),
    ("metrics.peak_tflops", "0", "-1"),
    ("training.nonfinite_max_skips", "1", "0"),
    ("distributed.ddp_bucket_cap_mb", "0.001", "0"),
    ("distributed.fsdp_min_params", "1", "0"),
    ("distributed.fsdp_unit_blocks", "0", "-1"),
    ("distributed.fsdp_forward_prefetch", "0", "-1"),
    ("distributed.fsdp_backward_prefetch", "0", "-1"),
    ("distributed.replicate_degree", "1", "0"),
    ("checkpoint.interval", "0", "-1"),
    ("checkpoint.keep", "1", "0"),
    ("checkpoint.writer_threads", "1", "0"),
    ("metrics.straggler_margin", "0", "-0.1"),
    ("metrics.straggler_intervals", "1", "0"),
    ("metrics.prometheus_port", "0", "-1"),
    ("cpu.threads", "0", "-1"),
]


@pytest.mark.parametrize(("key", "ok", "bad"), LOWER_BOUNDS)
def test_lower_bound(key, ok, bad):
    check(f"{key}={ok}")
    err = error_of(f"{key}={bad}")
    assert err.key == key
    assert "must be" in str(err)


def test_replicate_degree_needs_fsdp():
    check("distributed.replicate_degree=2", "distributed.strategy=fsdp")
    err = error_of("distributed.replicate_degree=2", "distributed.strategy=ddp")
    assert err.key == "distributed.replicate_degree" and "distributed.strategy=fsdp" in str(err)


def test_lr_must_be_positive():
    for bad in ("0", "-1e-3"):
        assert error_of(f"optim.lr={bad}").key == "optim.lr"


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_distributed_timeout_must_be_positive(bad):
    check("distributed.timeout_s=0.5")
    assert error_of(f"distributed.timeout_s={bad}").key == "distributed.timeout_s"


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_gpu_health_period_must_be_positive(bad):
    check("metrics.gpu_health_period_s=0.25")
    assert error_of(f"metrics.gpu_health_period_s={bad}").key == "metrics.gpu_health_period_s"


def test_prometheus_port_upper_bound():
    check("metrics.prometheus_port=65535")
    assert error_of("metrics.prometheus_port=65536").key == "metrics.prometheus_port"


def test_min_lr_ratio_upper_bound():
    check("optim.min_lr_ratio=1")
    assert error_of("optim.min_lr_ratio=1.01").key == "optim.min_lr_ratio"


def _keys_of_type(tp: type) -> list[str]:
    sections = typing.get_type_hints(Config)
    return [
        f"{name}.{key}"
        for name, cls in sections.items()
        for key, key_tp in typing.get_type_hints(cls).items()
        if key_tp is tp
    ]


FLOAT_KEYS = _keys_of_type(float)


def test_float_keys_found():
    assert {"optim.lr", "training.grad_clip", "metrics.peak_tflops"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_floats_rejected(key, text):
    # NaN compares false with every bound, so it used to pass all range checks.
    err = error_of(f"{key}={text}")
    assert err.key == key
    assert "finite" in str(err)


def test_non_finite_float_from_file_rejected(write_toml):
    from kiln.config import load_config

    for text in ("nan", "inf", "+inf", "-nan"):
        with pytest.raises(ConfigError) as info:
            load_config(write_toml(f"[optim]\nlr = {text}\n"))
        assert info.value.key == "optim.lr"


# --------------------------------------------------------------------------- betas, warm-up, device


@pytest.mark.parametrize("betas", ["[0.9, 0.95]", "[0, 0.999]", "[0.0, 0.0]"])
def test_betas_ok(betas):
    check(f"optim.betas={betas}")


@pytest.mark.parametrize(
    "betas", ["[0.9]", "[]", "[0.9, 0.99, 0.999]", "[1.0, 0.9]", "[-0.1, 0.9]", "[0.9, nan]", "[0.9, inf]"]
)
def test_betas_rejected(betas):
    err = error_of(f"optim.betas={betas}")
    assert err.key == "optim.betas"
    assert "[0, 1)" in str(err)


def test_warmup_longer_than_training():
    check("training.steps=10", "optim.warmup_steps=10")
    err = error_of("training.steps=10", "optim.warmup_steps=11")
    assert err.key == "optim.warmup_steps"
    assert "training.steps" in str(err)
    # With a schedule span of its own (a run trained longer), the warm-up fits in that span.
    check("training.steps=20", "optim.decay_steps=10", "optim.warmup_steps=10")
    err = error_of("training.steps=20", "optim.decay_steps=10", "optim.warmup_steps=11")
    assert err.key == "optim.warmup_steps" and "optim.decay_steps: 10" in str(err)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_ok(device):
    check(f"training.device={device}")


@pytest.mark.parametrize(
    "device", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:0\n", "cuda:\u0661", "mps", "", " cpu"]
)
def test_device_rejected(device):
    err = error_of(f"training.device={device}")
    assert err.key == "training.device"
    assert err.choices == ("auto", "cpu", "cuda", "cuda:N")


# --------------------------------------------------------------------------- model and data


@pytest.mark.parametrize("name", ["", "   "])
def test_model_name_must_not_be_empty(name):
    assert error_of(f"model.name={name}").key == "model.name"


@pytest.mark.parametrize(
    "source", ["my_pkg.data:make_loader", "pkg:fn", "path/to/file.py:build", "./data.py:_private", "a-b/c.py:f2"]
)
def test_data_source_import_path_accepted(source):
    assert is_import_path(source)
    check(f"data.source={source}")


@pytest.mark.parametrize(
    "source", ["foo", "", "mod:", ":fn", "mod:1fn", "a b:fn", "mod:fn\n", "mod:fn-x", "mod:fn:g", "Synthetic", "mod.fn"]
)
def test_data_source_garbage_rejected(source):
    assert not is_import_path(source)
    err = error_of(f"data.source={source}")
    assert err.key == "data.source"
    assert err.choices == (*DATA_SOURCES, "module:function")


@pytest.mark.parametrize("source", ["files", "tokens", "imagefolder"])
def test_file_sources_need_a_path(source):
    err = error_of(f"data.source={source}")
    assert err.key == "data.path"
    assert source in str(err)


def test_files_needs_labels():
    err = error_of("data.source=files", "data.path=x.npy")
    assert err.key == "data.labels_path"
    check("data.source=files", "data.path=x.npy", "data.labels_path=y.npy")


@pytest.mark.parametrize("source", ["tokens", "imagefolder"])
def test_other_file_sources_need_no_labels(source):
    check(f"data.source={source}", "data.path=somewhere")


def test_synthetic_needs_no_path():
    check("data.source=synthetic")


# --------------------------------------------------------------------------- compile


def test_mode_that_torch_never_had_points_to_max_autotune():
    err = error_of("compile.mode=max-performance")
    assert err.key == "compile.mode"
    assert "compile.mode" in str(err)
    assert "max-autotune" in str(err)


@pytest.mark.parametrize(("mode", "hint"), [("max_autotune", "max-autotune"), ("reduce_overhead", "reduce-overhead")])
def test_underscore_modes_hint(mode, hint):
    assert f"'{hint}'" in str(error_of(f"compile.mode={mode}"))


def test_unknown_mode_lists_torch_modes():
    err = error_of("compile.mode=turbo")
    assert err.key == "compile.mode"
    assert set(err.choices) == set(torch._inductor.list_mode_options())
    assert "max-autotune" in str(err)


@pytest.mark.parametrize("mode", sorted(torch._inductor.list_mode_options()))
def test_every_torch_mode_accepted(mode):
    check(f"compile.mode={mode}")


def test_empty_mode_is_torch_default():
    check("compile.mode=")


@pytest.mark.parametrize("backend", ["nvfuser", "aot_nvfuser", "aot_ts_nvfuser"])
def test_removed_backend_points_to_inductor(backend):
    err = error_of(f"compile.backend={backend}")
    assert err.key == "compile.backend"
    assert "removed" in str(err)
    assert "'inductor'" in str(err)


def test_unknown_backend_lists_backends():
    err = error_of("compile.backend=tensorrt_typo")
    assert err.key == "compile.backend"
    assert set(err.choices) == set(torch._dynamo.list_backends(exclude_tags=()))
    assert "inductor" in err.choices


@pytest.mark.parametrize("backend", ["inductor", "eager", "aot_eager"])
def test_known_backend_accepted(backend):
    check(f"compile.backend={backend}")


def test_a_default_config_loads_without_importing_dynamo():
    """Every kiln process loads a config (a launcher and each of its ranks too): checking the
    default backend must not import torch._dynamo, seconds of start-up."""
    import subprocess
    import sys

    code = ("import sys; from kiln.config import load_config; load_config(None, ['compile.enabled=true']); "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_mode_and_options_are_exclusive():
    err = error_of("compile.mode=max-autotune", "compile.options.coordinate_descent_tuning=true")
    assert err.key == "compile.options"


def test_unknown_inductor_option_names_dotted_key():
    err = error_of("compile.options.bogus=1")
    assert err.key == "compile.options.bogus"
    assert "compile.options.bogus" in str(err)


def test_misspelt_inductor_option_suggests():
    err = error_of("compile.options.coordinate_descent_tunning=true")
    assert "coordinate_descent_tuning" in err.choices


@pytest.mark.parametrize(
    "option",
    ["coordinate_descent_tuning=true", "max_autotune=true", "triton.cudagraphs=false", "epilogue_fusion=false"],
)
def test_real_inductor_option_accepted(option):
    check(f"compile.options.{option}")


def test_nested_option_table():
    err = error_of("compile.options.triton={cudagraphs = true}")
    assert err.key == "compile.options.triton"
    assert "triton.cudagraphs" in str(err)
    err = error_of("compile.options.triton={cudagraphz = true}")
    assert err.key == "compile.options.triton.cudagraphz"


def test_options_need_inductor_backend():
    err = error_of("compile.backend=eager", "compile.options.coordinate_descent_tuning=true")
    assert err.key == "compile.options"
    assert "eager" in str(err)


def test_mode_needs_inductor_backend():
    err = error_of("compile.backend=aot_eager", "compile.mode=max-autotune")
    assert err.key == "compile.mode"
    check("compile.backend=aot_eager", "compile.mode=default")


def test_fullgraph_with_step_scope():
    err = error_of("compile.fullgraph=true", "compile.scope=step")
    assert err.key == "compile.fullgraph"
    check("compile.fullgraph=true", "compile.scope=model+loss")
    check("compile.fullgraph=false", "compile.scope=step")


@pytest.mark.parametrize("scope", ["model+loss", "step"])
def test_regional_needs_model_scope(scope):
    err = error_of("compile.regional=true", f"compile.scope={scope}")
    assert err.key == "compile.regional"
    assert "compile.scope=model" in str(err)


def test_regional_with_model_scope():
    check("compile.regional=true", "compile.scope=model")


def test_compile_checked_while_disabled_and_skipped_without_torch():
    cfg = make("compile.enabled=false", "compile.mode=max-performance")
    with pytest.raises(ConfigError):
        validate(cfg)
    validate(cfg, check_torch=False)


# --------------------------------------------------------------------------- coverage guard


def _keys_named_in_validate() -> set[str]:
    """Every dotted config key written as a string literal in validate.py."""
    pattern = re.compile(rf"({'|'.join(sorted(SECTIONS))})\.[a-z_]+")
    tree = ast.parse(inspect.getsource(validate_module))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.fullmatch(node.value)
    }


TESTED_KEYS = (
    set(CHOICES)
    | {key for key, _, _ in LOWER_BOUNDS}
    | {
        "model.name",
        "data.source",
        "data.path",
        "data.labels_path",
        "optim.betas",
        "optim.lr",
        "optim.min_lr_ratio",
        "optim.warmup_steps",
        "training.device",
        "compile.mode",
        "compile.backend",
        "compile.options",
        "compile.fullgraph",
        "compile.regional",
        "distributed.timeout_s",
        "metrics.gpu_health_period_s",
    }
)


def test_every_key_validate_checks_has_a_test_here():
    untested = _keys_named_in_validate() - TESTED_KEYS
    assert not untested, f"validate.py checks {sorted(untested)}; add tests for them in this module"


@pytest.mark.parametrize("value", ["99999999999999999999999", "1_000_000_001"])
def test_absurd_step_counts_are_refused_naming_the_limit(bad_input, tmp_path, value):
    err = bad_input(["train", "--run-dir", str(tmp_path / "run"), f"training.steps={value}"], ["training.steps"])
    assert "1_000_000_000" in err or "64-bit" in err
    assert not (tmp_path / "run").exists()
