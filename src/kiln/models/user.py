"""User model factories: `package.module:function` or `path/to/file.py:function`.

The function gets `**model.kwargs` and returns an nn.Module, `(module, InputSpec)`,
`(module, dict of InputSpec fields)`, `(module, example_input_tensor)` (the `kiln explain`
form) or a BuiltModel.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from kiln.config.errors import ConfigError
from kiln.models.blocks import find_repeated_blocks
from kiln.models.factory_args import bind_kwargs
from kiln.models.spec import BuiltModel, InputSpec, check_task, make_input_spec, spec_from_example

FORMS = ("package.module:function", "path/to/file.py:function")


def split_target(target: str) -> tuple[str, str]:
    """('module or file', 'function'); splits on the last ':' so 'C:\\x.py:f' keeps its drive."""
    where, sep, func = target.rpartition(":")
    if not sep or not where or not func.isidentifier():
        raise ConfigError("model.name", f"{target!r} is not a model factory reference", FORMS)
    return where, func


def _is_file_ref(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def _load_file(where: str) -> ModuleType:
    path = Path(where).expanduser().resolve()  # relative to the current directory
    if not path.is_file():
        raise ConfigError("model.name", f"model file not found: {path}")
    # A name unique per path: two runs' files both called model.py must not share a module, and
    # registering it in sys.modules lets dataclasses and pickling inside the file find it.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    mod_name = f"kiln_user_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("model.name", f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def _import_module(where: str) -> ModuleType:
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        # Tell "your module does not exist" apart from "your module imports something missing".
        if e.name and (where == e.name or where.startswith(e.name + ".")):
            raise ConfigError(
                "model.name", f"no module named {where!r} (is it on PYTHONPATH / installed?)", FORMS
            ) from None
        raise ConfigError("model.name", f"importing {where!r} failed: {e}") from None


def load_factory(target: str) -> Callable[..., Any]:
    where, func_name = split_target(target)
    module = _load_file(where) if _is_file_ref(where) else _import_module(where)
    func = getattr(module, func_name, None)
    if func is None:
        callables = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and not isinstance(v, ModuleType)
        )
        raise ConfigError("model.name", f"{where!r} has no function {func_name!r}", callables or None)
    if not callable(func):
        raise ConfigError("model.name", f"{where}:{func_name} is a {type(func).__name__}, not a function")
    return func


def _bad_return(target: str, value: Any) -> ConfigError:
    return ConfigError(
        "model.name",
        f"factory {target!r} returned {type(value).__name__}; expected an nn.Module, (module, InputSpec), "
        "(module, dict of InputSpec fields) or a BuiltModel",
    )


def build_user(target: str, kwargs: dict[str, Any]) -> BuiltModel:
    factory = load_factory(target)
    resolved = bind_kwargs(factory, kwargs, f"factory {target!r}")
    result = factory(**resolved)
    where = f"factory {target!r}"

    if isinstance(result, BuiltModel):
        if not isinstance(result.module, nn.Module):
            raise _bad_return(target, result.module)
        check_task(result.task, where)
        spec = make_input_spec(result.input_spec, where) if result.input_spec is not None else None
        blocks = result.blocks or find_repeated_blocks(result.module)
        return BuiltModel(result.module, result.task, spec, target, blocks)

    declared_task: str | None = None
    spec: InputSpec | None = None
    if isinstance(result, nn.Module):
        module = result
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        module, extra = result
        if isinstance(extra, (InputSpec, Mapping)):
            spec = make_input_spec(extra, where)
            if isinstance(extra, Mapping) and "task" in extra:
                declared_task = check_task(extra["task"], where)
        elif isinstance(extra, torch.Tensor):
            spec = spec_from_example(extra)
        elif extra is not None and not isinstance(extra, (tuple, list)):
            raise _bad_return(target, result)
        # A tuple/list of example inputs (multi-input explain form): the spec stays unknown.
    else:
        raise _bad_return(target, result)

    if declared_task is None and hasattr(module, "kiln_task"):
        declared_task = check_task(module.kiln_task, f"{where} (attribute kiln_task)")
    if declared_task is None:
        # Token inputs without classes can only be next-token prediction.
        is_lm = spec is not None and spec.kind == "tokens" and spec.num_classes is None
        declared_task = "causal_lm" if is_lm else "classification"
    return BuiltModel(module, declared_task, spec, target, find_repeated_blocks(module))
