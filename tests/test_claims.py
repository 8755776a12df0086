"""The figures README.md and docs/ state, against the committed results they come from (benchmarks/claims.toml).

Each claim names the README text stating a figure and where the figure is read: a field of a row of
a committed results.json (or a ratio of means of such fields, or a fraction of a datasheet figure).
The test fails when the README text is edited, the results file is gone, or the value no longer
rounds to the figure as printed.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = tomllib.loads((ROOT / "benchmarks" / "claims.toml").read_text())["claim"]


def _spaced(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _rows(path: Path, key: str = "results") -> list[dict]:
    results = json.loads(path.read_text())[key]
    return results if isinstance(results, list) else [results]


def read_term(term: dict, root: Path = ROOT) -> float:
    """One JSON field: of row `row`, or of the first row whose keys match `where`."""
    path = root / term["file"]
    assert path.is_file(), f"results file is gone: {term['file']}"
    rows = _rows(path, term.get("list", "results"))
    if "row" in term:
        row = rows[term["row"]]
    else:
        matching = [r for r in rows if all(r.get(k) == v for k, v in term["where"].items())]
        assert matching, f"{term['file']}: no row with {term['where']}"
        row = matching[0]
    value = row.get(term["field"])
    assert isinstance(value, (int, float)), f"{term['file']}: {term['field']} is {value!r}"
    return float(value)


def claim_value(claim: dict, root: Path = ROOT) -> float:
    """The figure a claim's results give, before rounding: a field, or mean(num) / mean(den); over
    `spec` when given; times `scale`."""
    if "num" in claim:
        value = statistics.mean(read_term(t, root) for t in claim["num"])
        if "den" in claim:
            value /= statistics.mean(read_term(t, root) for t in claim["den"])
    else:
        value = read_term(claim, root)
    if "spec" in claim:
        assert claim.get("spec_source"), "a datasheet figure names its source"
        value /= claim["spec"]
    return value * claim.get("scale", 1)


def rounds_to(value: float, figure: str) -> bool:
    """`value` printed at the figure's precision is the figure (half a unit of its last digit)."""
    figure = figure.replace(",", "")  # thousands separators: 55,372
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    return abs(value - float(figure)) <= 0.5 * 10**-decimals + 1e-9


# The pages a reader meets: the front door and every page under docs/ (the guides in docs/guide/ too).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README = _spaced("\n".join(page.read_text() for page in PAGES))


@pytest.mark.parametrize("claim", CLAIMS, ids=[f"{c['figure']}@{c['readme'][:40]}" for c in CLAIMS])
def test_readme_figure_matches_its_results(claim):
    assert claim["figure"] in claim["readme"], "the figure is part of the README text"
    assert _spaced(claim["readme"]) in README, f"README.md and docs/ no longer say {claim['readme']!r}"
    value = claim_value(claim)
    assert rounds_to(value, claim["figure"]), f"{claim['readme']!r}: the results give {value:.6g}"


def test_the_check_fails_on_an_edited_figure_or_a_missing_file(tmp_path):
    claim = {"readme": "x", "figure": "2.5", "file": "r.json", "where": {"k": "a"}, "field": "v"}
    (tmp_path / "r.json").write_text(json.dumps({"results": [{"k": "b", "v": 9.0}, {"k": "a", "v": 2.46}]}))
    assert rounds_to(claim_value(claim, tmp_path), "2.5") and not rounds_to(claim_value(claim, tmp_path), "2.4")
    assert not rounds_to(2.56, "2.5") and rounds_to(2.549, "2.5") and rounds_to(368.4, "368")
    assert rounds_to(55372.2, "55,372") and not rounds_to(55373.6, "55,372")
    ratio = {"num": [{"file": "r.json", "row": 0, "field": "v"}], "den": [{"file": "r.json", "row": 1, "field": "v"}],
             "spec": 2.0, "spec_source": "a datasheet", "scale": 100}
    assert claim_value(ratio, tmp_path) == pytest.approx(9.0 / 2.46 / 2.0 * 100)
    with pytest.raises(AssertionError, match="gone"):
        claim_value({**claim, "file": "missing.json"}, tmp_path)
    with pytest.raises(AssertionError, match="no row"):
        claim_value({**claim, "where": {"k": "c"}}, tmp_path)
