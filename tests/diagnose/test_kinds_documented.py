"""Every kind `kiln explain` and `kiln doctor` can report has a row in the diagnosis guide's table
and in README.md's list, each with its fix: a new category that is not documented fails here.

The kinds are the graph-break and recompile categories of kiln.diagnose.break_kinds and the crash
kinds of kiln.diagnose.crash. The first two tests check that those tuples hold every category the
code can produce (every category constant of classify.py; every `kind` explain_crash returns).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import kiln.diagnose.break_kinds as classify
import kiln.diagnose.crash as crash

ROOT = Path(__file__).resolve().parents[2]
KINDS = (*classify.BREAK_CATEGORIES, *classify.RECOMPILE_CATEGORIES, *crash.CRASH_KINDS)


def test_the_category_tuples_hold_every_category_constant():
    constants = {v for k, v in vars(classify).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(classify.BREAK_CATEGORIES) | set(classify.RECOMPILE_CATEGORIES)
    assert len(KINDS) == len(set(KINDS))
    assert {c for c, _, _ in classify._RULES} <= set(classify.BREAK_CATEGORIES)
    assert {c for c, _, _ in classify._GUARD_RULES} <= set(classify.RECOMPILE_CATEGORIES)


def test_the_crash_kinds_hold_every_kind_explain_crash_returns():
    tree = ast.parse(inspect.getsource(crash.explain_crash))
    kinds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "kind":
                    kinds.add(value.value if isinstance(value, ast.Constant) else getattr(crash, value.id))
    assert kinds == set(crash.CRASH_KINDS)


def table_kinds(markdown: str) -> dict[str, str]:
    """kind -> the rest of its table row, for every backticked kind in a row's first cell."""
    out = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.lstrip().startswith("|") or len(cells) < 2:
            continue
        for kind in re.findall(r"`([^`]+)`", cells[0]):
            out[kind] = " | ".join(cells[1:])
    return out


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n#", 1)[0]


def undocumented(kinds: tuple[str, ...], rows: dict[str, str]) -> list[str]:
    return [k for k in kinds if not rows.get(k, "").strip(" |-")]


def test_every_kind_has_a_row_with_its_fix_in_the_guide():
    guide = (ROOT / "docs" / "guide" / "diagnose.md").read_text()
    rows = table_kinds(_section(guide, "## Graph breaks and crashes"))
    assert not undocumented(KINDS, rows), undocumented(KINDS, rows)


def test_every_kind_has_a_line_with_its_fix_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    section = _section(readme, "### What `kiln explain` and `kiln doctor` recognise")
    rows = table_kinds(section)
    assert not undocumented(KINDS, rows), undocumented(KINDS, rows)
    assert "docs/guide/diagnose.md" in section  # the guide, for the detail
    assert len(section.strip().splitlines()) <= 25


def test_the_check_names_a_missing_kind():
    rows = table_kinds("| kind | fix |\n|---|---|\n| `numpy`, `python random` | the torch call |\n| `dtype change` | |\n")
    assert undocumented(("numpy", "python random", "dtype change", "shape change"), rows) == [
        "dtype change", "shape change"]
