"""`kiln explain`: graphs, graph breaks (where, why, how to fix), recompiles, ops per graph.

The target runs as the user runs it (a training-mode module forward and backward, an eval-mode one
forward without autograd; `--train`/`--no-train` decide instead): once eagerly (a model that fails
without compile is not a compile problem), then compiled with a recording backend on the example
inputs (twice: a recompile on an identical call is the model's own), the user's further input sets
and the `--vary` variants, and once with fullgraph=True. The backend is `eager` (dynamo only: breaks
and recompiles are dynamo's), `aot_eager` when backward runs, so the backward graphs are seen too.
Each mechanical fix is then tried by re-running the calls with it (diagnose/verify.py).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import torch

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.call_target import (
    FORWARD_WITH_GRAD,
    EagerFailure,
    NothingToBackprop,
    RunMode,
    call,
    eager_check,
    first_line,
    quiet_stdout,
    run_mode,
    single_process_group,
)
from kiln.diagnose.compile_record import DynamoCapture, RawBreak, capture_dynamo
from kiln.diagnose.crash import explain_crash
from kiln.diagnose.expectations import compare_breaks
from kiln.diagnose.frames import function_span, place_from_exception
from kiln.diagnose.inputs import describe_inputs, to_device
from kiln.diagnose.recompiles import mark_limit_hits, observe, probe_results, recompile_dicts
from kiln.diagnose.target import Target
from kiln.diagnose.vary import DEFAULT_VARY, Variant, make_variants
from kiln.diagnose.verify import verify_fixes

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
        name = f"`{place.function}`" if place and place.function else "the function"
        hint = (f"torch gave up on {name} at this break (it cannot resume after it: inside a loop, a `with` block, "
                f"or a call it cannot trace), so all of {name} runs eagerly on every call: none of its ops are "
                "compiled or fused, only functions it calls are compiled on their own. ") + hint
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


def eager_frames(breaks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The functions torch gave up on after a break (frame skipped): each runs eagerly in full on every
    call, which is the cost of that break beyond the break itself."""
    out = []
    for b in breaks:
        if not (b["frame_skipped"] and b["file"]):
            continue
        first, last = function_span(b["file"], b["line"]) or (b["line"], b["line"])
        name = b["function"] or "?"
        out.append({"function": name, "file": b["file"], "first_line": first, "last_line": last,
                    "break_line": b["line"],
                    "cost": f"all of `{name}` (lines {first}-{last}) runs eagerly on every call: its ops are not "
                            "compiled or fused; functions it calls are compiled on their own"})
    return out


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


def _run(fn, variant: Variant, mode: RunMode, printed: list[str]):
    ctx = torch.autocast(_device_type(variant.inputs), dtype=torch.bfloat16) if variant.autocast else (
        contextlib.nullcontext())
    with quiet_stdout(printed), ctx:
        return call(fn, variant.inputs, mode.train, grad=mode.grad)


def _device_type(inputs: tuple[Any, ...]) -> str:
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


def _fullgraph_blocker(module, inputs, backend: str, mode: RunMode, printed: list[str]) -> dict[str, Any] | None:
    """Compile with fullgraph=True: None if it traces as one graph, else the first blocker."""
    with capture_dynamo():
        try:
            with quiet_stdout(printed):
                call(torch.compile(module, backend=backend, fullgraph=True), inputs, mode.train, grad=mode.grad)
            return None
        except Exception as exc:
            place = place_from_exception(exc)
            brk = _break_dict(RawBreak(str(exc), place, "fullgraph"))
            brk["error_type"] = type(exc).__name__
            return brk


@dataclass
class CompiledRuns:
    """What one compile of the target over a list of calls showed."""

    cap: DynamoCapture
    log: list[dict[str, Any]]
    main_graphs: int
    main_backward: int
    counts_after: list[dict[int, int]]
    """Recompiles per code object after each call."""


def compile_runs(module, runs: list[Variant], backend: str, mode: RunMode, printed: list[str]) -> CompiledRuns:
    """Compile the module once with the recording backend and make every call of `runs` in order."""
    log: list[dict[str, Any]] = []
    main_graphs = main_backward = 0
    counts_after: list[dict[int, int]] = []
    with capture_dynamo() as cap:
        compiled = torch.compile(module, backend=cap.backend(backend, mode.train))
        for i, variant in enumerate(runs):
            entry: dict[str, Any] = {"label": variant.label, "inputs": describe_inputs(variant.inputs), "status": "ok"}
            try:
                _run(compiled, variant, mode, printed)
            except Exception as exc:
                place = place_from_exception(exc)
                entry.update(status="error", error=first_line(exc), **(place.as_dict() if place else {}))
                entry.update(explain_crash(exc, backend) or {})  # a custom op at fault: why and the fix
            if i == 0:
                main_graphs = sum(1 for g in cap.graphs if g.kind == "dynamo")
                main_backward = sum(1 for g in cap.graphs if g.kind == "aot_backward")
            counts_after.append(cap.recompile_counts())
            cap.mark()
            log.append(entry)
    return CompiledRuns(cap, log, main_graphs, main_backward, counts_after)


def _checked_mode(module, base, train: bool | None, printed: list[str], notes: list[str]) -> tuple[RunMode, bool]:
    """(how to call the target, whether it needs a process group), from one eager call. A training-mode
    module whose backward cannot run (outputs without grad, an op without an autograd formula) is
    explained forward-only with autograd on, and the report says why."""
    mode = run_mode(module, train)
    try:
        return mode, eager_check(module, base, mode.train, printed, grad=mode.grad)
    except NothingToBackprop:
        if train is not None:
            raise EagerFailure("--train: the model's outputs do not require grad (nothing to backpropagate)") from None
        return FORWARD_WITH_GRAD, eager_check(module, base, False, printed, grad=True)
    except EagerFailure as exc:
        if train is not None or not mode.train:
            raise
        pg_needed = eager_check(module, base, False, printed, grad=True)  # forward alone fails too: raise that
        notes.append(f"backward fails without compile ({first_line(exc.__cause__ or exc)}): explained forward only, "
                     "with autograd on; fix backward (or pass --train) to see the training graphs")
        return RunMode(False, True, "the module is in training mode, but its backward fails without compile: "
                                    "forward with autograd on"), pg_needed


