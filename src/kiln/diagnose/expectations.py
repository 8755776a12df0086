"""Compare what an article (or an older torch) said would happen with what the installed torch did.

A factory's module may declare, next to the model:

    KILN_SEED_EXPECTATIONS = [
        {"construct": "assert on a tensor", "kind": "assert", "match": "assert torch.all(x >= 0)",
         "expected_break": True, "source": "seed 001, torch 2.0"},
        {"construct": "all_reduce in forward", "kind": "collective", "match": "all_reduce(",
         "expected_break": False, "expected_failure": "inductor"},
    ]

`match` is a substring of the source line; a compound statement (`for ...:`) covers its body too.
`expected_failure` is the first `kiln doctor` stage the source saw fail (null: none).
"""

from __future__ import annotations

import ast
import linecache
from typing import Any

import torch

from kiln.diagnose.compile_record import GraphInfo

# Why the installed torch traces a construct that older torch broke on, per construct kind.
TRACED_WHY = {
    "assert": "dynamo rewrites `assert <tensor>` into a `torch._assert_async` call inside the graph (a runtime "
    "check, no break; torch/_dynamo/symbolic_convert.py, generic_jump)",
    "numpy": "dynamo traces NumPy calls through torch._numpy (PyTorch 2.1+, 'torch.compile and NumPy' in the "
    "torch.compiler docs) and unrolls a loop over a constant-length array",
    "item": "torch._dynamo.config.capture_scalar_outputs is on, so `.item()` is traced as an unbacked symbol",
    "print": "the function is in torch._dynamo.config.reorderable_logging_functions, so it runs after the graph",
    "collective": "with a process group, in-place c10d collectives are traced as functional collectives "
    "(_c10d_functional.*) that the backends can compile",
}


def _statement_lines(file: str) -> set[int]:
    """Lines where a statement starts: a `match` inside a string (this table itself) does not count."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except SyntaxError:
        return set()
    return {node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt)}


def _find_lines(file: str, match: str) -> tuple[int, int] | None:
    """First statement line containing `match`, and the last line of its block when it opens one."""
    lines = linecache.getlines(file)
    starts = _statement_lines(file)
    for i, text in enumerate(lines):
        if match in text and i + 1 in starts:
            start = i + 1
            if not text.rstrip().endswith(":"):
                return start, start
            indent = len(text) - len(text.lstrip())
            end = start
            for j in range(i + 1, len(lines)):
                body = lines[j]
                if body.strip() and len(body) - len(body.lstrip()) <= indent:
                    break
                if body.strip():
                    end = j + 1
            return start, end
    return None


def _traced_ops(graphs: list[GraphInfo], file: str, lines: tuple[int, int]) -> list[str]:
    ops = []
    for g in graphs:
        if g.kind != "dynamo":
            continue
        for name, place in g.op_places:
            if place and place.file == file and lines[0] <= place.line <= lines[1] and name not in ops:
                ops.append(name)
    return ops


def compare_breaks(
    expectations: list[dict[str, Any]], source_file: str | None, breaks: list[dict[str, Any]], graphs: list[GraphInfo]
) -> list[dict[str, Any]]:
    """One row per expectation: expected vs observed break, with a note saying why they differ."""
    rows = []
    for exp in expectations:
        if "expected_break" not in exp:
            continue
        row: dict[str, Any] = {
            "construct": exp.get("construct", exp.get("match", "?")),
            "expected_break": bool(exp["expected_break"]),
            "observed_break": None,
            "line": None,
            "category": None,
            "traced_as": [],
            "source": exp.get("source", ""),
        }
        span = _find_lines(source_file, exp.get("match", "")) if source_file and exp.get("match") else None
        if span is None:
            row["note"] = f"construct not found in {source_file} (match {exp.get('match')!r})"
            rows.append(row)
            continue
        row["line"] = span[0]
        hits = [b for b in breaks if b.get("file") == source_file and span[0] <= (b.get("line") or 0) <= span[1]]
        row["observed_break"] = bool(hits)
        row["category"] = hits[0]["category"] if hits else None
        row["traced_as"] = _traced_ops(graphs, source_file, span)
        row["note"] = _break_note(exp, row)
        rows.append(row)
    return rows


def _break_note(exp: dict[str, Any], row: dict[str, Any]) -> str:
    version = torch.__version__.split("+")[0]
    if row["observed_break"] and row["expected_break"]:
        return f"breaks on torch {version} as expected ({row['category']})"
    if row["observed_break"]:
        return f"breaks on torch {version} although the source expected none ({row['category']})"
    if not row["expected_break"]:
        return f"no break on torch {version}, as expected"
    why = TRACED_WHY.get(exp.get("kind", ""), "torch now traces it")
    ops = ", ".join(row["traced_as"][:6]) or "no ops (constant-folded at trace time)"
    return f"no break on torch {version}: {why}; traced as {ops}"


def compare_failure(
    expectations: list[dict[str, Any]], first_failure: dict[str, Any] | None, stages_run: list[str]
) -> list[dict[str, Any]]:
    """For `kiln doctor`: the stage the source saw fail vs the first failing stage now."""
    rows = []
    version = torch.__version__.split("+")[0]
    observed = first_failure["backend"] if first_failure else None
    for exp in expectations:
        if "expected_failure" not in exp:
            continue
        expected = exp["expected_failure"]
        if expected and expected not in stages_run and observed is None:
            note = f"the source saw {expected} fail; that stage was not run (stages: {', '.join(stages_run)})"
        elif expected == observed:
            note = f"fails at {observed} on torch {version}, as the source says" if observed else "no failure, as expected"
        elif observed is None:
            note = f"the source saw {expected} fail; torch {version} passes every stage (fixed since)"
        else:
            note = f"the source saw {expected} fail; on torch {version} the first failure is {observed}"
        rows.append({"construct": exp.get("construct", "?"), "expected_failure": expected,
                     "observed_failure": observed, "source": exp.get("source", ""), "note": note})
    return rows
