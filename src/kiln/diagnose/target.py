"""TARGET -> the module to diagnose and the inputs to call it with.

TARGET is what `kiln train` takes as `model.name` (a registry name, `timm:`/`hf:` forms,
`package.module:function`, `path/to/file.py:function`); for `kiln explain`/`doctor` the function may
also return `(module, example_inputs)`, example_inputs being a tensor or a tuple of forward's
positional arguments: tensors and any Python values (a string naming a task, a dict, a dataclass),
called as the user calls forward. Inputs come, first found wins, from
`--inputs-from`, `--input`, the factory's example inputs, or the model's InputSpec.

A factory's module may declare `KILN_SEED_EXPECTATIONS` (see diagnose/expectations.py): what an
article or an older torch said would happen, which the reports compare with what did.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from kiln.config.schema import ModelConfig
from kiln.diagnose.inputs import SPEC_FORMS, as_input_set, inputs_from_spec, load_input_sets, parse_input_specs
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.models.factory_args import bind_kwargs
from kiln.models.registry import REGISTRY
from kiln.models.spec import CONTRACT_HINT, BuiltModel, InputSpec, make_input_spec, spec_from_example
from kiln.models.user import load_factory


@dataclass
class Target:
    spec: str
    """The TARGET string as given (repro scripts import the model by it)."""
    module: nn.Module
    input_sets: list[tuple[Any, ...]]
    """Positional arguments of forward, one tuple per call; the first is the main example."""
    input_source: str
    """Where the inputs came from: `--inputs-from`, `--input`, `factory`, `input spec`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    expectations: list[dict[str, Any]] = field(default_factory=list)
    source_file: str | None = None
    """File defining the factory, when there is one (seed expectations are matched in it)."""

    @property
    def inputs(self) -> tuple[Any, ...]:
        return self.input_sets[0]


def retarget(exc: ConfigError) -> ConfigError:
    """model.name / model.kwargs.X errors from the model builders, renamed to this command's flags."""
    if exc.key == "model.name":
        key = "TARGET"
    elif exc.key.startswith("model.kwargs."):
        key = "--kwarg " + exc.key.removeprefix("model.kwargs.")
    else:
        return exc
    message = str(exc).removeprefix(f"{exc.key}: ")
    if exc.choices:
        message = message.rsplit(" (valid: ", 1)[0]
    return ConfigError(key, message, exc.choices)


def _interpret(result: Any, spec: str) -> tuple[nn.Module, tuple[Any, ...] | None, InputSpec | None]:
    where = f"factory {spec!r}"
    if isinstance(result, BuiltModel):
        return result.module, None, result.input_spec
    if isinstance(result, nn.Module):
        return result, None, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        module, extra = result
        if isinstance(extra, (InputSpec, Mapping)):
            return module, None, make_input_spec(extra, where)
        inputs = as_input_set(extra) if extra is not None else None
        if inputs:
            return module, inputs, spec_from_example(inputs[0])
    raise ConfigError(
        "TARGET",
        f"{where} returned {type(result).__name__}; expected an nn.Module, (module, example_inputs) with a tensor "
        "or a tuple of forward's arguments (any Python values), (module, InputSpec or dict) or a BuiltModel",
    )


def _call_factory(spec: str, kwargs: dict[str, Any]):
    """Load and call a user factory ourselves: build_model does not keep example inputs."""
    factory = load_factory(spec)
    resolved = bind_kwargs(factory, kwargs, f"factory {spec!r}")
    result = factory(**resolved)
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    expectations = list(getattr(module, "KILN_SEED_EXPECTATIONS", []) or [])
    source = getattr(module, "__file__", None)
    return result, expectations, source


def _is_user_factory(spec: str) -> bool:
    return spec not in REGISTRY and ":" in spec and not spec.startswith(("timm:", "hf:"))


def load_target(
    spec: str,
    kwargs: dict[str, Any] | None = None,
    input_specs: list[str] | None = None,
    inputs_from: str | None = None,
) -> Target:
    """Build the module and its inputs; ConfigError (exit 2) for a bad TARGET, kwarg or input."""
    kwargs = dict(kwargs or {})
    spec = spec.strip()
    # Parse inputs first: a malformed --input should fail before a large model is built.
    given_sets = load_input_sets(inputs_from) if inputs_from else None
    given = parse_input_specs(input_specs) if input_specs else None
    try:
        if _is_user_factory(spec):
            result, expectations, source = _call_factory(spec, kwargs)
            module, example, input_spec = _interpret(result, spec)
        else:
            built = build_model(ModelConfig(name=spec, kwargs=kwargs))
            module, example, input_spec, expectations, source = built.module, None, built.input_spec, [], None
    except ConfigError as exc:
        raise retarget(exc) from None

    if given_sets:
        sets, origin = given_sets, "--inputs-from"
    elif given:
        sets, origin = [given], "--input"
    elif example is not None:
        sets, origin = [example], "factory"
    elif input_spec is not None:
        sets, origin = [inputs_from_spec(input_spec)], "input spec"
    else:
        raise ConfigError("--input", f"{spec!r} gives no example inputs: pass --input SPEC per forward argument, "
                          f"or {CONTRACT_HINT}", SPEC_FORMS)
    return Target(spec, module, sets, origin, kwargs, expectations, source)


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """--kwarg KEY=VALUE items -> the factory's keyword arguments (a value parsed as JSON, else a string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--kwarg", f"{item!r} is not KEY=VALUE", ["hidden_size=64", "name=\"x\""])
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def check_device(device: str) -> str:
    """--device, checked: a torch device this machine has."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError("--device", f"not a device: {device!r}", ["cpu", "cuda", "cuda:1"]) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "CUDA is not available here", ["cpu"])
    return device
