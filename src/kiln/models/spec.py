"""What a built model tells the rest of kiln: its input shape, task and repeated blocks.

Kept apart from the builders so that data, train and bench code can import these two dataclasses
without pulling in transformers or timm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_args

import torch

from kiln.config.schema import Task
from kiln.errors import ConfigError

INPUT_KINDS = ("features", "images", "tokens")
# Tasks a model may declare; "auto" is a config value only (it means "ask the model").
TASKS = tuple(t for t in get_args(Task) if t != "auto")
CONTRACT_HINT = (
    "return (model, example_inputs) from the factory, e.g. `return model, torch.randn(8, 512)` for a model "
    "taking [batch, 512] features (the classes are read from its [batch, C] output), or "
    '(model, {"kind": "features", "shape": [512], "num_classes": 10})'
)
"""What to add when kiln cannot tell a user model's input; quoted by every error that needs it."""


@dataclass
class InputSpec:
    """Per-sample input of a model, so data sources can make matching batches."""

    kind: str
    """`features` (D,), `images` (C, H, W) or `tokens` (T,), T being the default sequence length."""
    shape: tuple[int, ...]
    """Per-sample shape, without the batch dimension."""
    num_classes: int | None = None
    """Classifiers: number of target classes."""
    vocab_size: int | None = None
    """Token models: vocabulary size (token ids are in [0, vocab_size))."""
    max_seq_len: int | None = None
    """Token models: the longest sequence the model takes (its position limit, e.g. HF's
    `max_position_embeddings`); None when unknown, then `shape` is the limit."""


@dataclass
class BuiltModel:
    """A model ready for the apply_* transforms, with what the trainer needs to feed and score it."""

    module: torch.nn.Module
    task: str
    """`classification`, `causal_lm`, or `custom` (module(inputs, targets) returns its own loss)."""
    input_spec: InputSpec | None
    """None when unknown (a user model returned without a spec)."""
    name: str
    """What the user asked for (`model.name`), for logs."""
    blocks: list[torch.nn.Module] = field(default_factory=list)
    """Repeated blocks (transformer layers / MLP blocks): units for regional compile, FSDP, checkpointing."""
    hf_config: dict[str, Any] | None = None
    """Causal LMs: the model's Hugging Face `config.json` fields (`kiln export` writes them)."""
    hidden_states: bool = False
    """`module(inputs, hidden=True)` returns the final hidden states and `module.lm_head` is the output
    layer, so a fused linear + cross-entropy can replace logits + cross-entropy (training.ce_kernel)."""
    initial_values: Callable[[torch.device, int], Iterator[tuple[str, torch.Tensor]]] | None = None
    """Set when `module` was built on the meta device and its weights can be made one parameter at a
    time (kiln's decoder): `initial_values(device, seed)` yields (name, full tensor) in
    `named_parameters()` order, the values a build on `device` under torch seed `seed` would hold. An
    FSDP2 run shards the meta model first, then fills only each rank's shards from these."""


_SPEC_FIELDS = tuple(f.name for f in fields(InputSpec))


def check_task(task: Any, where: str) -> str:
    if task not in TASKS:
        raise ConfigError("model.task", f"{where} declares unknown task {task!r}", TASKS)
    return task


def make_input_spec(value: InputSpec | Mapping[str, Any], where: str) -> InputSpec:
    """Validate an InputSpec or a dict of its fields (user factories may return either).

    `where` names the source for the message, e.g. "factory my_mod:build"; errors use the key
    `model.name` because the spec came from what model.name points at.
    """
    if isinstance(value, InputSpec):
        kind, shape, num_classes, vocab_size = value.kind, value.shape, value.num_classes, value.vocab_size
        max_seq_len = value.max_seq_len
    else:
        unknown = [k for k in value if k not in _SPEC_FIELDS and k != "task"]
        if unknown:
            raise ConfigError(
                "model.name",
                f"{where} returned an input spec with unknown field {unknown[0]!r}",
                (*_SPEC_FIELDS, "task"),
            )
        if "kind" not in value or "shape" not in value:
            raise ConfigError("model.name", f"{where} returned an input spec without 'kind' and 'shape'")
        kind, shape = value["kind"], value["shape"]
        num_classes, vocab_size = value.get("num_classes"), value.get("vocab_size")
        max_seq_len = value.get("max_seq_len")
    if kind not in INPUT_KINDS:
        raise ConfigError("model.name", f"{where} returned an input spec of unknown kind {kind!r}", INPUT_KINDS)
    # Lists arrive from TOML/JSON; a bare int is a common shorthand for (D,).
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ConfigError("model.name", f"{where} returned an input spec with a non-integer shape {shape!r}") from None
    expected_dims = {"features": 1, "images": 3, "tokens": 1}[kind]
    if len(shape) != expected_dims or any(s <= 0 for s in shape):
        raise ConfigError(
            "model.name", f"{where}: a {kind!r} input spec needs {expected_dims} positive dims, got {shape!r}"
        )
    for name, v in (("num_classes", num_classes), ("vocab_size", vocab_size), ("max_seq_len", max_seq_len)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ConfigError("model.name", f"{where}: input spec {name} must be a positive int, got {v!r}")
    return InputSpec(kind=kind, shape=shape, num_classes=num_classes, vocab_size=vocab_size, max_seq_len=max_seq_len)


def spec_from_example(example: Any) -> InputSpec | None:
    """Best-effort spec from a batch of example inputs, as `kiln explain` factories return them.

    Lets one factory serve both `kiln explain` ((module, example_inputs)) and `kiln train`.
    Only a single tensor is understood; anything else gives None (unknown).
    """
    if not isinstance(example, torch.Tensor) or example.dim() < 2:
        return None
    per_sample = tuple(example.shape[1:])
    if example.is_floating_point():
        if len(per_sample) == 1:
            return InputSpec("features", per_sample)
        if len(per_sample) == 3:
            return InputSpec("images", per_sample)
        return None
    if len(per_sample) == 1 and example.dtype in (torch.int32, torch.int64):
        return InputSpec("tokens", per_sample)
    return None
