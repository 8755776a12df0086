"""User datasets: `data.source = "package.module:function"` or `"path/to/file.py:function"`.

The function takes no arguments, or a `split` keyword ("train" / "eval") when it declares one,
and returns a map-style dataset (`__getitem__` + `__len__`, items `(x, y)`) or a
`torch.utils.data.IterableDataset` yielding `(x, y)`. Returning None for "eval" means "no eval
data". A function without a `split` parameter provides training data only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterableDataset

from kiln.errors import ConfigError
from kiln.imports import load_callable

KEY = "data.source"


def resolve_function(target: str, key: str = KEY) -> Callable[..., Any]:
    """Import `module:function` or `file.py:function` and return the function."""
    return load_callable(target, key)


def _accepts_split(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without signatures
        return False
    return any(p.name == "split" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def is_map_style(dataset: Any) -> bool:
    return hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")


def load_user_dataset(target: str, split: str) -> Any:
    """Call the user's function; returns a dataset, or None when there is no data for `split`."""
    fn = resolve_function(target)
    accepts_split = _accepts_split(fn)
    if split != "train" and not accepts_split:
        return None
    try:
        dataset = fn(split=split) if accepts_split else fn()
    except Exception as exc:
        raise ConfigError(KEY, f"{target} raised {type(exc).__name__}: {exc}") from exc
    if dataset is None and split != "train":
        return None
    if isinstance(dataset, IterableDataset) or is_map_style(dataset):
        if not isinstance(dataset, IterableDataset) and len(dataset) == 0:
            raise ConfigError(KEY, f"{target} returned an empty dataset")
        return dataset
    raise ConfigError(
        KEY,
        f"{target} returned {type(dataset).__name__}; expected a torch Dataset (map-style, items (x, y)) "
        "or an IterableDataset",
    )
