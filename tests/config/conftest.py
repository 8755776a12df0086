from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_toml(tmp_path: Path) -> Callable[[str], Path]:
    """Write dedented TOML text to a file under tmp_path and return its path."""

    def write(text: str, name: str = "run.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write
