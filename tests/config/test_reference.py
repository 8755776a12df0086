"""The generated config reference: complete, well-formed, and the one in docs/reference.md."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

from kiln.config import Config
from kiln.config.choices import field_choices
from kiln.config.reference import (
    END_MARKER,
    START_MARKER,
    config_reference_markdown,
    field_docstrings,
    main,
    replace_between_markers,
)

CHOICES = field_choices()

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
SECTIONS: dict[str, type] = typing.get_type_hints(Config)


def all_keys() -> list[str]:
    return [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def table_cells(row: str) -> list[str]:
    """Cells of a markdown table row, splitting on `|` that is not escaped."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def test_every_field_has_a_docstring():
    docs = field_docstrings()
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in (Config, *SECTIONS.values())
        for f in dataclasses.fields(cls)
        if not docs.get(cls.__name__, {}).get(f.name, "").strip()
    ]
    assert not missing, f"add a docstring (string literal under the field) in schema.py for: {missing}"


def test_docstrings_belong_to_real_fields():
    docs = field_docstrings()
    for cls in (Config, *SECTIONS.values()):
        assert set(docs[cls.__name__]) == {f.name for f in dataclasses.fields(cls)}


def test_one_table_per_section_with_every_key():
    text = config_reference_markdown()
    for section in SECTIONS:
        assert f"### `[{section}]`" in text
    rows = {table_cells(line)[0]: table_cells(line) for line in text.splitlines() if line.startswith("| `")}
    assert sorted(rows) == sorted(f"`{k}`" for k in all_keys())
    for key, cells in rows.items():
        assert len(cells) == 5, key  # key, type, default, choices, description: no stray `|`
        assert cells[4], f"{key} has no description"
        dotted = key.strip("`")
        if dotted in CHOICES:
            assert cells[3] == ", ".join(f"`{c}`" for c in CHOICES[dotted])
        else:
            assert cells[3] == ""


def test_types_and_defaults():
    rows = {
        table_cells(line)[0]: table_cells(line)
        for line in config_reference_markdown().splitlines()
        if line.startswith("| `")
    }
    assert rows["`training.steps`"][1:3] == ["`int`", f"`{Config().training.steps}`"]
    assert rows["`model.name`"][1:3] == ["`str`", '`"mlp"`']
    assert rows["`optim.betas`"][1:3] == ["`list[float]`", "`[0.9, 0.999]`"]
    assert rows["`model.kwargs`"][1:3] == ["`dict[str, Any]`", "`{}`"]
    assert rows["`training.deterministic`"][2] == "`false`"


def test_output_is_deterministic_and_ends_with_newline():
    text = config_reference_markdown()
    assert text == config_reference_markdown()
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_module_prints_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "kiln.config.reference"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out == config_reference_markdown()


def test_update_rewrites_only_the_marked_block(tmp_path, capsys):
    doc = tmp_path / "README.md"
    doc.write_text(f"# Title\n\nbefore\n{START_MARKER}\nstale\n{END_MARKER}\nafter\n", encoding="utf-8")
    assert main(["--update", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert text == f"# Title\n\nbefore\n{START_MARKER}\n{config_reference_markdown()}{END_MARKER}\nafter\n"
    assert main(["--update", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == text  # idempotent
    assert replace_between_markers(text, config_reference_markdown()) == text
    doc.write_text("no markers\n", encoding="utf-8")
    assert main(["--update", str(doc)]) == 2


def test_docs_contain_the_current_reference():
    text = REFERENCE.read_text(encoding="utf-8")
    assert START_MARKER in text and END_MARKER in text, f"docs/reference.md needs {START_MARKER} ... {END_MARKER}"
    block = text.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0]
    assert block.strip() == config_reference_markdown().strip(), (
        "docs/reference.md is out of date: run `python -m kiln.config.reference --update docs/reference.md`"
    )
