"""Check `model.kwargs` against a factory's signature before anything is built.

Building a ViT-B or a 3B LM takes seconds to minutes; a typo in a kwarg should fail in
milliseconds, naming the key and the arguments that exist.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from kiln.errors import ConfigError

_SIMPLE = (bool, int, float, str)


def _accepts(hint: Any, value: Any) -> bool | None:
    """Whether `value` fits a simple type hint; None when the hint is not simple enough to judge."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        # TOML writes `dropout = 0` as an int; an int is a fine float.
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        verdicts = [_accepts(arg, value) for arg in typing.get_args(hint)]
        if any(v is None for v in verdicts):
            return None
        return any(verdicts)
    return None


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("NoneType", "None")


def bind_kwargs(factory: Callable[..., Any], kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The keyword arguments `factory` will get, defaults filled in; ConfigError on a bad one.

    Checks: unknown names (unless the factory takes **kwargs), missing required arguments, and
    values that contradict a simple type annotation (int/float/bool/str and their unions).
    """
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return dict(kwargs)  # builtins/C functions without a signature: let the call decide
    params = sig.parameters
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if not takes_var_kw:
        for key in kwargs:
            if key not in named:
                close = difflib.get_close_matches(key, named, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"model.kwargs.{key}", f"{where} takes no argument {key!r}{hint}", named or ["(none)"]
                )
    for n in named:
        if n not in kwargs and params[n].default is inspect.Parameter.empty:
            raise ConfigError(f"model.kwargs.{n}", f"{where} needs this argument; set it in model.kwargs")

    try:
        # Resolves string annotations (`from __future__ import annotations`); a user's exotic
        # annotation that cannot be resolved just turns the type check off.
        hints = typing.get_type_hints(factory)
    except Exception:
        hints = {}
    for key, value in kwargs.items():
        hint = hints.get(key)
        if hint is None:
            continue
        if _accepts(hint, value) is False:
            raise ConfigError(
                f"model.kwargs.{key}",
                f"{where} expects {_hint_name(hint)}, got {type(value).__name__} {value!r}",
            )

    resolved = {n: params[n].default for n in named if params[n].default is not inspect.Parameter.empty}
    resolved.update(kwargs)
    return resolved
