"""Recompiles in the user's terms: the failing guard, the line that makes the guarded value, the fix.

A recompile is blamed on the call that caused it: the user's own inputs (a second identical call
that recompiles is the model's own state) or one of kiln's `--vary` probes, whose first change of a
kind is expected (automatic dynamic shapes) and whose later changes show whether that took.
"""

from __future__ import annotations

import re
from typing import Any

from kiln.diagnose import classify
from kiln.diagnose.frames import source_line
from kiln.diagnose.vary import Variant

_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$")


def _shown_guard(rc) -> str:
    """The guard in the user's terms: `L['x']` as `x`, torch's `___stackN` as the value it stands for."""
    guard = classify.user_guard(rc.guard)
    m = _RESUME.match(rc.function)
    where = f" at line {m[2]}" if m else ""
    return re.sub(r"___stack\d+", f"(value carried across the graph break{where})", guard)


def recompile_dicts(recompiles: list, source: str = "your inputs") -> list[dict[str, Any]]:
    out = []
    for rc in recompiles:
        place = rc.place
        code = place.code if place else ""
        resume = _RESUME.match(rc.function)
        if resume and place:
            # A guard in the code after a graph break: the line that broke says what the value is.
            code = source_line(place.file, int(resume[2])) or code
        category, hint = classify.classify_guard(rc.guard, code, rc.varargs)
        out.append({
            "reason": rc.reason,
            "guard": _shown_guard(rc),
            "torch_guard": rc.guard,
            "category": category,
            "file": place.file if place else None,
            "line": place.line if place else None,
            "code": place.code if place else "",
            "function": rc.function,
            "hint": hint,
            "entries_checked": rc.entries_checked,
            "source": source,
        })
    return out


_PROBE_TOPICS = {"batch": "your batch size changes", "scalars": "your Python number arguments change",
                 "dtype": "your input dtypes change", "autocast": "you call it under autocast"}


def _topic(kind: str) -> str:
    return _PROBE_TOPICS.get(kind, f"dimension {kind[3:]} of your inputs changes" if kind.startswith("dim") else kind)


def probe_results(probes: list[tuple[Variant, list]], every_call: bool = False
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(probe reports, problems) from the `--vary` calls kiln made, grouped by kind.

    The first change of a kind is expected to recompile once (per compiled function) and, for
    sizes and numbers, to leave a dynamic graph behind (automatic dynamic shapes); a later change
    that recompiles again means every new value recompiles, a problem the user's run would meet
    if that input changes. Those recompiles are returned as problems; the rest is the probe's.
    With `every_call` (the same inputs already recompiled) the probes cannot tell anything: their
    recompiles are the model's own, not the changed input's, and are not reported as problems."""
    by_kind: dict[str, list[tuple[Variant, list]]] = {}
    for variant, rcs in probes:
        by_kind.setdefault(variant.label.split("=", 1)[0], []).append((variant, rcs))
    reports, problems = [], []
    for kind, calls in by_kind.items():
        first = recompile_dicts(calls[0][1], f"--vary {calls[0][0].label}")
        later = [d for variant, rcs in calls[1:] for d in recompile_dicts(rcs, f"--vary {variant.label}")]
        topic = _topic(kind)
        if every_call and (first or later):
            verdict = f"if {topic}: not judged, the model recompiles on every call even with the same inputs"
            reports.append({"vary": kind, "variants": [v.label for v, _ in calls], "expected": True,
                            "verdict": verdict, "recompiles": first + later})
            continue
        if later:
            verdict = f"if {topic}: every new value recompiles (see the recompiles table)"
            problems += later
        elif not first:
            verdict = f"if {topic}: no recompile"
        elif len(calls) == 1:
            verdict = f"if {topic}: one recompile (expected)"
        else:
            verdict = f"if {topic}: one recompile, then a dynamic graph (expected)"
        reports.append({"vary": kind, "variants": [v.label for v, _ in calls], "expected": not later,
                        "verdict": verdict, "recompiles": first + later})
    return reports, problems
