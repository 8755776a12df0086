"""The figures README.md, docs/ and the results READMEs state, against the committed results they
come from (benchmarks/claims.toml).

Each claim names the text stating a figure, every page that states it (`pages`), and where the
figure is read: a field of a row of a committed JSON file (or a ratio of means of such fields, or a
fraction of a datasheet figure). The test fails when the text is edited on any one of its pages,
when a page not named states it too, when the results file is gone, or when the value no longer
rounds to the figure as printed. A second test fails when README.md's Results section states a
figure with a unit (ms, tok/s, %, x, GB/s, TF/s, ...) that no claim pins.
"""

from __future__ import annotations

import json
import re
import shutil
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
    """The rows under `key` of a JSON file; a dotted key walks into nested objects (`train`,
    `config.ceilings`) and lists (`results.0.compiled_variants`: a number is an index), and an
    object found there is one row."""
    results = json.loads(path.read_text())
    for part in key.split("."):
        results = results[int(part)] if isinstance(results, list) else results[part]
    return results if isinstance(results, list) else [results]


def read_term(term: dict, root: Path = ROOT) -> float | str:
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
    if isinstance(value, str):  # a setting stated by name (a schedule): compared as text
        return value
    assert isinstance(value, (int, float)), f"{term['file']}: {term['field']} is {value!r}"
    return float(value)


def claim_value(claim: dict, root: Path = ROOT) -> float | str:
    """The figure a claim's results give, before rounding: a field, or mean(num) / mean(den); over
    `spec` when given; plus `offset` (a ratio stated as a change: -1); times `scale`."""
    if "num" in claim:
        value = statistics.mean(read_term(t, root) for t in claim["num"])
        if "den" in claim:
            value /= statistics.mean(read_term(t, root) for t in claim["den"])
    else:
        value = read_term(claim, root)
        if isinstance(value, str):
            return value
    if "spec" in claim:
        assert claim.get("spec_source"), "a datasheet figure names its source"
        value /= claim["spec"]
    return (value + claim.get("offset", 0)) * claim.get("scale", 1)


def rounds_to(value: float | str, figure: str) -> bool:
    """`value` printed at the figure's precision is the figure (half a unit of its last digit);
    a text value is the figure itself."""
    if isinstance(value, str):
        return value == figure
    figure = figure.replace(",", "")  # thousands separators: 55,372
    mantissa, _, exponent = figure.lower().partition("e")  # 3e-4: a unit of 1e-4
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0 ** (int(exponent or 0) - decimals)
    return abs(value - float(figure)) <= 0.5 * unit * (1 + 1e-9) + 1e-12


