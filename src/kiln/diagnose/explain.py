"""`kiln explain`: graphs, graph breaks (where, why, how to fix), recompiles, ops per graph.

The target runs once eagerly (a model that fails without compile is not a compile problem), then
compiled with a recording backend on the example inputs (twice: a recompile on an identical call
is the model's own), the user's further input sets and the `--vary` variants, and once with
fullgraph=True for the fullgraph verdict. The default backend is `eager` (dynamo only: breaks and
recompiles are dynamo's), `aot_eager` with --train so the backward graphs are seen as well.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch

from kiln.diagnose import classify
from kiln.diagnose.capture import DynamoCapture, RawBreak, capture_dynamo
from kiln.diagnose.crash import explain_crash
from kiln.diagnose.expectations import compare_breaks
from kiln.diagnose.frames import place_from_exception, source_line
from kiln.diagnose.inputs import describe_inputs, to_device
from kiln.diagnose.runtime import call, eager_check, first_line, quiet_stdout, single_process_group
from kiln.diagnose.target import Target
from kiln.diagnose.vary import DEFAULT_VARY, Variant, make_variants

_COLLECTIVE_OPS = ("_c10d_functional", "c10d", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
COLLECTIVE_IN_GRAPH_HINT = (
    "A collective inside forward synchronises every rank on every call and ties the model to a process group. "
    "torch traced it (functional collective), so it compiles; if it is not essential to the model's maths, move it "
    "out of forward (DDP/FSDP already communicate gradients in hooks)."
)


def _break_dict(raw: RawBreak) -> dict[str, Any]:
    place = raw.place
    code = place.code if place else ""
    category = classify.classify_break(raw.reason, code)
    hint = classify.break_hint(category, raw.reason, code)
    if raw.frame_skipped:
        hint = ("torch gave up on the whole function after this break (a break inside a loop or a `with` block "
                "cannot be resumed), so all of it runs eagerly. ") + hint
    return {
        "category": category,
        "reason": classify.headline(raw.reason),
        "explanation": classify.explanation(raw.reason),
        "file": place.file if place else None,
        "line": place.line if place else None,
        "code": code,
        "function": place.function if place else None,
        "hint": hint,
        "frame_skipped": raw.frame_skipped,
        "count": raw.count,
    }


_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$")


def _shown_guard(rc) -> str:
    """The guard in the user's terms: `L['x']` as `x`, torch's `___stackN` as the value it stands for."""
    guard = classify.user_guard(rc.guard)
    m = _RESUME.match(rc.function)
    where = f" at line {m[2]}" if m else ""
    return re.sub(r"___stack\d+", f"(value carried across the graph break{where})", guard)


def _recompile_dicts(recompiles: list, source: str = "your inputs") -> list[dict[str, Any]]:
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


def _probe_results(probes: list[tuple[Variant, list]], every_call: bool = False
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
        first = _recompile_dicts(calls[0][1], f"--vary {calls[0][0].label}")
        later = [d for variant, rcs in calls[1:] for d in _recompile_dicts(rcs, f"--vary {variant.label}")]
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


def _graph_dicts(capture: DynamoCapture) -> list[dict[str, Any]]:
    out = []
    for g in capture.graphs:
        counts: dict[str, int] = {}
        for op in g.ops:
            counts[op] = counts.get(op, 0) + 1
        out.append({"index": g.index, "kind": g.kind, "op_count": len(g.ops), "ops": counts})
    return out


def _collectives(capture: DynamoCapture) -> list[dict[str, Any]]:
    found, seen = [], set()
    for g in capture.graphs:
        if g.kind != "dynamo":
            continue
        for name, place in g.op_places:
            if "wait_tensor" in name or not any(key in name for key in _COLLECTIVE_OPS):
                continue
            key = (name, place.file if place else None, place.line if place else None)
            if key not in seen:
                seen.add(key)
                found.append({"op": name, "graph": g.index, **(place.as_dict() if place else {}),
                              "hint": COLLECTIVE_IN_GRAPH_HINT})
    return found


def _run(fn, variant: Variant, train: bool, printed: list[str]):
    ctx = torch.autocast(_device_type(variant.inputs), dtype=torch.bfloat16) if variant.autocast else (
        contextlib.nullcontext())
    with quiet_stdout(printed), ctx:
        return call(fn, variant.inputs, train)


def _device_type(inputs: tuple[Any, ...]) -> str:
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


def _fullgraph_blocker(module, inputs, backend: str, train: bool, printed: list[str]) -> dict[str, Any] | None:
    """Compile with fullgraph=True: None if it traces as one graph, else the first blocker."""
    with capture_dynamo():
        try:
            with quiet_stdout(printed):
                call(torch.compile(module, backend=backend, fullgraph=True), inputs, train)
            return None
        except Exception as exc:
            place = place_from_exception(exc)
            brk = _break_dict(RawBreak(str(exc), place, "fullgraph"))
            brk["error_type"] = type(exc).__name__
            return brk


def explain_target(
    target: Target,
    *,
    backend: str | None = None,
    train: bool = False,
    vary: list[tuple[str, list[int] | None]] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The explain report as a dict (the JSON keys of `kiln explain --json`, plus details)."""
    backend = backend or ("aot_eager" if train else "eager")
    module = target.module.to(device)
    base = to_device(target.inputs, device)
    printed: list[str] = []
    notes: list[str] = []
    explicit_vary = vary is not None
    if vary is None:
        vary = [] if len(target.input_sets) > 1 else [(k, None) for k in DEFAULT_VARY]
    variants, vary_notes = make_variants(base, vary)
    if explicit_vary:
        notes += vary_notes
    # The example twice: a recompile on the second, identical call is the model's own (state that
    # forward changes), not something kiln's probes with changed inputs provoked.
    runs = [Variant("example", base), Variant("example again", base)]
    runs += [Variant(f"input set {i}", to_device(s, device)) for i, s in enumerate(target.input_sets[1:], 1)]

    pg_needed = eager_check(module, base, train, printed)
    with single_process_group(pg_needed) as made_pg:
        if made_pg:
            notes.append("the model calls torch.distributed: diagnosed inside a 1-process gloo group")
            eager_check(module, base, train, printed)
        for variant in variants:
            # A variant the model rejects without compile (e.g. float64 inputs, float32 weights) says
            # nothing about compilation: leave it out, and say so.
            try:
                _run(module, variant, train, printed)
                runs.append(variant)
            except Exception as exc:
                notes.append(f"--vary {variant.label} left out: the model rejects it without compile ({first_line(exc)})")
        run_log: list[dict[str, Any]] = []
        main_graphs = main_backward = 0
        counts_after: list[dict[int, int]] = []  # recompiles per code object after each call
        with capture_dynamo() as cap:
            compiled = torch.compile(module, backend=cap.backend(backend, train))
            for i, variant in enumerate(runs):
                entry: dict[str, Any] = {"label": variant.label, "inputs": describe_inputs(variant.inputs), "status": "ok"}
                try:
                    _run(compiled, variant, train, printed)
                except Exception as exc:
                    place = place_from_exception(exc)
                    entry.update(status="error", error=first_line(exc), **(place.as_dict() if place else {}))
                    entry.update(explain_crash(exc, backend) or {})  # a custom op at fault: why and the fix
                if i == 0:
                    main_graphs = sum(1 for g in cap.graphs if g.kind == "dynamo")
                    main_backward = sum(1 for g in cap.graphs if g.kind == "aot_backward")
                counts_after.append(cap.recompile_counts())
                cap.mark()
                run_log.append(entry)
        # Always the real fullgraph=True compile, so the verdict is the one --fullgraph-check gives
        # (the first break is not always the blocker: fullgraph traces `.item()` differently).
        blocker = _fullgraph_blocker(module, base, backend, train, printed)

    breaks = [_break_dict(b) for b in cap.breaks]
    # Which call caused each recompile: the user's own inputs, or a --vary probe of kiln's.
    per_run: list[list] = [[] for _ in runs]
    for rc in cap.recompiles:
        i = next((i for i, c in enumerate(counts_after) if c.get(rc.code_id, 0) > rc.ordinal), len(runs) - 1)
        per_run[i].append(rc)
    is_probe = [any(run is v for v in variants) for run in runs]
    own = [rc for i, rcs in enumerate(per_run) if not is_probe[i] for rc in rcs]
    every_call = bool(per_run[1])
    probe_reports, probe_problems = _probe_results([(runs[i], rcs) for i, rcs in enumerate(per_run) if is_probe[i]],
                                                   every_call)
    recompiles = _recompile_dicts(own) + probe_problems
    dynamo_graphs = [g for g in cap.graphs if g.kind == "dynamo"]
    fullgraph_ok = blocker is None and run_log[0]["status"] == "ok"
    result: dict[str, Any] = {
        "target": target.spec,
        "torch": torch.__version__,
        "backend": backend,
        "train": train,
        "device": str(device),
        "input_source": target.input_source,
        "inputs": describe_inputs(base),
        "graph_count": main_graphs,
        "graph_break_count": len(breaks),
        "breaks": breaks,
        "recompiles": recompiles,
        "probes": probe_reports,
        "clean": not breaks and not recompiles and all(run["status"] == "ok" for run in run_log),
        "ops_per_graph": [len(g.ops) for g in dynamo_graphs[:main_graphs]],
        "graphs": _graph_dicts(cap),
        "graphs_compiled_total": len(dynamo_graphs),
        "collectives": _collectives(cap),
        "fullgraph_ok": fullgraph_ok,
        "fullgraph_checked": True,
        "fullgraph_blocker": blocker,
        "frames_skipped": sum(1 for b in breaks if b["frame_skipped"]),
        "runs": run_log,
        "seed_expectations": compare_breaks(target.expectations, target.source_file, breaks, cap.graphs),
        "printed_chars": sum(len(p) for p in printed),
        "notes": notes,
    }
    if train:
        result["backward_ops_per_graph"] = [len(g.ops) for g in cap.graphs if g.kind == "aot_backward"][:main_backward]
    return result
