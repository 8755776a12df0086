"""kiln's import graph: no module import cycle, no import from a lower room into a higher one, and
imports of kiln modules at the top of the module.

Every module under src/kiln is parsed with `ast` (imports at any depth, `if TYPE_CHECKING:` blocks
left out since they never run). A *room* is a package under src/kiln or a top-level module; rooms
are ordered low to high (ROOMS) and a room may import only from rooms below it or from itself. An
import inside a function hides a dependency, so one of a kiln module is allowed only
- in kiln/cli/, whose command handlers import the library when the command runs (so `kiln --help`
  and bad-input errors stay fast), or
- when its target needs an optional dependency at import time: it imports at top level a package
  that is not in the standard library, not torch or numpy and not one of pyproject's core
  [project.dependencies], or a kiln module that does.

Order notes, where a dependency looks surprising but is right:
- `__main__` (`python -m kiln`) is the entry point: it sits above cli, the only room it calls.
- llm < models: kiln's decoder and its checkpoints are single-device model code; models/ adapts
  them (and HF models) into trainable models, so models/llama.py and models/hf.py import llm/.
- runtime (device, seeds, deterministic mode, run-dir names) sits beside precision, low: it
  imports only errors, and bench/, advise/, tune/ and cli/ use it without importing train/.
- kernels < llm, train: a kernel knows tensors, not models; llm/ and train/ swap it into a model.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"

LEAF = ("__init__", "errors", "config", "imports", "signing", "noise", "tables", "activity", "timing", "outputs", "safe_io")
ROOMS: tuple[tuple[str, ...], ...] = (
    LEAF,
    ("cpu",),
    ("precision", "compile", "compile_cache", "runtime"),
    ("kernels",),
    ("llm",),
    ("models",),
    ("data",),
    ("failure",),
    ("monitor",),
    ("distributed",),
    ("checkpoint",),
    ("train",),
    ("generate",),
    ("serve",),
    ("profile",),
    ("bench",),
    ("diagnose",),
    ("tune",),
    ("report",),
    ("advise",),
    ("cli",),
    ("__main__",),
)
"""kiln's rooms, lowest first; a room imports only from its own tuple's rooms or earlier ones.
`__init__` is kiln/__init__.py (the package itself)."""

LAZY_ROOMS = ("cli",)
"""Rooms whose modules may import kiln modules inside functions (command handlers)."""

ALWAYS_CORE = ("torch", "numpy")
"""Third-party packages every kiln module may import at top level, whatever pyproject says."""

LAZY_ALLOWED: dict[str, str] = {
    "kiln.checkpoint": "re-exports its torch modules on first use, so export_request imports without torch",
    "kiln.data": "re-exports its torch modules on first use, so prepare_request imports without torch",
}
"""Module -> why it may still import kiln modules inside functions where check (3) would refuse it."""


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # a module of the package, or the top-level name of an outside package
    in_function: bool
    internal: bool


def module_index(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `package` under `src`."""
    mods = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, mods: dict[str, Path], package: str) -> list[Import]:
    """Every import statement of `module`, at any depth (TYPE_CHECKING blocks left out)."""
    is_pkg = path.name == "__init__.py"
    base = module if is_pkg else module.rpartition(".")[0]
    found: list[Import] = []

    def names(node: ast.Import | ast.ImportFrom) -> Iterable[str]:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
            return
        stem = node.module or ""
        if node.level:
            parts = base.split(".")
            parts = parts[: len(parts) - (node.level - 1)]
            stem = ".".join([*parts, stem] if stem else parts)
        for alias in node.names:
            # `from a.b import c`: the module a.b.c when it is one, else a.b (c is a name in it).
            yield f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in mods else stem

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in names(child):
                    if name == package or name.startswith(package + "."):
                        target = _resolve(name, mods)
                        if target and target != module:
                            found.append(Import(module, child.lineno, target, in_function, True))
                    elif name and not (isinstance(child, ast.ImportFrom) and child.level):
                        found.append(Import(module, child.lineno, name.split(".")[0], in_function, False))
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return found


