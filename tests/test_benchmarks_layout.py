"""benchmarks/ stays navigable: every results folder the docs, the claims or the code cite exists,
every script in benchmarks/ is documented in docs/benchmarks.md, the scripts the front pages tell a
reader to run exist, and no run's lock file is committed."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS_PATH = re.compile(r"benchmarks/results/[A-Za-z0-9_.@/-]*[A-Za-z0-9_]")
SCRIPT_PATH = re.compile(r"benchmarks/[A-Za-z0-9_/-]+\.(?:sh|py)\b")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def cited_results_paths(texts: dict[str, str]) -> dict[str, set[str]]:
    """benchmarks/results/... paths named in each text (file name -> paths)."""
    return {name: set(RESULTS_PATH.findall(text)) for name, text in texts.items()}


def missing_paths(cited: dict[str, set[str]], root: Path) -> list[str]:
    return sorted(f"{name}: {path}" for name, paths in cited.items() for path in paths if not (root / path).exists())


def broken_links(md: Path, root: Path) -> list[str]:
    """Relative markdown links of `md` that resolve to nothing."""
    broken = []
    for target in MD_LINK.findall(md.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            continue
        if not (md.parent / target).resolve().exists():
            broken.append(f"{md.relative_to(root)}: {target}")
    return broken


def undocumented_scripts(bench: Path, listing: str) -> list[str]:
    """Scripts under benchmarks/ (results and published data aside) the listing does not name."""
    scripts = [p for p in bench.rglob("*") if p.suffix in (".sh", ".py") and p.is_file()
               and not {"results", "published", "__pycache__"} & set(p.relative_to(bench).parts)]
    return sorted(str(p.relative_to(bench.parent)) for p in scripts if str(p.relative_to(bench.parent)) not in listing)


def test_every_cited_results_folder_exists():
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "src").rglob("*.py")})
    claims = tomllib.loads((BENCH / "claims.toml").read_text())["claim"]
    files = [c["file"] for c in claims if "file" in c]
    files += [t["file"] for c in claims for key in ("num", "den") for t in c.get(key, [])]
    texts["benchmarks/claims.toml"] = "\n".join(files)
    assert files and not missing_paths(cited_results_paths(texts), ROOT)


def test_links_in_results_readmes_and_docs_resolve():
    pages = [*PAGES, *sorted((BENCH / "results").rglob("*.md"))]
    broken = [b for page in pages for b in broken_links(page, ROOT)
              if page.is_relative_to(BENCH) or "benchmarks/" in b.split(": ", 1)[1]]
    assert not broken, broken


def test_every_benchmark_script_is_listed_in_docs_benchmarks():
    listing = (ROOT / "docs" / "benchmarks.md").read_text()
    assert not undocumented_scripts(BENCH, listing)


def test_scripts_the_front_pages_name_exist():
    named = {m for page in (ROOT / "README.md", ROOT / "docs" / "benchmarks.md") for m in SCRIPT_PATH.findall(page.read_text())}
    assert named and not sorted(n for n in named if not (ROOT / n).is_file())


def test_no_lock_file_is_committed_under_benchmarks():
    assert not sorted(str(p.relative_to(ROOT)) for p in BENCH.rglob(".kiln.lock"))


def test_the_checks_fail_on_a_missing_folder_a_broken_link_and_an_unlisted_script(tmp_path):
    (tmp_path / "benchmarks" / "results" / "gpu" / "kept").mkdir(parents=True)
    cited = cited_results_paths({"README.md": "see benchmarks/results/gpu/kept and benchmarks/results/gpu/gone."})
    assert missing_paths(cited, tmp_path) == ["README.md: benchmarks/results/gpu/gone"]
    md = tmp_path / "benchmarks" / "results" / "gpu" / "README.md"
    md.write_text("[kept](kept/) [gone](gone/results.md) [web](https://example.org) [top](#x)")
    assert broken_links(md, tmp_path) == ["benchmarks/results/gpu/README.md: gone/results.md"]
    (tmp_path / "benchmarks" / "tools").mkdir()
    for name in ("listed.sh", "tools/helper.py", "hidden.sh", "results/gpu/kept/made.py"):
        (tmp_path / "benchmarks" / name).write_text("")
    listing = "`benchmarks/listed.sh` and `benchmarks/tools/helper.py`"
    assert undocumented_scripts(tmp_path / "benchmarks", listing) == ["benchmarks/hidden.sh"]
