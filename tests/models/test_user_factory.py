"""User factories: `module:function` and `path/file.py:function`."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kiln.config import ConfigError, ModelConfig
from kiln.models import BuiltModel, InputSpec, build_model

FACTORIES = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from kiln.models import BuiltModel, InputSpec


    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


    class LossNet(Net):
        kiln_task = "custom"


    def plain(width: int = 8):
        return Net(width)

    def with_spec(width: int = 8):
        return Net(width), InputSpec("features", (width,), num_classes=width)

    def with_dict(width: int = 8):
        return Net(width), {"kind": "tokens", "shape": [12], "vocab_size": 50}

    def with_example(width: int = 8):
        return Net(width), torch.randn(2, width)

    def built():
        return BuiltModel(Net(4), "custom", InputSpec("features", (4,)), "ignored", [])

    def own_loss():
        return LossNet(4)

    def needs_arg(depth: int):
        return Net(depth)

    def anything(**kwargs):
        return Net(kwargs.get("width", 2))

    def not_a_model():
        return 42

    def bad_spec():
        return Net(2), {"kind": "features", "shapes": [2]}

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "kiln_test_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kiln_test_factories"
    sys.modules.pop("kiln_test_factories", None)


def test_module_function(user_module: str) -> None:
    built = build_model(ModelConfig(name=f"{user_module}:plain", kwargs={"width": 6}))
    assert built.task == "classification" and built.input_spec is None
    assert built.name == f"{user_module}:plain"
    assert len(built.blocks) == 3
    assert built.module(torch.randn(2, 6)).shape == (2, 6)


def test_file_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the current directory
    built = build_model(ModelConfig(name="model.py:with_spec", kwargs={"width": 5}))
    assert built.input_spec == InputSpec("features", (5,), num_classes=5)
    built_abs = build_model(ModelConfig(name=f"{tmp_path / 'model.py'}:plain"))
    assert type(built_abs.module).__name__ == "Net"


def test_dict_spec_tokens_means_causal_lm(user_module: str) -> None:
    built = build_model(ModelConfig(name=f"{user_module}:with_dict"))
    assert built.input_spec == InputSpec("tokens", (12,), vocab_size=50)
    assert built.task == "causal_lm"


def test_example_tensor_gives_spec(user_module: str) -> None:
    built = build_model(ModelConfig(name=f"{user_module}:with_example", kwargs={"width": 3}))
    # The [2, 3] output of the example batch makes it a 3-class classifier.
    assert built.input_spec == InputSpec("features", (3,), num_classes=3) and built.task == "classification"


def test_built_model_and_kiln_task(user_module: str) -> None:
    built = build_model(ModelConfig(name=f"{user_module}:built"))
    assert isinstance(built, BuiltModel) and built.task == "custom" and built.name == f"{user_module}:built"
    assert len(built.blocks) == 3  # empty blocks are filled in
    assert build_model(ModelConfig(name=f"{user_module}:own_loss")).task == "custom"


def test_task_override(user_module: str) -> None:
    built = build_model(ModelConfig(name=f"{user_module}:own_loss", task="classification"))
    assert built.task == "classification"


def test_kwargs_checked_against_signature(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.kwargs\.depht.*did you mean 'depth'"):
        build_model(ModelConfig(name=f"{user_module}:needs_arg", kwargs={"depht": 2}))
    with pytest.raises(ConfigError, match=r"model\.kwargs\.depth.*needs this argument"):
        build_model(ModelConfig(name=f"{user_module}:needs_arg"))
    with pytest.raises(ConfigError, match=r"model\.kwargs\.width.*expects int"):
        build_model(ModelConfig(name=f"{user_module}:plain", kwargs={"width": "8"}))
    # **kwargs factories take anything.
    assert build_model(ModelConfig(name=f"{user_module}:anything", kwargs={"width": 3, "extra": 1}))


def test_missing_module() -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*no module named 'kiln_no_such_module'"):
        build_model(ModelConfig(name="kiln_no_such_module:build"))


def test_missing_function(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*has no function 'nope'") as info:
        build_model(ModelConfig(name=f"{user_module}:nope"))
    assert "plain" in info.value.choices


def test_not_callable(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*not a function"):
        build_model(ModelConfig(name=f"{user_module}:NOT_CALLABLE"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*file not found"):
        build_model(ModelConfig(name=f"{tmp_path / 'absent.py'}:build"))


def test_bad_return_type(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*returned int; expected an nn\.Module"):
        build_model(ModelConfig(name=f"{user_module}:not_a_model"))


def test_bad_spec_field(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.name.*unknown field 'shapes'"):
        build_model(ModelConfig(name=f"{user_module}:bad_spec"))


def test_module_importing_missing_dependency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kiln_test_broken.py").write_text("import kiln_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"model\.name.*importing 'kiln_test_broken' failed.*kiln_absent_dependency"):
        build_model(ModelConfig(name="kiln_test_broken:build"))
