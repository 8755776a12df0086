"""Recompiles in the user's terms: the failing guard, the line that makes the guarded value, the fix.

A recompile is blamed on the call that caused it: the user's own inputs (a second identical call
that recompiles is the model's own state) or one of kiln's `--vary` probes, whose first change of a
kind is expected (automatic dynamic shapes) and whose later changes show whether that took.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kiln.diagnose import break_kinds as classify
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


SIZE_GUARD = re.compile(r"tensor '(?:L\[')?(\w+)(?:'\])?' size mismatch at index (\d+)")
_USE = (
    (re.compile(r"\bnot in\b|\bin\s+[\w.]+\s*:|\[\s*\w+\s*\]"), "a dict lookup keyed by it: a cache per size",
     "Build the cached tensor once for the largest size (a buffer made in `__init__`) and slice it to the size "
     "here (`table[:n]`), which torch traces with a symbolic n; or compute it with tensor ops each call."),
    (re.compile(r"\brange\("), "a loop count: the loop is unrolled per size",
     "Replace the loop by tensor ops over that dimension (a batched op, `torch.cumsum`, a mask)."),
    (re.compile(r"^\s*(if|elif|while|assert)\b"), "a Python branch on it",
     "Branch on tensor data (`torch.where`) or make the branch independent of the size."),
)


def _subject(guard: str) -> str:
    """What a guard is about, without the value: `L['x'].size()[1]` for a size, else the guard's left side."""
    m = SIZE_GUARD.search(guard)
    if m:
        return f"L['{m[1]}'].size()[{m[2]}]"
    return re.split(r"\s(?:==|!=|is)\s|\. expected", guard, maxsplit=1)[0].strip()


def _pinned_hint(name: str, dim: str, code: str, times: int) -> str:
    why, fix = "a Python computation that needs its exact value", (
        "Keep the size symbolic on that line (tensor ops on the size instead of `int()`, `math.*` or dict keys).")
    for pattern, use, use_fix in _USE:
        if pattern.search(code or ""):
            why, fix = use, use_fix
            break
    return (f"torch made dimension {dim} of `{name}` dynamic after its first change, but this line uses the size as a "
            f"Python value ({why}), which pins it to one size again: {times} recompiles for this dimension so far, and "
            "every new size recompiles (until torch._dynamo.config.recompile_limit, then forward runs eagerly). "
            f"{fix} Or pad inputs to a few fixed sizes (one graph each).")


def observe(dicts: list[dict[str, Any]], raw_all: list, specializations: list) -> None:
    """Fit each recompile's place and hint to what torch did: how often the same value recompiled, and
    whether a dynamic size was pinned again by a user line (that line is then the cause, not the guard's)."""
    times = Counter(_subject(r.guard) for r in raw_all)
    placed = {}
    for d in dicts:  # a later recompile of the same value may come from torch's code only (no user line)
        if d["code"] and not d["code"].startswith("def "):
            placed.setdefault(_subject(d["torch_guard"]), d)
    for d in dicts:
        subject = _subject(d["torch_guard"])
        better = placed.get(subject)
        if better is not None and (d["code"] or "").startswith("def "):
            d.update(file=better["file"], line=better["line"], code=better["code"])
            d["category"], d["hint"] = classify.classify_guard(d["torch_guard"], better["code"], None)
        d["times"] = n = times[subject]
        if d["category"] == classify.SHAPE_CHANGE:
            pinned = [s for s in specializations if s.source == subject]
            m = SIZE_GUARD.search(d["torch_guard"])
            if pinned:
                place = pinned[-1].place
                d.update(category=classify.SIZE_SPECIALIZED, file=place.file, line=place.line, code=place.code,
                         function=place.function, hint=_pinned_hint(m[1], m[2], place.code, n))
            elif n >= 2:
                d["hint"] = (f"Dimension {m[2]} of `{m[1]}` recompiled {n} times: torch's automatic dynamic shapes did "
                             "not take (compiled with dynamic=False, or torch.compiler settings that disable it). "
                             "Pad or bucket inputs to a few fixed sizes, or see below whether mark_dynamic works.")
        elif d["category"] in (classify.PYTHON_SCALAR, classify.MODULE_ATTRIBUTE) and n >= 2:
            d["hint"] = d["hint"].replace(
                "On its first change torch recompiles and treats the number as dynamic (automatic dynamic for ints "
                "and floats), so one recompile is expected.",
                f"It recompiled {n} times: torch did not make it dynamic, every new value is a new graph.")


BOUNDED = (classify.STRING_VALUE, classify.BOOL_FLAG, classify.ARG_COUNT, classify.CONTAINER_KEYS,
           classify.DTYPE_CHANGE, classify.REQUIRES_GRAD, classify.GLOBAL_STATE, classify.SHAPE_CHANGE)
"""Kinds with a few values at most (one graph each): a higher recompile limit keeps them all compiled."""


def mark_limit_hits(dicts: list[dict[str, Any]], hits: list[dict[str, Any]]) -> None:
    """Say on each recompile of a function that hit torch's recompile limit that it now runs eagerly."""
    for d in dicts:
        hit = next((h for h in hits if h["function"] == d["function"]), None)
        if hit is None:
            continue
        d["limit_hit"] = hit
        d["hint"] += (f" torch hit torch._dynamo.config.{hit['limit']} ({hit['value']}) on `{hit['function']}`: from "
                      f"then on, a call that matches none of its graphs runs `{hit['function']}` eagerly.")
        if d["category"] not in BOUNDED:
            d["hint"] += " Raising the limit only delays that: every new value compiles again."
