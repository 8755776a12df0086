"""Hints kiln has tried: for a fix it can apply mechanically, re-run the same calls with the fix and
keep the hint only if the problem is gone.

Mechanical fixes are `torch._dynamo.config` flags (the ones kiln knows per break kind, and any flag
torch's own hint names, e.g. `allow_rnn`, `trace_autograd_ops`), a higher `recompile_limit` where
torch hit it on a value with a few settings, and `torch._dynamo.mark_dynamic` on the input
dimension a shape guard names. (doctor's bisected inductor config is re-run in bisect.py.) Each break or recompile gets a `tried` entry (the fix,
`verified` true/false, what happened); the hint says "verified" or leaves the fix out. The rest of
a hint is advice: code changes kiln cannot make for the user.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.call_target import first_line
from kiln.diagnose.recompiles import BOUNDED, SIZE_GUARD
from kiln.diagnose.vary import Variant


@dataclass(frozen=True)
class Fix:
    text: str
    """What the user writes, e.g. `torch._dynamo.config.capture_scalar_outputs = True`."""
    config: dict[str, Any] = field(default_factory=dict)
    """A torch._dynamo.config patch (empty for mark_dynamic)."""
    mark: tuple[int, int] | None = None
    """(positional argument, dimension) to mark dynamic on every call."""


def _flag(name: str, value: bool = True) -> Fix:
    return Fix(f"torch._dynamo.config.{name} = {value}", {name: value})


BREAK_FIXES = {
    classify.SCALAR_OUTPUT: _flag("capture_scalar_outputs"),
    classify.DYNAMIC_SHAPE: _flag("capture_dynamic_output_shape_ops"),
    classify.RECURRENT: _flag("allow_rnn"),
    classify.AUTOGRAD_IN_FORWARD: _flag("trace_autograd_ops"),
}
_TORCH_FLAG = re.compile(r"torch\._dynamo\.config\.(\w+)`?\s*(?:=|to)\s*`?(True|False)")

Rerun = Callable[[list[Variant]], Any]
"""Compile the target afresh and make these calls (explain.compile_runs, bound to the target)."""


def break_fix(brk: dict[str, Any], reason: str) -> Fix | None:
    """The mechanical fix for a break: kiln's per kind, else a dynamo flag torch's own hint names."""
    if brk["category"] in BREAK_FIXES:
        return BREAK_FIXES[brk["category"]]
    m = _TORCH_FLAG.search(reason or "")
    if m and hasattr(torch._dynamo.config, m[1]):
        return _flag(m[1], m[2] == "True")
    return None


def _arg_index(forward: Callable, name: str) -> int | None:
    try:
        params = [p for p in inspect.signature(forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    return next((i for i, p in enumerate(params) if p.name == name), None)


def shape_fix(guard: str, forward: Callable) -> Fix | None:
    """`mark_dynamic(arg, dim)` for a guard `tensor 'x' size mismatch at index d` on an argument of forward."""
    m = SIZE_GUARD.search(guard or "")
    index = _arg_index(forward, m[1]) if m else None
    if index is None:
        return None
    return Fix(f"torch._dynamo.mark_dynamic({m[1]}, {m[2]})", mark=(index, int(m[2])))


def recompile_fix(rc: dict[str, Any], forward: Callable, calls: int) -> Fix | None:
    """A higher recompile limit where torch hit it on a value with few settings; mark_dynamic for a size
    guard; letting ints on modules be dynamic for a module attribute."""
    if rc.get("limit_hit") and rc["category"] in BOUNDED:
        limit = max(calls + 1, 2 * int(rc["limit_hit"]["value"]))
        return Fix(f"torch._dynamo.config.{rc['limit_hit']['limit']} = {limit}", {rc["limit_hit"]["limit"]: limit})
    if rc["category"] in (classify.SHAPE_CHANGE, classify.SIZE_SPECIALIZED):
        return shape_fix(rc["torch_guard"], forward)
    if rc["category"] == classify.MODULE_ATTRIBUTE and re.search(r"(==|!=) -?\d+$", rc["torch_guard"]):
        return _flag("allow_unspec_int_on_nn_module")
    return None


def _marked(runs: list[Variant], mark: tuple[int, int]) -> list[Variant]:
    out = []
    for run in runs:
        inputs = list(run.inputs)
        arg, dim = mark
        if arg < len(inputs) and isinstance(inputs[arg], torch.Tensor) and inputs[arg].dim() > dim:
            inputs[arg] = inputs[arg].clone()
            torch._dynamo.mark_dynamic(inputs[arg], dim)
        out.append(Variant(run.label, tuple(inputs), run.autocast))
    return out


@contextlib.contextmanager
def _quiet_guard_errors() -> Iterator[None]:
    """torch logs the guard it could not build (a mark_dynamic the code contradicts) as an ERROR before it
    raises; that failure is the answer kiln is after, so its log is not shown."""
    log = logging.getLogger("torch._guards")
    saved, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = saved


def _attempt(fix: Fix, runs: list[Variant], rerun: Rerun):
    """(the re-run, None) or (None, why it failed)."""
    try:
        calls = _marked(runs, fix.mark) if fix.mark else runs
        with torch._dynamo.config.patch(**fix.config), _quiet_guard_errors():
            done = rerun(calls)
    except Exception as exc:  # e.g. mark_dynamic on a dimension the code specialises
        return None, first_line(exc)
    failed = next((r for r in done.log if r["status"] != "ok"), None)
    return (None, failed["error"]) if failed else (done, None)


def _break_gone(done, brk: dict[str, Any]) -> bool:
    return not any(b.place and (b.place.file, b.place.line) == (brk["file"], brk["line"]) for b in done.cap.breaks)


def _recompile_gone(done, rc: dict[str, Any]) -> bool:
    """No recompile on the same tensor dimension (or the same guarded value) is left."""
    m = SIZE_GUARD.search(rc["torch_guard"])
    if m is None:
        left = rc["torch_guard"].split(" ")[0]
        return not any(r.guard.split(" ")[0] == left for r in done.cap.recompiles)
    return not any((g := SIZE_GUARD.search(r.guard)) and g.groups() == m.groups() for r in done.cap.recompiles)


def _record(item: dict[str, Any], fix: Fix, done, error: str | None, gone: bool, what: str) -> None:
    verified = done is not None and gone
    if verified:
        result = f"verified: kiln re-ran the same calls with `{fix.text}` and the {what} is gone"
        item["hint"] += f" Verified: with `{fix.text}` the {what} is gone (kiln re-ran the same calls)."
    elif error:
        result = f"not offered: with `{fix.text}` the model fails ({error})"
        item["hint"] += f" (`{fix.text}` is no fix here: kiln tried it and the model then fails.)"
    else:
        result = f"not offered: kiln re-ran with `{fix.text}` and the {what} stays"
        item["hint"] += f" (`{fix.text}` is no fix here: kiln tried it and the {what} stays.)"
    item["tried"] = {"fix": fix.text, "verified": verified, "result": result}


def verify_fixes(module: torch.nn.Module, breaks: list[dict[str, Any]], reasons: list[str],
                 recompiles: list[dict[str, Any]], runs: list[Variant], rerun: Rerun) -> None:
    """Try each mechanical fix once on the calls that showed the problem; mark each hint verified or not."""
    cache: dict[str, tuple[Any, str | None]] = {}

    def attempt(fix: Fix, calls: list[Variant]):
        if fix.text not in cache:
            cache[fix.text] = _attempt(fix, calls, rerun)
        return cache[fix.text]

    for brk, reason in zip(breaks, reasons):
        fix = break_fix(brk, reason)
        if fix is not None:
            done, error = attempt(fix, runs[:2])
            _record(brk, fix, done, error, done is not None and _break_gone(done, brk), "break")
    for rc in recompiles:
        fix = recompile_fix(rc, module.forward, len(runs))
        if fix is None:
            continue
        done, error = attempt(fix, runs)
        if rc.get("limit_hit") and rc["limit_hit"]["limit"] in fix.config:
            _record(rc, fix, done, error, done is not None and not done.cap.limit_hits, "eager fallback at the limit")
        else:
            _record(rc, fix, done, error, done is not None and _recompile_gone(done, rc), "recompile")
