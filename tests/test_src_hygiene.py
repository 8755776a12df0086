"""src/ carries what the code does and why, not the history of how it was measured.

Measured figures and the paths of committed results belong in the results READMEs
(benchmarks/results/**/README.md) and benchmarks/claims.toml, where the tests of claims check them;
a docstring or comment says what a choice is and why in words (docs/architecture.md, "Figures live
beside the results").
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kiln"
FILES = sorted(SRC.rglob("*.py"))

# A measured figure: a number with a unit of time or throughput (`337 us`, `1.54 ms`, `21.88 ms/step`,
# `2972 GB/s`, `799.8 TFLOP/s`, `4,300 tok/s`), a decimal speedup (`1.66x`) or a measured ratio
# (`20x slower`). Percentages are left out: most in src/ are thresholds and bounds, not results.
# Text in backticks is code or a format example (`1.52x (509 -> 335 ms/step)`) and is skipped.
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(\.\d+)?\s?(ms|us|µs|ns)(/step)?\b"
    r"|(?<![\w.])\d[\d,]*(\.\d+)?\s?(tok/s|tokens/s|[GT]B/s|GiB/s|T?FLOP/s)"
    r"|(?<![\w.])\d+\.\d+x\b"
    r"|(?<![\w.])\d+x\s+(slower|faster)\b"
)
_CODE_SPAN = re.compile(r"`[^`]*`")


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module: module, class and function
    docstrings and the string literal under an attribute or field."""
    text = path.read_text(encoding="utf-8")
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                found.append((stmt.lineno, stmt.value.value))
    return found


def figures(path: Path) -> list[str]:
    out = []
    for line, text in prose(path):
        for match in FIGURE.finditer(_CODE_SPAN.sub("", text.replace("\n", " "))):
            out.append(f"{path.relative_to(SRC.parent)}:{line}: {match.group(0)!r}")
    return out


def test_no_results_paths_in_src():
    cited = [f"{p.relative_to(SRC.parent)}:{n}" for p in FILES
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "benchmarks/results/" in line]
    assert not cited, f"name the results in words and move the path to the results README: {cited}"


def test_no_measured_figures_in_src_docstrings_or_comments():
    found = [hit for p in FILES for hit in figures(p)]
    assert not found, f"move these figures to the matching results README: {found}"


@pytest.mark.parametrize(("text", "hits"), [
    ("the backward took 337 us per layer", True),
    ("1.54 ms where reading takes ~0.7 ms", True),
    ("21.88 ms/step at bf16-mixed", True),
    ("read-only stream 2972 GB/s", True),
    ("1.66x the config's recipe", True),
    ("on an H100 it ran 20x\n    slower", True),
    ("a format example: `1.52x (509 -> 335 ms/step)`", False),
    ("timeout_s: seconds a collective may wait", False),
    ("batch 4 x 2048, 64 MiB per unit, 2x and 3x the example's", False),
])
def test_the_figure_pattern(text, hits):
    assert bool(FIGURE.search(_CODE_SPAN.sub("", text))) is hits
