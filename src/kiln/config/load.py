"""TOML loading, dotted `KEY=VALUE` overrides with type conversion, and writing the resolved config.

Everything here is pure Python over dataclasses: no torch import, so `kiln train` can reject bad
input in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

from kiln.config.choices import SWITCH_CHOICES, is_switch, literal_values, switch_keys, switch_spelling
from kiln.config.schema import Config
from kiln.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib
from kiln import safe_io
from kiln.config.validate import validate

CONFIG_LIMIT = 4 << 20
"""The largest config file kiln reads."""
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _unknown_key(key: str, name: str, options: list[str], where: str) -> ConfigError:
    """`training.step: unknown key in [training]; did you mean 'steps'? (valid: <every key of
    training>)`: the close matches as a suggestion, all the section's keys as the valid choices."""
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    what = "unknown section" if where == "the top level" else f"unknown key in [{where}]"
    return ConfigError(key, f"{what}{hint}", sorted(options))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is None:
        return getattr(tp, "__name__", str(tp))
    return str(tp).replace("typing.", "")


# Deeper values parse, but then overflow the stack when the resolved config is copied
# (dataclasses.asdict) or written back (tomli_w); no real model factory needs this depth.
MAX_NESTING = 32


def _check_nesting(key: str, value: Any, depth: int = 0) -> None:
    if depth > MAX_NESTING:
        raise ConfigError(key, f"value nested more than {MAX_NESTING} levels deep")
    if isinstance(value, dict):
        for item in value.values():
            _check_nesting(key, item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_nesting(key, item, depth + 1)


def _coerce_switch(key: str, value: Any) -> bool | None:
    """A `bool | None` field from TOML or the command line: `true`, `false` or `auto` (None), as
    TOML booleans or the strings the tri-state keys always took."""
    if isinstance(value, bool):
        return value
    if value == "auto":
        return None
    if value in ("true", "false"):
        return value == "true"
    raise ConfigError(key, f"unknown value {value!r}", SWITCH_CHOICES)


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert `value` (from TOML or a command-line string) to the field type `tp`, or raise."""
    origin = typing.get_origin(tp)
    if is_switch(tp):
        return _coerce_switch(key, value)
    if literal_values(tp) is not None:  # the value is checked against the choices by validate
        return coerce(key, value, str)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return coerce(key, value, args[0])
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(key, f"expected true or false, got {value!r}", ("true", "false"))
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            text = value.strip().replace("_", "")
            try:
                return int(text)
            except ValueError:
                try:
                    as_float = float(text)
                except ValueError:
                    as_float = None
                if as_float is not None and as_float.is_integer() and abs(as_float) < 2**63:
                    return int(as_float)
        raise ConfigError(key, f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a number, got {value!r}")
        # OverflowError: an int beyond float range (TOML `lr = 1e400` written as digits).
        with contextlib.suppress(ValueError, OverflowError):
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, str):
                return float(value.strip().replace("_", ""))
        raise ConfigError(key, f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return str(value)
        raise ConfigError(key, f"expected a string, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = parse_literal(value)
            if isinstance(value, str):  # not a TOML array: `0.9,0.95`, or `[a, b]` with bare words
                text = value.strip()
                if text.startswith("[") and text.endswith("]"):
                    text = text[1:-1]
                value = [v for v in text.split(",") if v != ""]
            elif not isinstance(value, (list, dict)):
                value = [value]  # `optim.betas=0.9` (one item, no brackets or comma)
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {value!r}")
        if item_tp is Any:
            _check_nesting(key, value)
            return list(value)
        return [coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str):
            value = parse_literal(value)
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {value!r}")
        _check_nesting(key, value)
        return dict(value)
    if tp is Any:
        return value
    raise ConfigError(key, f"unsupported field type {_type_name(tp)}")  # a schema bug, not input


def parse_literal(text: str) -> Any:
    """Read a command-line value as a TOML literal (`3`, `1e-3`, `true`, `[1, 2]`, `{a = 1}`);
    anything that is not a valid literal stays a plain string (`max-autotune`, `runs/x`)."""
    try:
        table = tomllib.loads(f"v = {text}")
    # ValueError: integers over Python's 4300-digit limit; RecursionError: deeply nested arrays or
    # inline tables. Both escape tomllib undecorated (tomllib has no depth limit).
    except (ValueError, RecursionError):  # TOMLDecodeError is a ValueError
        return text
    if list(table) != ["v"]:  # `1\nother = 2`: more than one value, so not a literal
        return text
    return table["v"]


def _merge_table(obj: Any, table: dict[str, Any], prefix: str, seen: set[str] | None = None) -> None:
    """Set `obj`'s fields from a TOML table; the dotted keys set are added to `seen`."""
    hints = _field_types(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for name, value in table.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise _unknown_key(key, name, names, prefix.rstrip(".") or "the top level")
        tp = hints[name]
        if _is_section(tp):
            if not isinstance(value, dict):
                raise ConfigError(key, f"is a section; expected a table, got {value!r}")
            _merge_table(getattr(obj, name), value, f"{key}.", seen)
        else:
            setattr(obj, name, coerce(key, value, tp))
            if seen is not None:
                seen.add(key)


def apply_override(cfg: Config, assignment: str) -> None:
    """Apply one `dotted.key=value` to `cfg` in place, converting the value to the field type.

    Keys inside dict fields (`model.kwargs.hidden_size=512`, `compile.options.x=1`) set one entry.
    """
    if "=" not in assignment:
        if assignment.endswith(".toml"):
            raise ConfigError(assignment, "looks like a config file: pass it as --config FILE (overrides are KEY=VALUE)")
        raise ConfigError(assignment, "override must look like KEY=VALUE (e.g. training.steps=50)")
    key, _, raw = assignment.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(p == "" for p in parts):
        raise ConfigError(key or assignment, "empty key in override")
    obj: Any = cfg
    for i, part in enumerate(parts):
        dotted = ".".join(parts[: i + 1])
        hints = _field_types(type(obj))
        if part not in hints:
            names = [f.name for f in dataclasses.fields(obj)]
            where = f"{'.'.join(parts[:i])}" or "the top level"
            raise _unknown_key(key, part, names, where)
        tp = hints[part]
        last = i == len(parts) - 1
        if _is_section(tp):
            if last:
                raise ConfigError(dotted, "is a section; set one of its keys", [f.name for f in dataclasses.fields(tp)])
            obj = getattr(obj, part)
            continue
        if typing.get_origin(tp) is dict and not last:
            entry_key = ".".join(parts[i + 1 :])
            value = parse_literal(raw)
            _check_nesting(key, value, depth=1)
            getattr(obj, part)[entry_key] = value
            return
        if not last:
            raise ConfigError(dotted, f"is a {_type_name(tp)} value, not a section")
        setattr(obj, part, coerce(dotted, raw, tp))
        return


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the TOML file (if any), then overrides, then validation. Raises ConfigError."""
    cfg = Config()
    from_file: set[str] = set()  # dotted keys the file set
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(str(path), "config file not found")
        try:
            # -sig: files saved by editors that add a BOM; bounded: a config is KiBs, never /dev/zero's endless bytes
            text = safe_io.read_bytes(p, CONFIG_LIMIT, follow=True).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(str(path), f"not valid TOML (not UTF-8): {exc}") from None
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read config file: {exc.strerror or exc}") from None
        try:
            table = tomllib.loads(text)
        # ValueError covers TOMLDecodeError and integers over Python's digit limit; RecursionError
        # deeply nested arrays/tables, which tomllib does not bound.
        except (ValueError, RecursionError) as exc:
            raise ConfigError(str(path), f"not valid TOML: {exc}") from None
        try:
            _merge_table(cfg, table, "", from_file)
        except ConfigError as exc:
            raise exc.in_file(str(path)) from None
    overridden = set()
    for item in overrides:
        apply_override(cfg, item)
        overridden.add(item.partition("=")[0].strip())
    try:
        validate(cfg)
    except ConfigError as exc:  # a value the file set (and no override replaced): name the file
        if exc.key in from_file and exc.key not in overridden:
            raise exc.in_file(str(path)) from None
        raise
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as nested tables, switches spelled as in TOML (`auto`, `true`, `false`), so a
    saved config.toml reads the same as one written by hand."""
    table = dataclasses.asdict(cfg)
    for key in switch_keys():
        section, name = key.split(".")
        if isinstance(table.get(section), dict) and name in table[section]:
            table[section][name] = switch_spelling(table[section][name])
    return table


def dump_toml(cfg: Config) -> str:
    import tomli_w

    return tomli_w.dumps(config_to_dict(cfg))


def save_config(cfg: Config, path: str | Path) -> None:
    text = dump_toml(cfg)
    safe_io.write_atomic(path, text)
