"""Example inputs for `kiln explain` / `kiln doctor`: `--input SPEC`, `--inputs-from FILE`, or a model's InputSpec.

SPEC grammar (one `--input` per positional argument of forward, in order):
    8x3x224x224              float32 tensor of that shape (standard normal)
    float16:4x16             a dtype, then the shape
    int64[0,512):2x32        integers drawn from [lo, hi); floats with a range are uniform in it
    float=0.5 / int=3        a Python scalar argument
Inputs are drawn from a fixed seed, so two runs of a diagnosis see the same numbers. `--inputs-from`
and a factory's example inputs may hold any Python value (strings, dicts, dataclasses), passed to
forward as they are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from kiln.errors import ConfigError
from kiln.imports import load_callable
from kiln.models.spec import InputSpec

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
INPUTS_FROM_FORMS = ("calls.pt", "inputs.npy", "make_inputs.py:calls")
SPEC_FORMS = ("8x3x224x224", "float16:4x16", "int64[0,512):2x32", "float=0.5", "int=3")
DEFAULT_BATCH = 4
"""Batch size of inputs made from an InputSpec; not 1, which torch specializes on (0/1 specialization)."""

_NUM = r"-?\d+(?:\.\d*)?(?:e[+-]?\d+)?"
_TENSOR = re.compile(rf"(?:(?P<dtype>[a-z0-9]+)?(?:\[(?P<lo>{_NUM}),\s*(?P<hi>{_NUM})\))?:)?(?P<shape>\d+(?:x\d+)*)")
_SCALAR = re.compile(rf"(?P<kind>float|int|bool)=(?P<value>{_NUM}|true|false)")


def _generator(seed: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def _make_tensor(dtype: torch.dtype, shape: tuple[int, ...], lo: float | None, hi: float | None, seed: int):
    gen = _generator(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        if lo is None:
            return torch.randn(shape, generator=gen).to(dtype)
        return (torch.rand(shape, generator=gen) * (hi - lo) + lo).to(dtype)
    low, high = (0, 10) if lo is None else (int(lo), int(hi))
    return torch.randint(low, high, shape, generator=gen).to(dtype)


def parse_input_spec(text: str, seed: int = 0) -> Any:
    """One `--input SPEC` -> a tensor or a Python scalar; ConfigError naming `--input` when malformed."""
    spec = text.strip().replace(" ", "")
    scalar = _SCALAR.fullmatch(spec)
    if scalar:
        kind, value = scalar["kind"], scalar["value"]
        if kind == "bool":
            if value not in ("true", "false"):
                raise ConfigError("--input", f"{text!r}: a bool scalar is bool=true or bool=false", SPEC_FORMS)
            return value == "true"
        if kind == "int":
            if not re.fullmatch(r"-?\d+", value):
                raise ConfigError("--input", f"{text!r}: int=... needs an integer", SPEC_FORMS)
            return int(value)
        return float(value)
    m = _TENSOR.fullmatch(spec)
    if not m:
        raise ConfigError("--input", f"cannot parse input spec {text!r}", SPEC_FORMS)
    dtype_name = m["dtype"] or "float32"
    if dtype_name not in DTYPES:
        raise ConfigError("--input", f"{text!r}: unknown dtype {dtype_name!r}", DTYPES)
    dtype = getattr(torch, dtype_name)
    shape = tuple(int(s) for s in m["shape"].split("x"))
    if any(s <= 0 for s in shape):
        raise ConfigError("--input", f"{text!r}: every dimension must be positive", SPEC_FORMS)
    lo = float(m["lo"]) if m["lo"] is not None else None
    hi = float(m["hi"]) if m["hi"] is not None else None
    if lo is not None and not lo < hi:
        raise ConfigError("--input", f"{text!r}: the range [lo, hi) needs lo < hi", SPEC_FORMS)
    if lo is not None and not dtype.is_floating_point and (lo != int(lo) or hi != int(hi)):
        raise ConfigError("--input", f"{text!r}: an integer dtype needs an integer range", SPEC_FORMS)
    return _make_tensor(dtype, shape, lo, hi, seed)


def parse_input_specs(texts: list[str]) -> tuple[Any, ...]:
    # Each input gets its own seed, so two inputs of one shape are not identical.
    return tuple(parse_input_spec(t, seed=i) for i, t in enumerate(texts))


def inputs_from_spec(spec: InputSpec, batch: int = DEFAULT_BATCH) -> tuple[torch.Tensor, ...]:
    """A batch matching a model's InputSpec (what `kiln train` would feed it)."""
    shape = (batch, *spec.shape)
    if spec.kind == "tokens":
        vocab = spec.vocab_size or 2
        return (_make_tensor(torch.int64, shape, 0, vocab, seed=0),)
    return (_make_tensor(torch.float32, shape, None, None, seed=0),)


def as_input_set(value: Any) -> tuple[Any, ...]:
    """forward's positional arguments from one example: a tuple or list is the arguments (tensors or any
    Python values: strings, dicts, dataclasses), anything else is the one argument."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def _load_python_sets(spec: str) -> Any:
    """`--inputs-from file.py:function`: the function returns what a .pt file would hold, as Python
    values (a dataclass or any object that torch.load's weights_only mode refuses)."""
    fn = load_callable(spec, "--inputs-from")
    try:
        return fn()
    except Exception as exc:
        raise ConfigError("--inputs-from", f"{spec}: the function failed: {type(exc).__name__}: {exc}") from None


def load_input_sets(path: str) -> list[tuple[Any, ...]]:
    """`--inputs-from FILE`: a .pt file (tensor, tuple of inputs, or a list of input tuples, one per
    call), a .npy array, or `file.py:function` returning the same as Python values. Several input
    sets are called in order, which is how recompiles show."""
    if path.endswith(".py") or ".py:" in path:
        data = _load_python_sets(path)
        file = Path(path.split(":", 1)[0])
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError("--inputs-from", f"file not found: {file}")
        if file.suffix == ".npy":
            import numpy as np

            return [(torch.from_numpy(np.load(file)),)]
        try:
            data = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors come in many types
            raise ConfigError("--inputs-from", f"cannot load {file} with torch.load(weights_only=True): "
                              f"{first_line_of(exc)}; for Python objects (dataclasses, ...) give "
                              "`--inputs-from file.py:function` returning them", INPUTS_FROM_FORMS) from None
    if isinstance(data, list) and data and all(isinstance(d, (tuple, list, torch.Tensor)) for d in data):
        if all(isinstance(d, torch.Tensor) for d in data):
            return [tuple(data)]  # a list of tensors is one call with several arguments
        return [as_input_set(d) for d in data]
    return [as_input_set(data)]


def first_line_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def to_device(inputs: tuple[Any, ...], device: torch.device | str) -> tuple[Any, ...]:
    """Tensors moved, also inside lists, tuples and dicts; other values as they are."""
    return tuple(tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, list(inputs)))


class _Shown(str):
    def __repr__(self) -> str:
        return str(self)


def _tensor_text(x: torch.Tensor) -> str:
    return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"


def describe_inputs(inputs: tuple[Any, ...]) -> list[str]:
    """Short text per input for reports: `float32[4, 3, 32, 32]`, `float=0.5`, `dict={'bias': float32[16]}`."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(_tensor_text(x))
        else:
            shown = repr(tree_map(lambda v: _Shown(_tensor_text(v)) if isinstance(v, torch.Tensor) else v, x))
            out.append(f"{type(x).__name__}={shown if len(shown) <= 60 else shown[:57] + '...'}")
    return out
