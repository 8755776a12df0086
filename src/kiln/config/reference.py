"""Generate the configuration reference (docs/reference.md) from the schema.

The tables come from the dataclasses (key, type, default), the choices of each `Literal` or
`bool | None` field (`kiln.config.choices`) and the string literal under each field in `schema.py` (Python keeps no runtime record of those, so they are read with `ast`).

    python -m kiln.config.reference                 # print the markdown
    python -m kiln.config.reference --update docs/reference.md
                                                    # rewrite the block between the markers
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any

from kiln.config import schema
from kiln.config.choices import field_choices, is_switch, literal_values, switch_spelling
from kiln.config.schema import Config

START_MARKER = "<!-- config-reference:start -->"
END_MARKER = "<!-- config-reference:end -->"


def field_docstrings() -> dict[str, dict[str, str]]:
    """Class name -> field name -> the string literal that follows the field in schema.py."""
    tree = ast.parse(inspect.getsource(schema))
    docs: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, str] = {}
        body = node.body
        for stmt, following in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                fields[stmt.target.id] = inspect.cleandoc(following.value.value)
        docs[node.name] = fields
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _literal(value: Any) -> str:
    """A default as it would be written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _type_name(tp: Any) -> str:
    """The type as a user writes the value: a `Literal` is a string, a switch a bool or `auto`."""
    if literal_values(tp) is not None:
        return "str"
    if is_switch(tp):
        return 'bool | "auto"'
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _cell(text: str) -> str:
    # GFM splits table cells on `|` even inside code spans unless it is escaped.
    return " ".join(text.split()).replace("|", "\\|")


def config_reference_markdown() -> str:
    """One markdown table per config section: key, type, default, choices, description."""
    docs = field_docstrings()
    section_docs = docs.get(Config.__name__, {})
    hints = typing.get_type_hints(Config)
    all_choices = field_choices()
    out: list[str] = []
    for section in dataclasses.fields(Config):
        cls = hints[section.name]
        out.append(f"### `[{section.name}]`")
        out.append("")
        if section_docs.get(section.name):
            out.append(section_docs[section.name])
            out.append("")
        out.append("| Key | Type | Default | Choices | Description |")
        out.append("|---|---|---|---|---|")
        class_docs = docs.get(cls.__name__, {})
        field_types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section.name}.{f.name}"
            tp = field_types[f.name]
            default = switch_spelling(_default(f)) if is_switch(tp) else _default(f)
            choices = ", ".join(f"`{c}`" for c in all_choices[key]) if key in all_choices else ""
            row = (
                f"`{key}`",
                f"`{_type_name(tp)}`",
                f"`{_literal(default)}`",
                choices,
                class_docs.get(f.name, ""),
            )
            out.append("| " + " | ".join(_cell(c) for c in row) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def replace_between_markers(text: str, content: str) -> str:
    """`text` with the part between the reference markers replaced by `content`."""
    start = text.index(START_MARKER) + len(START_MARKER)
    end = text.index(END_MARKER, start)
    return text[:start] + "\n" + content.strip("\n") + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.config.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--update", metavar="FILE", help=f"rewrite the block between {START_MARKER} and {END_MARKER}")
    args = parser.parse_args(argv)
    table = config_reference_markdown()
    if args.update is None:
        sys.stdout.write(table)
        return 0
    path = Path(args.update)
    text = path.read_text(encoding="utf-8")
    if START_MARKER not in text or END_MARKER not in text:
        print(f"{path}: needs the markers {START_MARKER} and {END_MARKER}", file=sys.stderr)
        return 2
    path.write_text(replace_between_markers(text, table), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
