"""Every relative link in README.md and docs/ points at a file (or directory) that exists, and a
link with an `#anchor` into a markdown page at one of that page's headings.

Anchors are GitHub's: the heading text lowercased, inline markup and punctuation other than `-`
and `_` dropped, spaces turned into `-`, and `-1`, `-2`, ... appended to repeats. Links inside
fenced code blocks and inline code are not links. Absolute URLs (http, https, mailto) are not
checked: tests make no network calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks (lines kept, so line numbers stay right)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of each markdown link or image outside code."""
    found = []
    for number, line in enumerate(_prose(text).splitlines(), 1):
        for match in _LINK.finditer(_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[*_`~]|<[^>]+>", lambda m: "_" if m.group(0) == "_" else "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (repeats numbered as GitHub numbers them)."""
    seen: dict[str, int] = {}
    result = set()
    for match in _HEADING.finditer(_prose(text)):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page: Path) -> list[str]:
    """`page:line: target (why)` for each relative link that does not resolve."""
    problems = []
    text = page.read_text(encoding="utf-8")
    for number, target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.name}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{where} (no heading with anchor #{anchor})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert not broken_links(page), "\n".join(broken_links(page))


def test_the_check_finds_a_missing_file_a_missing_anchor_and_skips_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Exit codes: `0` / 1\n\n## Exit codes: `0` / 1\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#exit-codes-0--1) [ok](docs/a.md#exit-codes-0--1-1) [self](#top)\n"
        "# Top\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#exit-code) [web](https://example.com/x.md)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n[dir](docs/)\n"
    )
    assert broken_links(page) == [
        "README.md:3: docs/b.md (no such file)",
        "README.md:3: docs/a.md#exit-code (no heading with anchor #exit-code)",
    ]


def test_slugs_follow_github():
    assert slug("Is compile worth it: `kiln bench compile`") == "is-compile-worth-it-kiln-bench-compile"
    assert slug("`compile.enabled=true` alone") == "compileenabledtrue-alone"
    assert slug("How far does it scale: `kiln bench scale`, `comm`, `predict`") == (
        "how-far-does-it-scale-kiln-bench-scale-comm-predict")
    assert slug("fsdp_unit_blocks and [links](x.md)") == "fsdp_unit_blocks-and-links"


def test_the_architecture_page_reaches_the_training_step_and_the_decode_step_in_one_hop():
    page = ROOT / "docs" / "architecture.md"
    targets = {(page.parent / t.partition("#")[0]).resolve() for _, t in links(page.read_text(encoding="utf-8"))}
    assert (ROOT / "src" / "kiln" / "train" / "step.py").resolve() in targets
    assert (ROOT / "src" / "kiln" / "llm" / "engine.py").resolve() in targets
    readme = {t for _, t in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    assert "docs/architecture.md" in readme
