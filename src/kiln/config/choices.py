"""The closed choices of the config, read from the schema's field types.

A `Literal[...]` field allows exactly its values; a `bool | None` field (a switch) is `true`,
`false` or `auto` (None: kiln decides). Validation, the generated reference and the run identity
all take the choices from here, so a new choice is written once, in the field's type.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal

from kiln.config.schema import Config

AUTO = "auto"
SWITCH_CHOICES = ("auto", "true", "false")
"""How a switch is spelled in TOML, overrides and saved configs."""


def is_switch(tp: Any) -> bool:
    """`bool | None`: yes, no, or kiln decides."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return False
    return set(typing.get_args(tp)) == {bool, type(None)}


def literal_values(tp: Any) -> tuple[str, ...] | None:
    """The values of a `Literal[...]` type, else None."""
    return tuple(typing.get_args(tp)) if typing.get_origin(tp) is Literal else None


@functools.cache
def _field_types() -> dict[str, Any]:
    """Dotted key -> field type, in schema order."""
    out: dict[str, Any] = {}
    for section, cls in typing.get_type_hints(Config).items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out[f"{section}.{f.name}"] = hints[f.name]
    return out


@functools.cache
def switch_keys() -> frozenset[str]:
    """The dotted keys of the `bool | None` fields."""
    return frozenset(key for key, tp in _field_types().items() if is_switch(tp))


@functools.cache
def field_choices() -> dict[str, tuple[str, ...]]:
    """Dotted key -> its valid values as a user writes them, for every closed-choice field."""
    out: dict[str, tuple[str, ...]] = {}
    for key, tp in _field_types().items():
        values = literal_values(tp)
        if values is not None:
            out[key] = values
        elif is_switch(tp):
            out[key] = SWITCH_CHOICES
    return out


def switch_spelling(value: Any) -> Any:
    """A switch's value as TOML and saved configs spell it (`auto`, `true`, `false`); other
    values unchanged."""
    if value is None or value == AUTO:
        return AUTO
    if value is True or value == "true":
        return "true"
    if value is False or value == "false":
        return "false"
    return value