# The pages a reader meets: the front door, every page under docs/ (the guides in docs/guide/ too),
# and the hand-written README of each results folder (results.md files are written by the tools).
def page_texts(root: Path = ROOT) -> dict[str, str]:
    """Each checked page's text (whitespace runs read as one space), by its path from `root`."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md")),
             *sorted((root / "benchmarks" / "results").rglob("README.md"))]
    return {str(p.relative_to(root)): _spaced(p.read_text()) for p in pages}


PAGES = page_texts()


def claim_problems(claim: dict, texts: dict[str, str], root: Path = ROOT) -> list[str]:
    """What is wrong with one claim against these pages and its results; [] when it holds."""
    text = _spaced(claim["readme"])
    problems = [] if claim["figure"] in claim["readme"] else [f"{claim['figure']!r} is not part of {text!r}"]
    named = claim.get("pages") or []
    if not named:
        problems.append(f"{text!r} names no page")
    for page in named:
        if page not in texts:
            problems.append(f"{page}: not a checked page")
        elif text not in texts[page]:
            problems.append(f"{page} no longer says {text!r}")
    problems += [f"{page} says {text!r} too: name it in the claim's pages"
                 for page, page_text in texts.items() if page not in named and text in page_text]
    value = claim_value(claim, root)
    if not rounds_to(value, claim["figure"]):
        shown = value if isinstance(value, str) else f"{value:.6g}"
        problems.append(f"{text!r}: the results give {shown}, not {claim['figure']}")
    return problems


@pytest.mark.parametrize("claim", CLAIMS, ids=[f"{c['figure']}@{c['readme'][:40]}" for c in CLAIMS])
def test_stated_figure_matches_its_results(claim):
    problems = claim_problems(claim, PAGES)
    assert not problems, "\n".join(problems)


def test_the_check_fails_on_an_edited_figure_or_a_missing_file(tmp_path):
    claim = {"readme": "x", "figure": "2.5", "file": "r.json", "where": {"k": "a"}, "field": "v"}
    (tmp_path / "r.json").write_text(json.dumps({"results": [{"k": "b", "v": 9.0}, {"k": "a", "v": 2.46}],
                                                 "train": {"wall_s": 113.6, "schedule": "cosine"}}))
    assert rounds_to(claim_value(claim, tmp_path), "2.5") and not rounds_to(claim_value(claim, tmp_path), "2.4")
    assert not rounds_to(2.56, "2.5") and rounds_to(2.549, "2.5") and rounds_to(368.4, "368")
    assert rounds_to(55372.2, "55,372") and not rounds_to(55373.6, "55,372")
    assert rounds_to(3e-4, "3e-4") and not rounds_to(4e-4, "3e-4") and rounds_to(0.0, "+0.00")
    ratio = {"num": [{"file": "r.json", "row": 0, "field": "v"}], "den": [{"file": "r.json", "row": 1, "field": "v"}],
             "spec": 2.0, "spec_source": "a datasheet", "scale": 100}
    assert claim_value(ratio, tmp_path) == pytest.approx(9.0 / 2.46 / 2.0 * 100)
    assert claim_value({**ratio, "offset": -1}, tmp_path) == pytest.approx((9.0 / 2.46 / 2.0 - 1) * 100)
    nested = {"file": "r.json", "list": "train", "row": 0}
    assert claim_value({**nested, "field": "wall_s"}, tmp_path) == 113.6
    assert rounds_to(claim_value({**nested, "field": "schedule"}, tmp_path), "cosine")
    assert not rounds_to(claim_value({**nested, "field": "schedule"}, tmp_path), "linear")
    assert claim_value({"file": "r.json", "list": "results.1", "row": 0, "field": "v"}, tmp_path) == 2.46
    with pytest.raises(AssertionError, match="gone"):
        claim_value({**claim, "file": "missing.json"}, tmp_path)
    with pytest.raises(AssertionError, match="no row"):
        claim_value({**claim, "where": {"k": "c"}}, tmp_path)


def _copy_pages(tmp_path: Path) -> Path:
    for page in page_texts():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    return tmp_path


@pytest.mark.parametrize(("old", "new"), [("374.1", "374.2"), ("67,554", "67,555")])
def test_an_edit_of_one_copy_of_a_figure_fails(tmp_path, old, new):
    """README.md and docs/benchmarks.md both state these figures: editing README's copy alone fails,
    naming README.md, though docs/benchmarks.md still says the old text."""
    root = _copy_pages(tmp_path)
    readme = root / "README.md"
    assert old in readme.read_text() and old in (root / "docs" / "benchmarks.md").read_text()
    readme.write_text(readme.read_text().replace(old, new))
    texts = page_texts(root)
    problems = [p for c in CLAIMS if old in c["readme"] for p in claim_problems(c, texts)]
    assert problems and all(p.startswith("README.md no longer says") for p in problems)


def test_a_page_stating_a_claim_it_does_not_name_fails():
    claim = next(c for c in CLAIMS if c["figure"] == "374.1")
    problems = claim_problems({**claim, "pages": ["README.md"]}, PAGES)
    assert problems == [f"docs/benchmarks.md says {_spaced(claim['readme'])!r} too: name it in the claim's pages"]


# A figure with a unit: a number (not part of a name like bf16 or b64) and the unit after it.
FIGURE = re.compile(r"(?<![\w.\-/])([+-]?\d[\d,]*(?:\.\d+)?)\s?(ms|s|tok/s|%|x|GiB|GB/s|TB/s|GB|MB|TF/s|TFLOP/s)"
                    r"(?![\w/])")
# Text in the Results section that carries a unit but is a name, not a measurement.
NOT_FIGURES = {"H100 80GB": "the GPU's product name (NVIDIA H100 80GB HBM3)"}


def results_section(readme: str) -> str:
    """README.md's `## Results` section, whitespace runs read as one space."""
    section = readme.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    return _spaced(section)


def uncovered_figures(section: str, claims: list[dict], page: str = "README.md") -> list[str]:
    """The figures with a unit in `section` that no claim naming `page` states as its figure
    within its own text."""
    spans = []  # (start, end, figure) of every claim text in the section
    for claim in claims:
        if page not in claim.get("pages", []):
            continue
        text = _spaced(claim["readme"])
        spans += [(m.start(), m.start() + len(text), claim["figure"].lstrip("+"))
                  for m in re.finditer(re.escape(text), section)]
    for name in NOT_FIGURES:
        section = section.replace(name, " " * len(name))
    return [m.group(0) for m in FIGURE.finditer(section)
            if not any(s <= m.start() and m.end() <= e and fig == m.group(1).lstrip("+") for s, e, fig in spans)]


def test_every_figure_in_the_readme_results_is_claimed():
    missing = uncovered_figures(results_section((ROOT / "README.md").read_text()), CLAIMS)
    assert not missing, f"README.md's Results state figures no claim in benchmarks/claims.toml pins: {missing}"


def test_the_coverage_check_names_an_unclaimed_figure():
    claims = [{"readme": "kiln 12.5 ms (3.1x eager)", "figure": "12.5", "pages": ["README.md"]}]
    section = "Headline: kiln 12.5 ms (3.1x eager) on one H100 80GB; bf16 b64 Llama-3.2-1B, 2.0 TF/s."
    assert uncovered_figures(section, claims) == ["3.1x", "2.0 TF/s"]
    assert uncovered_figures(section, [{**claims[0], "pages": ["docs/benchmarks.md"]}]) == ["12.5 ms", "3.1x",
                                                                                            "2.0 TF/s"]
