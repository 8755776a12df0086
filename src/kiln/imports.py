"""Importing user code named `package.module:function` or `path/to/file.py:function`.

One loader for every place kiln takes user code (model factories, datasets, diagnose targets and
backends), so they accept the same forms and fail with the same one-line errors, naming `key`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from kiln.errors import ConfigError

FORMS = ("package.module:function", "path/to/file.py:function")


def split_target(target: str, key: str) -> tuple[str, str]:
    """('module or file', 'function'); splits on the last ':' so 'C:\\x.py:f' keeps its drive."""
    where, sep, func = target.rpartition(":")
    if not sep or not where or not func.isidentifier():
        raise ConfigError(key, f"{target!r} is not a reference to a function", FORMS)
    return where, func


def is_file_ref(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def load_file(where: str, key: str) -> ModuleType:
    path = Path(where).expanduser().resolve()  # relative to the current directory
    if not path.is_file():
        raise ConfigError(key, f"file not found: {path}")
    # A name unique per path: two runs' files both called model.py must not share a module, and
    # registering it in sys.modules lets pickling (DataLoader workers) and dataclasses find it.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    mod_name = f"kiln_user_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(key, f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    # As `python path/file.py` does, the file's directory goes on sys.path so that it can import
    # its sibling modules; it stays there (DataLoader workers unpickle classes from those modules).
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        if added:
            sys.path.remove(folder)
        searched = f" (looked in {folder} and sys.path)" if isinstance(exc, ModuleNotFoundError) else ""
        raise ConfigError(key, f"importing {path} failed: {type(exc).__name__}: {exc}{searched}") from exc
    return module


def import_module(name: str, key: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # "your module does not exist" vs "your module imports something missing"
        if not exc.name or not (name == exc.name or name.startswith(exc.name + ".")):
            raise ConfigError(key, f"importing {name!r} failed: {exc}") from None
    except Exception as exc:
        raise ConfigError(key, f"importing {name!r} failed: {type(exc).__name__}: {exc}") from None
    # `kiln` is a console script, so the working directory is not on sys.path as it is for
    # `python -m`; look there once, then restore sys.path (no lasting global change).
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise ConfigError(key, f"no module named {name!r} (is it on PYTHONPATH / installed?)", FORMS) from None
    except Exception as exc:
        raise ConfigError(key, f"importing {name!r} failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(cwd)


def load_callable(target: str, key: str) -> Callable[..., Any]:
    """The function `target` names; ConfigError(key, ...) when it cannot be found or imported."""
    where, func_name = split_target(target, key)
    module = load_file(where, key) if is_file_ref(where) else import_module(where, key)
    func = getattr(module, func_name, None)
    if func is None:
        names = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and not isinstance(v, ModuleType))
        raise ConfigError(key, f"{where!r} has no function {func_name!r}", names or None)
    if not callable(func):
        raise ConfigError(key, f"{where}:{func_name} is a {type(func).__name__}, not a function")
    return func
