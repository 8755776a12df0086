"""One definition per command option: a dataclass field whose metadata is its flag.

A command's request is a dataclass; each field made by `option` carries the flag's name, help,
parse type and how it is written back. From that one definition come the argparse flags
(`add_flags`), the request (`from_namespace`: the parsed flags as the dataclass, nothing checked)
and the command line recorded with the results (`command_line`). The defaults are the fields'
own. Closed choices are `Literal` annotations; the library checks values (a bad one is a
ConfigError naming the flag), so argparse accepts any string for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shlex
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Literal

Shape = Literal["value", "arg", "switch", "on_off", "tri", "yes_no", "comma", "comma_each", "chunks", "repeat", "pick",
                "words"]
"""How a flag maps to its field: `value` one value (str/int/float/Path, the last one given wins); `arg`
one positional word (RUN_DIR);
`switch` a store_true flag; `on_off` a bool written `on`/`off`; `tri` a `bool | None` set by
the flag (True) or by `Flag.off` (False); `yes_no` a `bool | None` set by `--x` (True) or
`--no-x` (False) as one pair in --help (argparse's BooleanOptionalAction); `comma` a list given as one comma-separated value;
`comma_each` a repeatable comma-separated list (all occurrences joined); `chunks` a repeatable
comma-separated list kept as given (None when absent; the library splits it); `repeat` a list,
one item per occurrence; `pick` a `Literal` field set by one flag per choice
(`--weak` / `--strong`, `help` one text per choice, separated by `|`); `words` the command's
trailing positional words (KEY=VALUE overrides, input files; with `required`, at least one)."""
Record = Literal["changed", "always", "never"]
"""When the recorded command line shows a flag: when its value differs from the default (None
and empty lists never show), always when it has a value, or never."""


@dataclass(frozen=True)
class Flag:
    help: str
    name: str | None = None
    """The flag (`--ppl-context`); None: the field name with dashes."""
    shape: Shape = "value"
    metavar: str | None = None
    required: bool = False
    record: Record = "changed"
    choices: tuple[str, ...] | None = None
    """Choices argparse enforces (only where argparse's usage error is the message users get)."""
    group: str | None = None
    """An argparse argument group's title, for --help."""
    exclusive: str | None = None
    """Flags sharing this key are mutually exclusive (argparse's usage error when two are given);
    `required` on one of them makes the group required (one of them must be given)."""
    off: str | None = None
    """`tri`: the flag that sets False, and its help after a `|` (`--infer|time inference forwards`)."""


def option(default: Any = MISSING, *, help: str, default_factory: Any = MISSING, **flag: Any) -> Any:
    """A dataclass field that is a command option (keywords: the rest of `Flag`)."""
    meta = {"flag": Flag(help=help, **flag)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> Flag | None:
    return f.metadata.get("flag")


def flag_name(f: dataclasses.Field) -> str:
    spec = flag_of(f)
    if spec and spec.shape in ("words", "arg"):
        return f.name
    return spec.name if spec and spec.name else "--" + f.name.replace("_", "-")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a request class, once per class: a command's parser asks for
    each of its fields, and resolving them all again per field made building `kiln`'s parser
    cost more than a short run."""
    return typing.get_type_hints(cls)


def _choices(cls: type, f: dataclasses.Field) -> tuple[str, ...]:
    return typing.get_args(_hints(cls)[f.name])


def flag_names(cls: type, f: dataclasses.Field) -> list[str]:
    """The option strings of field `f` (one per choice for `pick`; none for `words` and `arg`)."""
    spec = flag_of(f)
    if spec is not None and spec.shape == "pick":
        return ["--" + c for c in _choices(cls, f)]
    if spec is not None and spec.shape == "tri":
        return [flag_name(f), spec.off.split("|")[0]]
    if spec is not None and spec.shape == "yes_no":
        return [flag_name(f), "--no-" + flag_name(f)[2:]]
    return [] if spec is None or spec.shape in ("words", "arg") else [flag_name(f)]


def options_of(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields of `cls` that are options, in declaration order."""
    return [(f, spec) for f in dataclasses.fields(cls) if (spec := flag_of(f)) is not None]


def default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def _item_type(cls: type, f: dataclasses.Field) -> type:
    """The parse type of a field: int, float, Path or str (the list's item type for list fields)."""
    hint = _hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if typing.get_origin(args[0]) in (list, tuple):
        args = list(typing.get_args(args[0])[:1])
    return args[0] if args[0] in (int, float, Path) else str


def _comma_items(kind: type):
    """An argparse type: comma-separated items of `kind` (an int that does not parse is a usage error)."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if kind is str:
            return items
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return parse


def add_flags(parser: argparse.ArgumentParser | Any, cls: type, *, only: tuple[str, ...] | None = None) -> None:
    """argparse flags for the option fields of `cls` (those named in `only`, when given)."""
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for f, spec in options_of(cls):
        if only is not None and f.name not in only:
            continue
        if spec.group is not None and spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group)
        where = parser if spec.group is None else groups[spec.group]
        key = spec.exclusive or (f"pick:{f.name}" if spec.shape in ("pick", "tri") else None)
        if key is not None:
            if key not in exclusive:
                exclusive[key] = where.add_mutually_exclusive_group(required=_group_required(cls, key))
            where = exclusive[key]
        if spec.shape == "pick":
            for choice, text in zip(_choices(cls, f), spec.help.split("|")):
                where.add_argument("--" + choice, dest=f.name, action="store_const", const=choice, help=text.strip())
            parser.set_defaults(**{f.name: default_of(f)})
            continue
        if spec.shape == "words":
            where.add_argument(f.name, nargs="+" if spec.required else "*", metavar=spec.metavar, help=spec.help)
            continue
        if spec.shape == "arg":
            kind = _item_type(cls, f)
            where.add_argument(f.name, metavar=spec.metavar, help=spec.help, **({} if kind is str else {"type": kind}))
            continue
        if spec.shape == "tri":
            off, _, off_help = spec.off.partition("|")
            where.add_argument(flag_name(f), dest=f.name, action="store_true", default=None, help=spec.help)
            where.add_argument(off, dest=f.name, action="store_false", help=off_help.strip())
            continue
        if spec.shape == "yes_no":
            where.add_argument(flag_name(f), dest=f.name, action=argparse.BooleanOptionalAction, default=default_of(f),
                               help=spec.help)
            continue
        kw: dict[str, Any] = {"dest": f.name, "help": spec.help}
        if spec.shape not in ("switch", "on_off") and not spec.choices:  # named after the flag, not the field
            kw["metavar"] = spec.metavar or flag_name(f)[2:].replace("-", "_").upper()
        if spec.required and spec.exclusive is None:  # a group's `required` is the group's
            kw["required"] = True
        default = default_of(f)
        if spec.shape == "switch":
            kw.update(action="store_true")
        elif spec.shape == "on_off":
            kw.update(choices=("on", "off"), default="on" if default else "off")
        elif spec.shape == "comma":
            kw.update(type=_comma_items(_item_type(cls, f)), default=default)
        elif spec.shape == "chunks":
            kw.update(action="append", default=None)
        elif spec.shape in ("comma_each", "repeat"):
            kind = _item_type(cls, f)
            kw.update(action="append", default=None,
                      type=_comma_items(kind) if spec.shape == "comma_each" else (None if kind is str else kind))
        else:
            kw["default"] = default
            if _item_type(cls, f) is not str:
                kw["type"] = _item_type(cls, f)
            if spec.choices:
                kw["choices"] = spec.choices
        where.add_argument(flag_name(f), **kw)


def _group_required(cls: type, key: str) -> bool:
    return any(spec.required for _, spec in options_of(cls) if spec.exclusive == key)


def from_namespace(cls: type, args: argparse.Namespace, **extra: Any):
    """The parsed flags as `cls` (lists joined, on/off as bools; nothing checked here)."""
    values: dict[str, Any] = {}
    for f, spec in options_of(cls):
        if not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if spec.shape == "on_off":
            value = value == "on"
        elif spec.shape == "comma_each":
            value = [item for chunk in value or [] for item in chunk]
        elif spec.shape in ("repeat", "words"):
            value = list(value or [])
        values[f.name] = value
    return cls(**values, **extra)


def _text(spec: Flag, value: Any) -> str:
    if spec.shape == "on_off":
        return "on" if value else "off"
    if spec.shape in ("comma", "comma_each", "chunks"):
        return ",".join(map(str, value))
    return str(value)


def command_line(words: list[str], opts: Any) -> str:
    """`words` (`kiln bench llm`) and every option of `opts` as a user would type it, in field order;
    options at their default are left out unless they record `always`."""
    parts = list(words)
    for f, spec in options_of(type(opts)):
        value = getattr(opts, f.name)
        if spec.record == "never" or value is None or (spec.record == "changed" and value == default_of(f)):
            continue
        if spec.shape == "switch":
            parts += [flag_name(f)] if value else []
        elif spec.shape in ("tri", "yes_no"):
            parts.append(flag_names(type(opts), f)[0 if value else 1])
        elif spec.shape == "words":
            parts += list(value)
        elif spec.shape == "arg":
            parts.append(str(value))
        elif spec.shape == "repeat":
            for item in value:
                parts += [flag_name(f), str(item)]
        elif value != [] or spec.shape == "comma":
            parts += [flag_name(f), _text(spec, value)]
    return shlex.join(parts)
