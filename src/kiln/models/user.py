"""User model factories: `package.module:function` or `path/to/file.py:function`.

One contract for `kiln train`, `kiln bench`, `kiln explain` and `kiln doctor`. The function gets
`**model.kwargs` and returns one of:

- `(module, example_inputs)`: a batch forward accepts (a tensor, or a tuple of forward's
  arguments). kiln reads the input spec from it and, for a single input, calls the model once on
  it to read the task from the output: `[batch, C]` from float inputs is a C-class classifier,
  `[batch, T, V]` from `[batch, T]` token ids a causal LM over V tokens;
- `(module, InputSpec)` or `(module, dict of InputSpec fields, optionally "task")`;
- a BuiltModel;
- a bare nn.Module: then kiln knows nothing about its input, so synthetic data and `kiln explain`
  need it from elsewhere (return one of the forms above, or pass `--input` / a data source).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from kiln.errors import ConfigError
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
        f"factory {target!r} returned {type(value).__name__}; expected an nn.Module, (module, example_inputs), "
        "(module, InputSpec), (module, dict of InputSpec fields) or a BuiltModel",
    )


def as_example_inputs(value: Any) -> tuple[Any, ...] | None:
    """forward's positional arguments from a factory's second value, or None when it is not inputs."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if (
        isinstance(value, (tuple, list))
        and any(isinstance(v, torch.Tensor) for v in value)
        and all(isinstance(v, (torch.Tensor, int, float, bool)) for v in value)
    ):
        return tuple(value)
    return None


def _output_tensor(module: nn.Module, inputs: tuple[Any, ...], where: str) -> torch.Tensor | None:
    """The model's output on its example inputs (eval mode, no grad; training mode restored)."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(*inputs)
    except Exception as exc:
        raise ConfigError("model.name", f"{where}: the model fails on its own example inputs: "
                          f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    finally:
        module.train(was_training)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]  # (logits, extras...) as many models return
    return out if isinstance(out, torch.Tensor) else None


def infer_from_example(
    module: nn.Module, inputs: tuple[Any, ...], where: str
) -> tuple[InputSpec | None, str | None]:
    """(input spec, task) read from example inputs and, where that is sound, the output they give.

    Only a single tensor input is understood (what synthetic data can make). The output decides
    the task: `[B, C]` (C >= 2) from features/images is classification over C classes; `[B, T, V]`
    from `[B, T]` int token ids (all below V) is a causal LM over V tokens. Anything else leaves
    the spec without classes/vocabulary and the task undecided."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if len(inputs) != 1 or len(tensors) != 1:
        return None, None
    (x,) = tensors
    spec = spec_from_example(x)
    if spec is None:
        return None, None
    # Two rows tell the output's shape as well as the whole batch, at a fraction of the cost.
    x = x[:2]
    if x.is_meta:
        # Built on the meta device (sizing, a bench's data shapes): the forward propagates shapes
        # only, and one that reads values (.item(), a branch on x.max()) cannot run there. That
        # is no fault of the model: the spec stays undecided and the real build checks it.
        try:
            out = _output_tensor(module, (x,), where)
        except ConfigError:
            return spec, None
    else:
        out = _output_tensor(module, (x,), where)
    if out is None or out.dim() < 2 or out.shape[0] != x.shape[0]:
        return spec, None
    if spec.kind in ("features", "images") and out.dim() == 2 and out.shape[1] >= 2 and out.is_floating_point():
        return InputSpec(spec.kind, spec.shape, num_classes=int(out.shape[1])), "classification"
    if (spec.kind == "tokens" and out.dim() == 3 and tuple(out.shape[:2]) == tuple(x.shape)
            and out.shape[2] >= 2 and (x.is_meta or (int(x.max()) < out.shape[2] and int(x.min()) >= 0))):
        return InputSpec("tokens", spec.shape, vocab_size=int(out.shape[2])), "causal_lm"
    return spec, None


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
    inferred_task: str | None = None
    spec: InputSpec | None = None
    if isinstance(result, nn.Module):
        module = result
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        module, extra = result
        example = as_example_inputs(extra)
        if isinstance(extra, (InputSpec, Mapping)):
            spec = make_input_spec(extra, where)
            if isinstance(extra, Mapping) and "task" in extra:
                declared_task = check_task(extra["task"], where)
        elif example is not None:
            spec, inferred_task = infer_from_example(module, example, where)
        elif extra is not None:
            raise _bad_return(target, result)
    else:
        raise _bad_return(target, result)

    if declared_task is None and hasattr(module, "kiln_task"):
        declared_task = check_task(module.kiln_task, f"{where} (attribute kiln_task)")
    if declared_task is None:
        # Token inputs without classes can only be next-token prediction.
        is_lm = spec is not None and spec.kind == "tokens" and spec.num_classes is None
        declared_task = inferred_task or ("causal_lm" if is_lm else "classification")
    return BuiltModel(module, declared_task, spec, target, find_repeated_blocks(module))