def _fullgraph_verdict(blocker: dict[str, Any] | None, breaks: list[dict[str, Any]], run_ok: bool):
    """(one graph?, the blocker to show): one graph only when fullgraph=True compiles *and* the model
    as run has no break; a break that fullgraph=True traces anyway (it captures `.item()`, for one)
    is still the first blocker of the graph the user gets."""
    if blocker is None and breaks:
        blocker = {**breaks[0], "fullgraph_compiles": True, "note": (
            "torch.compile(fullgraph=True) traces this line differently and compiles, but the compile you run "
            "(without fullgraph) breaks here; fix the break and both agree")}
    return blocker is None and run_ok, blocker


def explain_target(
    target: Target,
    *,
    backend: str | None = None,
    train: bool | None = None,
    vary: list[tuple[str, list[int] | None]] | None = None,
    device: str = "cpu",
    verify: bool = True,
) -> dict[str, Any]:
    """The explain report as a dict (the JSON keys of `kiln explain --json`, plus details).

    `train` None runs the module as the user does (training mode: forward and backward; eval mode:
    forward without autograd); `verify` re-runs the check with each mechanical fix applied."""
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

    mode, pg_needed = _checked_mode(module, base, train, printed, notes)
    backend = backend or ("aot_eager" if mode.train else "eager")
    with single_process_group(pg_needed) as made_pg:
        if made_pg:
            notes.append("the model calls torch.distributed: diagnosed inside a 1-process gloo group")
            eager_check(module, base, mode.train, printed, grad=mode.grad)
        for variant in variants:
            # A variant the model rejects without compile (e.g. float64 inputs, float32 weights) says
            # nothing about compilation: leave it out, and say so.
            try:
                _run(module, variant, mode, printed)
                runs.append(variant)
            except Exception as exc:
                notes.append(f"--vary {variant.label} left out: the model rejects it without compile ({first_line(exc)})")
        done = compile_runs(module, runs, backend, mode, printed)
        cap = done.cap
        # Always the real fullgraph=True compile, so the verdict is the one --fullgraph-check gives
        # (the first break is not always the blocker: fullgraph traces `.item()` differently).
        blocker = _fullgraph_blocker(module, base, backend, mode, printed)

        breaks = [_break_dict(b) for b in cap.breaks]
        # Which call caused each recompile: the user's own inputs, or a --vary probe of kiln's.
        per_run: list[list] = [[] for _ in runs]
        for rc in cap.recompiles:
            i = next((i for i, c in enumerate(done.counts_after) if c.get(rc.code_id, 0) > rc.ordinal), len(runs) - 1)
            per_run[i].append(rc)
        is_probe = [any(run is v for v in variants) for run in runs]
        own = [rc for i, rcs in enumerate(per_run) if not is_probe[i] for rc in rcs]
        every_call = bool(per_run[1])
        probe_reports, probe_problems = probe_results(
            [(runs[i], rcs) for i, rcs in enumerate(per_run) if is_probe[i]], every_call)
        recompiles = recompile_dicts(own) + probe_problems
        shown = recompiles + [d for p in probe_reports for d in p["recompiles"]]
        observe(shown, cap.recompiles, cap.specializations)
        mark_limit_hits(shown, cap.limit_hits)
        if verify:
            rerun = functools.partial(compile_runs, module, backend=backend, mode=mode, printed=printed)
            verify_fixes(module, breaks, [b.reason for b in cap.breaks], recompiles, runs, rerun)
    dynamo_graphs = [g for g in cap.graphs if g.kind == "dynamo"]
    fullgraph_ok, blocker = _fullgraph_verdict(blocker, breaks, done.log[0]["status"] == "ok")
    result: dict[str, Any] = {
        "target": target.spec,
        "torch": torch.__version__,
        "backend": backend,
        "train": mode.train,
        "autograd": mode.grad,
        "mode": mode.why,
        "device": str(device),
        "input_source": target.input_source,
        "inputs": describe_inputs(base),
        "graph_count": done.main_graphs,
        "graph_break_count": len(breaks),
        "breaks": breaks,
        "recompiles": recompiles,
        "probes": probe_reports,
        "clean": not breaks and not recompiles and all(run["status"] == "ok" for run in done.log),
        "ops_per_graph": [len(g.ops) for g in dynamo_graphs[:done.main_graphs]],
        "graphs": _graph_dicts(cap),
        "graphs_compiled_total": len(dynamo_graphs),
        "collectives": _collectives(cap),
        "fullgraph_ok": fullgraph_ok,
        "fullgraph_checked": True,
        "fullgraph_blocker": blocker,
        "frames_skipped": sum(1 for b in breaks if b["frame_skipped"]),
        "eager_frames": eager_frames(breaks),
        "recompile_limit_hits": cap.limit_hits,
        "runs": done.log,
        "seed_expectations": compare_breaks(target.expectations, target.source_file, breaks, cap.graphs),
        "printed_chars": sum(len(p) for p in printed),
        "notes": notes,
    }
    if mode.train:
        result["backward_ops_per_graph"] = [
            len(g.ops) for g in cap.graphs if g.kind == "aot_backward"][:done.main_backward]
    return result
