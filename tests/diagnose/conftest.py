"""Helpers for the diagnose tests: the planted-problem file and the line of each `# planted:` marker."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PLANTED = HERE / "planted.py"
EXAMPLES = HERE.parents[1] / "examples"
CORPUS = HERE / "corpus"
"""Realistic models with one problem each, found by their statements (no marker comments)."""


def marker_line(tag: str, file: Path = PLANTED) -> int:
    """Line number of the `# planted: <tag>` marker (or of the first line containing `tag`)."""
    lines = file.read_text().splitlines()
    for i, text in enumerate(lines, 1):
        if f"# planted: {tag}" in text:
            return i
    for i, text in enumerate(lines, 1):
        if tag in text:
            return i
    raise AssertionError(f"no line with {tag!r} in {file}")


def statement_line(file: Path, start: str) -> int:
    """Line number of the first line that starts (after indentation) with `start`."""
    for i, text in enumerate(file.read_text().splitlines(), 1):
        if text.strip().startswith(start):
            return i
    raise AssertionError(f"no line starting with {start!r} in {file}")


def target(name: str) -> str:
    return f"{PLANTED}:{name}"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts and ends with a clean torch.compile state."""
    import torch

    torch.compiler.reset()
    yield
    torch.compiler.reset()