def room_of(module: str, package: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycles(edges: Sequence[Import]) -> list[list[Import]]:
    """One cycle (as the imports that form it) per strongly connected component of the graph."""
    graph: dict[str, dict[str, Import]] = {}
    for e in edges:
        graph.setdefault(e.module, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)

    cycles = []
    for comp in components:
        members = set(comp)
        start = min(comp)
        # Shortest way back to `start` inside the component (breadth first), as a list of imports.
        paths: dict[str, list[Import]] = {start: []}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w, imp in sorted(graph.get(v, {}).items()):
                    if w == start:
                        cycle = [*paths[v], imp]
                        break
                    if w in members and w not in paths:
                        paths[w] = [*paths[v], imp]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        cycles.append(cycle or [])
    return cycles


def core_packages(pyproject: Path) -> set[str]:
    """Import names of pyproject's [project.dependencies] (environment markers ignored: a dependency
    of some Pythons only is still core), plus torch and numpy."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("dependencies", [])
    dists = {re.split(r"[\s;<>=!~\[(]", d.strip(), maxsplit=1)[0].lower().replace("-", "_") for d in deps}
    names = set(dists) | set(ALWAYS_CORE)
    try:  # import names that differ from distribution names (yaml -> pyyaml), where installed
        for name, owners in importlib.metadata.packages_distributions().items():
            if any(o.lower().replace("-", "_") in dists for o in owners):
                names.add(name)
    except Exception:  # pragma: no cover - metadata unavailable: the plain names above serve
        pass
    return names


def needs_optional(imports: dict[str, list[Import]], core: set[str]) -> dict[str, str | None]:
    """Module -> the optional package it needs at import time (directly or through a kiln module
    it imports at top level), or None."""
    stdlib = set(sys.stdlib_module_names)
    need: dict[str, str | None] = {}
    for m, imps in imports.items():
        direct = [i.target for i in imps if not i.internal and not i.in_function
                  and i.target not in stdlib and i.target not in core and i.target != "__future__"]
        need[m] = direct[0] if direct else None
    changed = True
    while changed:  # through kiln modules imported at top level, to a fixed point
        changed = False
        for m, imps in imports.items():
            if need[m] is None:
                via = next((i.target for i in imps if i.internal and not i.in_function and need.get(i.target)), None)
                if via is not None:
                    need[m] = f"{need[via]} (through {via})"
                    changed = True
    return need


@dataclass
class Graph:
    package: str
    imports: dict[str, list[Import]]
    need: dict[str, str | None]


def build_graph(src: Path, package: str, pyproject: Path) -> Graph:
    mods = module_index(src, package)
    imports = {m: imports_of(m, p, mods, package) for m, p in mods.items()}
    return Graph(package, imports, needs_optional(imports, core_packages(pyproject)))


def cycle_problems(g: Graph) -> list[str]:
    edges = [i for imps in g.imports.values() for i in imps if i.internal]
    return ["import cycle: " + " -> ".join(f"{i.module} (line {i.line}) imports {i.target}" for i in cycle)
            for cycle in find_cycles(edges)]


def order_problems(g: Graph, rooms: Sequence[Sequence[str]]) -> list[str]:
    rank = {room: n for n, group in enumerate(rooms) for room in group}
    problems = []
    for m, imps in sorted(g.imports.items()):
        here = room_of(m, g.package)
        if here not in rank:
            problems.append(f"{m}: room {here!r} is not in the room order; add it to ROOMS")
            continue
        for i in imps:
            there = room_of(i.target, g.package) if i.internal else None
            if there is not None and there in rank and rank[there] > rank[here]:
                problems.append(f"{m} (line {i.line}) imports {i.target}: room {here!r} is below {there!r}")
    return problems


def lazy_problems(g: Graph, lazy_rooms: Sequence[str], allowed: dict[str, str]) -> list[str]:
    problems = []
    for m, imps in sorted(g.imports.items()):
        if room_of(m, g.package) in lazy_rooms or m in allowed:
            continue
        for i in imps:
            if i.internal and i.in_function and not g.need.get(i.target):
                problems.append(f"{m} (line {i.line}) imports {i.target} inside a function, and {i.target} needs "
                                "no optional dependency: import it at the top of the module")
    return problems


@pytest.fixture(scope="module")
def kiln_graph() -> Graph:
    return build_graph(SRC, "kiln", REPO / "pyproject.toml")


def test_no_import_cycle(kiln_graph):
    problems = cycle_problems(kiln_graph)
    assert not problems, "\n".join(problems)


def test_no_import_from_a_lower_room_into_a_higher_one(kiln_graph):
    problems = order_problems(kiln_graph, ROOMS)
    assert not problems, "\n".join(problems)


def test_kiln_imports_sit_at_the_top_unless_an_optional_dependency_needs_them_late(kiln_graph):
    problems = lazy_problems(kiln_graph, LAZY_ROOMS, LAZY_ALLOWED)
    assert not problems, "\n".join(problems)


def test_the_allow_list_names_only_modules_that_still_need_it(kiln_graph):
    problems = lazy_problems(kiln_graph, LAZY_ROOMS, {})
    for m in LAZY_ALLOWED:
        assert any(p.startswith(f"{m} ") for p in problems), f"{m} no longer needs LAZY_ALLOWED: take it off"


def test_the_optional_dependency_rule_sees_kiln_modules_that_need_one(kiln_graph):
    # The Triton kernels and torchao quantization need their packages at import time; the
    # training step does not.
    assert kiln_graph.need["kiln.kernels.triton_int4"] is not None
    assert kiln_graph.need["kiln.train.step"] is None
    assert kiln_graph.need["kiln.errors"] is None


# -- the checker itself, on a small package with each fault planted ------------------------------

SYNTH_ROOMS = (("__init__", "util"), ("low",), ("high",), ("cli",))


def _package(tmp_path: Path, files: dict[str, str]) -> Graph:
    src = tmp_path / "src"
    for rel, text in {"pkg/__init__.py": "", **files}.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "pkg"\ndependencies = ["rich>=13", "tomli-w"]\n')
    return build_graph(src, "pkg", tmp_path / "pyproject.toml")


CLEAN = {
    "pkg/util.py": "import os\n",
    "pkg/low/__init__.py": "",
    "pkg/low/a.py": "from pkg.util import os\nimport torch\nimport rich\nimport tomli_w\n",
    "pkg/low/kernel.py": "import triton_like_optional\n",
    "pkg/low/uses_kernel.py": "from pkg.low import kernel\n",
    "pkg/high/__init__.py": "",
    "pkg/high/b.py": ("from pkg.low.a import torch\n\n"
                      "def run():\n    from pkg.low.uses_kernel import kernel  # needs an optional package\n"),
    "pkg/cli/__init__.py": "",
    "pkg/cli/cmd.py": "def handler():\n    from pkg.high import b\n",
}


def test_checker_passes_a_clean_package(tmp_path):
    g = _package(tmp_path, CLEAN)
    assert g.need["pkg.low.uses_kernel"] == "triton_like_optional (through pkg.low.kernel)"
    assert g.need["pkg.low.a"] is None  # torch, a core dependency and a stdlib module
    assert cycle_problems(g) == [] and order_problems(g, SYNTH_ROOMS) == [] and lazy_problems(g, ("cli",), {}) == []


def test_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    g = _package(tmp_path, {**CLEAN, "pkg/low/c.py": "from pkg.low import d\n",
                            "pkg/low/d.py": "def f():\n    from pkg.low import c\n"})
    assert cycle_problems(g) == ["import cycle: pkg.low.c (line 1) imports pkg.low.d -> "
                                 "pkg.low.d (line 2) imports pkg.low.c"]


def test_checker_finds_an_upward_import(tmp_path):
    g = _package(tmp_path, {**CLEAN, "pkg/low/up.py": "import os\nfrom pkg.high.b import run\n"})
    assert order_problems(g, SYNTH_ROOMS) == ["pkg.low.up (line 2) imports pkg.high.b: room 'low' is below 'high'"]
    g = _package(tmp_path / "two", {**CLEAN, "pkg/new/__init__.py": ""})
    assert order_problems(g, SYNTH_ROOMS) == ["pkg.new: room 'new' is not in the room order; add it to ROOMS"]


def test_checker_finds_a_needless_function_level_import(tmp_path):
    files = {**CLEAN, "pkg/high/lazy.py": "def f():\n    if True:\n        from .b import run\n    return run\n"}
    g = _package(tmp_path, files)
    assert lazy_problems(g, ("cli",), {}) == [
        "pkg.high.lazy (line 3) imports pkg.high.b inside a function, and pkg.high.b needs no optional dependency: "
        "import it at the top of the module"]
    assert lazy_problems(g, ("cli",), {"pkg.high.lazy": "owned elsewhere"}) == []
    # Under `if TYPE_CHECKING:` an import never runs: it is no dependency at all.
    g = _package(tmp_path / "two", {**CLEAN, "pkg/low/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from pkg.high import b\n"})
    assert order_problems(g, SYNTH_ROOMS) == [] and cycle_problems(g) == []
