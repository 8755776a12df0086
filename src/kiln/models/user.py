"""User model factories: `package.module:function` or `path/to/file.py:function`.

The function gets `**model.kwargs` and returns an nn.Module, `(module, InputSpec)`,
`(module, dict of InputSpec fields)`, `(module, example_input_tensor)` (the `kiln explain`
form) or a BuiltModel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from kiln.config.errors import ConfigError
from kiln.imports import FORMS as IMPORT_FORMS
from kiln.imports import load_callable
from kiln.models.blocks import find_repeated_blocks
from kiln.models.factory_args import bind_kwargs
from kiln.models.spec import BuiltModel, InputSpec, check_task, make_input_spec, spec_from_example

FORMS = IMPORT_FORMS


def load_factory(target: str) -> Callable[..., Any]:
    return load_callable(target, "model.name")


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
