"""Generate the configuration reference (docs/reference.md) from the schema.

The tables come from the dataclasses (key, type, default), `CHOICES` and the string literal under
each field in `schema.py` (Python keeps no runtime record of those, so they are read with `ast`).

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
from kiln.config.schema import CHOICES, Config

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


def _cell(text: str) -> str:
    # GFM splits table cells on `|` even inside code spans unless it is escaped.
    return " ".join(text.split()).replace("|", "\\|")


def config_reference_markdown() -> str:
    """One markdown table per config section: key, type, default, choices, description."""
    docs = field_docstrings()
    section_docs = docs.get(Config.__name__, {})
    hints = typing.get_type_hints(Config)
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
        for f in dataclasses.fields(cls):
            key = f"{section.name}.{f.name}"
            type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            choices = ", ".join(f"`{c}`" for c in CHOICES[key]) if key in CHOICES else ""
            row = (
                f"`{key}`",
                f"`{type_name}`",
                f"`{_literal(_default(f))}`",
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
