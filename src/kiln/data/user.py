"""User datasets: `data.source = "package.module:function"` or `"path/to/file.py:function"`.

The function takes no arguments, or a `split` keyword ("train" / "eval") when it declares one,
and returns a map-style dataset (`__getitem__` + `__len__`, items `(x, y)`) or a
`torch.utils.data.IterableDataset` yielding `(x, y)`. Returning None for "eval" means "no eval
data". A function without a `split` parameter provides training data only.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterableDataset

from kiln.config.errors import ConfigError

KEY = "data.source"


def resolve_function(target: str, key: str = KEY) -> Callable[..., Any]:
    """Import `module:function` or `file.py:function` and return the function."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(key, f"{target!r} is not module:function or path/file.py:function")
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _import_file(where, key)
    else:
        module = _import_module(where, key)
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(key, f"{where} has no attribute {name!r}")
    if not callable(fn):
        raise ConfigError(key, f"{target} is a {type(fn).__name__}, not a function")
    return fn


def _import_file(path: str, key: str) -> Any:
    if not os.path.isfile(path):
        raise ConfigError(key, f"file not found: {path}")
    full = os.path.abspath(path)
    # A stable name per file, registered in sys.modules so classes defined there can be pickled
    # into DataLoader workers (fork) and imported twice without running the file twice.
    mod_name = "kiln_user_data_" + "".join(c if c.isalnum() else "_" for c in full)
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, full)
    if spec is None or spec.loader is None:
        raise ConfigError(key, f"cannot import {path} (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise ConfigError(key, f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(name: str, key: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0]:
            raise ConfigError(key, f"importing {name} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(key, f"importing {name} failed: {type(exc).__name__}: {exc}") from exc
    # `kiln` is a console script, so the working directory is not on sys.path as it is for
    # `python -m`; look there once, then restore sys.path (no lasting global change).
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ConfigError(key, f"no module named {name!r} (not installed, not in {cwd})") from exc
    except Exception as exc:
        raise ConfigError(key, f"importing {name} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(cwd)


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
