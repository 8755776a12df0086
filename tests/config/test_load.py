"""TOML loading, KEY=VALUE overrides (type conversion and errors) and the save/load round trip."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib

from kiln.config import Config, ConfigError, apply_override, dump_toml, load_config, save_config
from kiln.config.load import config_to_dict


def override(*assignments: str) -> Config:
    cfg = Config()
    for a in assignments:
        apply_override(cfg, a)
    return cfg


def error_of(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- TOML files


def test_no_file_gives_defaults():
    assert dataclasses.asdict(load_config()) == dataclasses.asdict(Config())


def test_sections_are_read(write_toml):
    path = write_toml(
        """
        [model]
        name = "mlp"
        task = "classification"

        [training]
        steps = 50
        device = "cpu"
        deterministic = true

        [optim]
        lr = 3e-4
        betas = [0.9, 0.95]
        schedule = "linear"

        [metrics]
        tensorboard = "false"
        """
    )
    cfg = load_config(path)
    assert cfg.model.task == "classification"
    assert cfg.training.steps == 50
    assert cfg.training.device == "cpu"
    assert cfg.training.deterministic is True
    assert cfg.optim.lr == 3e-4
    assert cfg.optim.betas == [0.9, 0.95]
    assert cfg.optim.schedule == "linear"
    assert cfg.metrics.tensorboard is False
    # Everything not in the file keeps its default.
    assert cfg.data == Config().data
    assert cfg.training.grad_accum_steps == Config().training.grad_accum_steps


def test_nested_dict_fields(write_toml):
    path = write_toml(
        """
        [model.kwargs]
        hidden_size = 64
        num_layers = 2
        activation = "gelu"
        dims = [1, 2, 3]

        [compile]
        enabled = true
        options = { coordinate_descent_tuning = true, "triton.cudagraphs" = false }
        """
    )
    cfg = load_config(path)
    assert cfg.model.kwargs == {"hidden_size": 64, "num_layers": 2, "activation": "gelu", "dims": [1, 2, 3]}
    assert cfg.compile.options == {"coordinate_descent_tuning": True, "triton.cudagraphs": False}


def test_dotted_inductor_option_as_nested_table_gets_a_hint(write_toml):
    # TOML turns an unquoted dotted key into nested tables; inductor wants the flat name.
    path = write_toml(
        """
        [compile.options]
        triton.cudagraphs = true
        """
    )
    err = error_of(load_config, path)
    assert err.key == "compile.options.triton"
    assert '"triton.cudagraphs"' in str(err)


def test_toml_numbers_convert_between_int_and_float(write_toml):
    path = write_toml(
        """
        [training]
        steps = 1e2
        grad_clip = 2
        """
    )
    cfg = load_config(path)
    assert cfg.training.steps == 100 and isinstance(cfg.training.steps, int)
    assert cfg.training.grad_clip == 2.0 and isinstance(cfg.training.grad_clip, float)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[training]\nsteps = 1.5\n", "training.steps"),
        ('[training]\nsteps = "many"\n', "training.steps"),
        ("[training]\nsteps = true\n", "training.steps"),
        ("[training]\ndeterministic = 1\n", "training.deterministic"),
        ('[optim]\nlr = "fast"\n', "optim.lr"),
        ("[optim]\nlr = true\n", "optim.lr"),
        ("[model]\nname = [1, 2]\n", "model.name"),
        ("[model]\nname = 1979-05-27\n", "model.name"),
        ("[model]\nkwargs = 5\n", "model.kwargs"),
        ('[optim]\nbetas = [0.9, "x"]\n', "optim.betas[1]"),
        ("[optim]\nbetas = { a = 1 }\n", "optim.betas"),
        ("[model.name]\nx = 1\n", "model.name"),
    ],
)
def test_wrong_type_in_file_names_the_key(write_toml, text, key):
    assert error_of(load_config, write_toml(text)).key == key


def test_unknown_key_in_file_names_dotted_key_and_suggests(write_toml):
    err = error_of(load_config, write_toml("[training]\nstesp = 5\n"))
    assert err.key == "training.stesp"
    assert "training.stesp" in str(err)
    assert "steps" in err.choices


def test_unknown_section_in_file_suggests(write_toml):
    path = write_toml("[trainig]\nsteps = 5\n")
    err = error_of(load_config, path)
    assert err.key == "trainig"
    assert "did you mean 'training'?" in str(err) and "training" in err.choices and "optim" in err.choices
    assert str(err).startswith(f"{path}: trainig: unknown section")


def test_an_unknown_key_suggests_close_ones_and_lists_every_key_of_its_section():
    from kiln.config.schema import TrainingConfig

    err = error_of(load_config, None, ["training.step=50"])
    every = sorted(f.name for f in dataclasses.fields(TrainingConfig))
    assert str(err) == (f"training.step: unknown key in [training]; did you mean 'steps'? "
                        f"(valid: {', '.join(every)})")
    assert len(every) > 5  # not only the close match


def test_errors_from_a_config_file_name_the_file(write_toml):
    path = write_toml("[training]\nsteps = \"many\"\n")
    assert str(error_of(load_config, path)).startswith(f"{path}: training.steps: expected an integer")
    path = write_toml("[compile]\nmode = \"fast\"\n")  # caught by validation, after the file is merged
    assert str(error_of(load_config, path)).startswith(f"{path}: compile.mode: unknown mode 'fast'")
    # The same bad value from an override is the override's: no file named.
    assert str(error_of(load_config, path, ["compile.mode=nope"])).startswith("compile.mode: unknown mode 'nope'")


def test_unknown_key_without_close_match_lists_all(write_toml):
    err = error_of(load_config, write_toml("[precision]\nzzzzzz = 1\n"))
    assert err.key == "precision.zzzzzz"
    assert set(err.choices) == {"policy", "tf32", "float8"}


def test_section_given_a_scalar(write_toml):
    err = error_of(load_config, write_toml("training = 5\n"))
    assert err.key == "training"
    assert "section" in str(err)


def test_invalid_toml_names_the_path(write_toml):
    path = write_toml("[training\nsteps = 5\n")
    err = error_of(load_config, path)
    assert err.key == str(path)
    assert str(path) in str(err)
    assert "TOML" in str(err)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.toml"
    err = error_of(load_config, path)
    assert str(path) in str(err)
    assert "not found" in str(err)


def test_directory_is_not_a_config_file(tmp_path):
    assert str(tmp_path) in str(error_of(load_config, tmp_path))


def test_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[model]\nname = "caf\xe9"\n')
    assert error_of(load_config, path).key == str(path)


def test_file_with_bom_loads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[training]\nsteps = 7\n")
    assert load_config(path).training.steps == 7


# Regressions: these escaped as RecursionError / ValueError / OverflowError.
@pytest.mark.parametrize(
    "text",
    [
        "[model.kwargs]\nx = " + "[" * 5000 + "]" * 5000 + "\n",
        "[model.kwargs]\nx = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
        "[training]\nsteps = 1" + "0" * 5000 + "\n",
        "[optim]\nlr = 1" + "0" * 400 + "\n",
        "[optim]\nbetas = [1" + "0" * 400 + ", 0.9]\n",
    ],
    ids=["deep-array", "deep-table", "int-over-digit-limit", "int-beyond-float-range", "list-int-beyond-float"],
)
def test_pathological_files_raise_config_error(write_toml, text):
    error_of(load_config, write_toml(text))


def test_validation_runs_on_file_values(write_toml):
    assert error_of(load_config, write_toml("[training]\nsteps = 0\n")).key == "training.steps"


# --------------------------------------------------------------------------- overrides: conversion


@pytest.mark.parametrize(
    ("text", "expected"),
    [("50", 50), ("1_000", 1000), ("1e3", 1000), ("1E3", 1000), (" 7 ", 7), ("+5", 5), ("-3", -3), ("2.0", 2)],
)
def test_int_override(text, expected):
    value = override(f"training.steps={text}").training.steps
    assert value == expected and type(value) is int


@pytest.mark.parametrize("text", ["1.5", "abc", "", "true", "1e400", "nan", "inf", "0x10", "[1]", "1" * 5000])
def test_int_override_rejects(text):
    err = error_of(override, f"training.steps={text}")
    assert err.key == "training.steps"
    assert "integer" in str(err)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3e-4", 3e-4), ("0.5", 0.5), ("1", 1.0), ("1_000.5", 1000.5), (" 2.5 ", 2.5), ("-0.25", -0.25)],
)
def test_float_override(text, expected):
    value = override(f"optim.lr={text}").optim.lr
    assert value == expected and type(value) is float


@pytest.mark.parametrize("text", ["fast", "", "true", "1e-3x", "[0.1]"])
def test_float_override_rejects(text):
    err = error_of(override, f"optim.lr={text}")
    assert err.key == "optim.lr"
    assert "number" in str(err)


@pytest.mark.parametrize("text", ["true", "True", "TRUE", "1", "yes", "Yes", "on", "ON", " true "])
def test_bool_override_true(text):
    assert override(f"training.deterministic={text}").training.deterministic is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no", "NO", "off", "Off"])
def test_bool_override_false(text):
    cfg = override("training.deterministic=true", f"training.deterministic={text}")
    assert cfg.training.deterministic is False


@pytest.mark.parametrize("text", ["maybe", "", "2", "t", "y", "[true]"])
def test_bool_override_rejects(text):
    err = error_of(override, f"training.deterministic={text}")
    assert err.key == "training.deterministic"
    assert err.choices == ("true", "false")


@pytest.mark.parametrize(
    ("assignment", "attr", "expected"),
    [
        ("model.name=timm:resnet50", ("model", "name"), "timm:resnet50"),
        ("compile.mode=max-autotune", ("compile", "mode"), "max-autotune"),
        ("data.path=/tmp/a b/c=d.npy", ("data", "path"), "/tmp/a b/c=d.npy"),  # only the first = splits
        ("compile.mode=", ("compile", "mode"), ""),
        ("data.path=123", ("data", "path"), "123"),
    ],
)
def test_str_override_is_verbatim(assignment, attr, expected):
    cfg = override(assignment)
    assert getattr(getattr(cfg, attr[0]), attr[1]) == expected


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("false", False), ("auto", None)])
def test_switch_override_and_toml_spellings(tmp_path, raw, expected):
    """A `bool | None` key takes `auto` / `true` / `false` on the command line and in TOML, as a
    TOML boolean or as the string the tri-state keys always took; the saved config spells it back."""
    assert override(f"optim.fused={raw}").optim.fused is expected
    quoted = tmp_path / "quoted.toml"
    quoted.write_text(f'[optim]\nfused = "{raw}"\n')
    assert load_config(quoted).optim.fused is expected
    if expected is not None:
        bare = tmp_path / "bare.toml"
        bare.write_text(f"[optim]\nfused = {raw}\n")
        assert load_config(bare).optim.fused is expected
    assert f'fused = "{raw}"' in dump_toml(override(f"optim.fused={raw}"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[0.9, 0.95]", [0.9, 0.95]),
        ("0.9,0.95", [0.9, 0.95]),
        ("0.9, 0.95", [0.9, 0.95]),
        ("[1, 0]", [1.0, 0.0]),
        ("[]", []),
        ("0.5", [0.5]),
        ("0.5,", [0.5]),
    ],
)
def test_list_override(text, expected):
    value = override(f"optim.betas={text}").optim.betas
    assert value == expected
    assert all(type(v) is float for v in value)


@pytest.mark.parametrize(
    ("text", "key"), [("[0.9, x]", "optim.betas[1]"), ("a,b", "optim.betas[0]"), ("{a=1}", "optim.betas")]
)
def test_list_override_rejects(text, key):
    assert error_of(override, f"optim.betas={text}").key == key


def test_dict_entry_overrides_parse_literals():
    cfg = override(
        "model.kwargs.hidden_size=512",
        "model.kwargs.dropout=0.1",
        "model.kwargs.activation=gelu",
        "model.kwargs.bias=false",
        "model.kwargs.dims=[1, 2]",
        "compile.options.max_autotune=true",
        "compile.options.triton.cudagraphs=false",
    )
    assert cfg.model.kwargs == {"hidden_size": 512, "dropout": 0.1, "activation": "gelu", "bias": False, "dims": [1, 2]}
    assert type(cfg.model.kwargs["hidden_size"]) is int
    assert cfg.compile.options == {"max_autotune": True, "triton.cudagraphs": False}
    assert cfg.compile.options["max_autotune"] is True


def test_dict_entry_multiline_value_is_not_a_literal():
    # "1\nother = 2" parses as a TOML document with two keys; it is not the literal 1.
    assert override("model.kwargs.x=1\nother = 2").model.kwargs == {"x": "1\nother = 2"}


def test_whole_dict_override():
    cfg = override("model.kwargs.a=1", "model.kwargs={hidden_size = 3, act = 'relu'}")
    assert cfg.model.kwargs == {"hidden_size": 3, "act": "relu"}
    assert error_of(override, "model.kwargs=5").key == "model.kwargs"


def test_override_key_whitespace_is_ignored():
    assert override(" training.steps =5").training.steps == 5


def test_override_wins_over_file(write_toml):
    path = write_toml("[training]\nsteps = 50\n[model.kwargs]\nhidden_size = 64\n")
    cfg = load_config(path, ["training.steps=7", "model.kwargs.hidden_size=128"])
    assert cfg.training.steps == 7
    assert cfg.model.kwargs == {"hidden_size": 128}


def test_later_override_wins():
    assert load_config(overrides=["training.steps=7", "training.steps=9"]).training.steps == 9


# --------------------------------------------------------------------------- overrides: errors


def test_override_without_equals():
    err = error_of(override, "training.steps")
    assert err.key == "training.steps"
    assert "KEY=VALUE" in str(err)


@pytest.mark.parametrize("assignment", ["=5", " =5", ".steps=1", "training.=1", "training..steps=1", "model.kwargs.=1"])
def test_override_empty_key(assignment):
    assert "empty key" in str(error_of(override, assignment))


def test_override_unknown_key_names_dotted_key_and_suggests():
    err = error_of(override, "training.stesp=5")
    assert err.key == "training.stesp"
    assert "training.stesp" in str(err)
    assert "steps" in err.choices


def test_override_unknown_section():
    err = error_of(override, "trainig.steps=5")
    assert err.key in ("trainig", "trainig.steps")
    assert "trainig" in str(err)
    assert "training" in err.choices


def test_override_unknown_top_level_key():
    assert error_of(override, "steps=5").key == "steps"


def test_override_setting_a_section_lists_its_keys():
    err = error_of(override, "training=5")
    assert err.key == "training"
    assert "section" in str(err)
    assert "steps" in err.choices


def test_override_sub_key_of_a_scalar():
    err = error_of(override, "training.steps.max=5")
    assert err.key == "training.steps"
    assert "not a section" in str(err)


def test_multiline_override_value_is_rejected():
    # Not silently read as `1` (the first line of a TOML document).
    error_of(override, "optim.betas=[0.9, 0.95]\nx = 1")
    error_of(override, "training.steps=1\nx = 2")


@pytest.mark.parametrize(
    "assignment",
    [
        "model.kwargs.x=" + "[" * 5000 + "]" * 5000,
        "model.kwargs.x=1" + "0" * 5000,
        "optim.betas=" + "[" * 5000,
        "optim.betas=" + "[" * 5000 + "]" * 5000,
    ],
    ids=["deep-dict-entry", "huge-int-dict-entry", "unclosed-deep-list", "deep-list"],
)
def test_pathological_override_values(assignment):
    # Either accepted as a plain string (dict entries take any value) or a ConfigError; never
    # RecursionError / ValueError from tomllib.
    try:
        cfg = override(assignment)
    except ConfigError:
        return
    assert isinstance(cfg.model.kwargs["x"], str)


# --------------------------------------------------------------------------- round trip


def _custom_config() -> Config:
    return override(
        "model.name=pkg.models:build",
        "model.kwargs.hidden_size=128",
        "model.kwargs.dims=[1, 2, 3]",
        "model.kwargs.inner={a = 1, b = 'x'}",
        "model.task=custom",
        'data.path=/tmp/dir with "quotes"/x.npy',
        "data.labels_path=/tmp/ünïcode\\y.npy",
        "data.source=files",
        "training.steps=1_000",
        "training.device=cuda:1",
        "optim.lr=3e-4",
        "optim.eps=1e-12",
        "optim.betas=0.9,0.95",
        "optim.warmup_steps=10",
        "precision.policy=bf16-mixed",
        "compile.enabled=true",
        "compile.options.coordinate_descent_tuning=true",
        "compile.options.triton.cudagraphs=false",
        "metrics.peak_tflops=989.5",
    )


@pytest.mark.parametrize("make", [Config, _custom_config], ids=["default", "custom"])
def test_round_trip(tmp_path, make):
    cfg = make()
    path = tmp_path / "config.toml"
    save_config(cfg, path)
    assert path.read_text(encoding="utf-8") == dump_toml(cfg)
    loaded = load_config(path)
    assert dataclasses.asdict(loaded) == dataclasses.asdict(cfg)
    assert tomllib.loads(dump_toml(cfg)) == config_to_dict(cfg)  # asdict with switches spelled as in TOML
    # Twice round: the text is stable.
    assert dump_toml(loaded) == dump_toml(cfg)


# Regression: nesting that tomllib parses (a few hundred levels) but that overflowed the stack in
# dataclasses.asdict / tomli_w when the resolved config was saved.
@pytest.mark.parametrize(
    "assignment",
    [
        "model.kwargs.x=" + "[" * 100 + "]" * 100,
        "model.kwargs={x = " + "{a = " * 100 + "1" + "}" * 100 + "}",
        "compile.options.x=" + "{a = " * 100 + "1" + "}" * 100,
    ],
    ids=["entry-array", "whole-dict", "options-entry"],
)
def test_deeply_nested_override_values_rejected(assignment):
    assert "nested" in str(error_of(override, assignment))


def test_deeply_nested_file_value_rejected(write_toml):
    err = error_of(load_config, write_toml("[model.kwargs]\nx = " + "[" * 100 + "]" * 100 + "\n"))
    assert err.key == "model.kwargs"


def test_moderately_nested_values_round_trip(tmp_path):
    cfg = override("model.kwargs.x=" + "[" * 20 + "1" + "]" * 20, "model.kwargs.y={a = {b = {c = [1, {d = 2}]}}}")
    save_config(cfg, tmp_path / "c.toml")
    assert dataclasses.asdict(load_config(tmp_path / "c.toml")) == dataclasses.asdict(cfg)


def test_a_config_file_given_as_an_override_points_to_config():
    with pytest.raises(ConfigError, match="--config FILE"):
        load_config(None, ["configs/vit_b16.toml"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["training.steps"])
