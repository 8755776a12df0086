"""`kiln doctor`: run the target under each compile stage and name the first that crashes or drifts.

Every stage starts from a fresh copy of the same weights in eval mode (dropout and batch-norm
statistics would otherwise make runs differ for reasons that are not the compiler's) and from the
same RNG seed. Results — outputs, and with --train the gradients of the summed outputs — are
judged against plain eager and a float64 CPU reference by the harness rule (diagnose/compiled_accuracy.py).
When Inductor is the first stage at fault, torch's CompilerBisector narrows it down; a standalone
repro script is written for the first failure.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import torch

from kiln.diagnose.backends import CROSSREF, Stage, build_ladder
from kiln.diagnose.bisect import bisect_inductor
from kiln.diagnose.call_target import call, eager_check, first_line, quiet_stdout, quiet_torch, single_process_group
from kiln.diagnose.compile_record import capture_dynamo
from kiln.diagnose.compiled_accuracy import FORWARD_TOL, TRAIN_TOL, compare, fp64_reference, named_results
from kiln.diagnose.crash import CROSSREF_MEANING, FAKE_MISMATCH, explain_crash
from kiln.diagnose.expectations import compare_failure
from kiln.diagnose.frames import Place, place_from_exception
from kiln.diagnose.inputs import describe_inputs, to_device
from kiln.diagnose.repro import write_repro
from kiln.diagnose.target import Target


def _finite(x: float | None) -> float | None:
    """JSON has no NaN/inf: report them as null (the status already says accuracy_fail)."""
    return x if x is None or math.isfinite(x) else None


def _run_stage(stage: Stage, base: torch.nn.Module, inputs, train: bool, printed: list[str]):
    """(named results) of one compiled run; raises what the compile or the run raised."""
    import torch._inductor.config as inductor_config

    torch.compiler.reset()
    model = copy.deepcopy(base)
    torch.manual_seed(0)
    kwargs: dict[str, Any] = {"backend": stage.backend}
    if stage.mode:
        kwargs["mode"] = stage.mode
    # The harness runs accuracy checks with fallback_random so inductor's RNG matches eager's.
    with inductor_config.patch(fallback_random=True), quiet_stdout(printed):
        out, grads = call(torch.compile(model, **kwargs), inputs, train, model)
    return named_results(out, grads)


def _check_stage(stage, base, inputs, train, eager, fp64, tol, printed) -> dict[str, Any]:
    entry: dict[str, Any] = {"backend": stage.label, "mode": stage.mode, "status": "ok", "max_abs_err": None,
                             "max_rel_err": None, "error": None, "layer": stage.layer}
    start = time.perf_counter()
    try:
        results = _run_stage(stage, base, inputs, train, printed)
    except Exception as exc:
        place = place_from_exception(exc)
        entry.update(status="crash", error=first_line(exc), error_type=type(exc).__name__)
        cause = explain_crash(exc, stage.label)
        if cause:
            entry.update(cause)
            # Inductor fails inside its generated code (the traceback shows only `def forward`): the
            # user's line is where the op is called. An op that does not trace keeps dynamo's place.
            place = op_call_site(base, inputs, cause["op"], printed) or place
        if place:
            entry["where"] = place.as_dict()
        entry["seconds"] = round(time.perf_counter() - start, 3)
        return entry
    entry["seconds"] = round(time.perf_counter() - start, 3)
    verdict = compare(eager, results, fp64, tol)
    entry.update(
        status="ok" if verdict["ok"] else "accuracy_fail",
        max_abs_err=_finite(verdict["max_abs_err"]),
        max_rel_err=_finite(verdict["max_rel_err"]),
        rmse_vs_fp64=_finite(verdict["rmse_vs_fp64"]),
        eager_rmse_vs_fp64=_finite(verdict["eager_rmse_vs_fp64"]),
    )
    if not verdict["ok"]:
        entry["failing"] = verdict["failing"]
        entry["error"] = f"drift beyond the harness rule (tol {tol:g}) in {', '.join(verdict['failing'][:3])}"
    return entry


def op_call_site(base: torch.nn.Module, inputs, op: str, printed: list[str]) -> Place | None:
    """The user's line that calls `op` (namespace::name), from the graph dynamo captures."""
    wanted = op.replace("::", ".")
    with capture_dynamo() as cap:
        try:
            with quiet_stdout(printed), torch.no_grad():
                torch.compile(copy.deepcopy(base), backend=cap.backend("eager"))(*inputs)
        except Exception:  # the op may not trace at all; then there is no graph to read
            return None
    for graph in cap.graphs:
        for name, place in graph.op_places:
            if place is not None and (name == wanted or name.startswith(wanted + ".")):
                return place
    return None


def run_doctor(
    target: Target,
    *,
    stages: list[str] | None = None,
    mode: str | None = None,
    backends: list[str] | None = None,
    train: bool = False,
    tol: float | None = None,
    device: str = "cpu",
    bisect: bool = True,
    out_dir: str | Path | None = None,
    repro: bool = True,
) -> dict[str, Any]:
    """The doctor report as a dict: stages, first_failure, repro (the JSON keys of `kiln doctor --json`) and details."""
    ladder = build_ladder(stages, mode, backends)  # ConfigError before any work
    tol = tol if tol is not None else (TRAIN_TOL if train else FORWARD_TOL)
    base = copy.deepcopy(target.module).to(device).eval()
    inputs = to_device(target.inputs, device)
    printed: list[str] = []
    notes = ["stages run in eval mode (no dropout, batch-norm running statistics) from the same weights and seed"]

    pg_needed = eager_check(base, inputs, train, printed)
    with single_process_group(pg_needed) as made_pg, quiet_torch():
        if made_pg:
            notes.append("the model calls torch.distributed: run inside a 1-process gloo group")
            eager_check(base, inputs, train, printed)

        def eager_run():
            model = copy.deepcopy(base)
            torch.manual_seed(0)
            with quiet_stdout(printed):
                out, grads = call(model, inputs, train, model)
            return named_results(out, grads)

        eager = eager_run()
        again = compare(eager, eager_run(), None, 0.0)
        if not again["ok"]:
            notes.append(f"eager itself is not deterministic (max diff {again['max_abs_err']:.3g} between two runs); "
                         "small differences in later stages may be noise")
        with quiet_stdout(printed):
            fp64_pair = fp64_reference(base, inputs, train)
        fp64 = named_results(*fp64_pair) if fp64_pair else None
        if fp64 is None:
            notes.append("the model does not run in float64: compared with eager only")

        results = [_check_stage(s, base, inputs, train, eager, fp64, tol, printed) for s in ladder]
        first_index = next((i for i, r in enumerate(results) if r["status"] != "ok"), None)
        first = results[first_index] if first_index is not None else None
        if first is not None and first.get("kind") == FAKE_MISMATCH and not first["backend"].endswith("_crossref"):
            # Confirm with torch's fake-vs-real cross-check, which fails at the op instead of downstream.
            check = _check_stage(Stage(CROSSREF, CROSSREF), base, inputs, train, eager, fp64, tol, printed)
            first["crossref"] = {"backend": CROSSREF, "status": check["status"], "error": check["error"],
                                 "meaning": CROSSREF_MEANING}
        bisect_result = None
        if first is not None and first.get("op") and bisect:
            notes.append(f"no bisection: the failure is explained by custom op {first['op']} (see why/fix)")
        elif first is not None and ladder[first_index].is_inductor and bisect:
            stage = ladder[first_index]

            def still_good() -> bool:
                try:
                    got = _run_stage(Stage("inductor", "inductor", stage.mode), base, inputs, train, printed)
                except Exception:
                    return False
                return compare(eager, got, fp64, tol)["ok"]

            bisect_result = bisect_inductor(still_good)
            torch.compiler.reset()

    repro_path = None
    if first is not None and repro:
        stage = ladder[first_index]
        path = write_repro(target.spec, target.kwargs, first, stage.backend, inputs, train, tol,
                           out_dir if out_dir is not None else Path.cwd(), needs_process_group=made_pg)
        repro_path = str(path) if path else None
        if path is None:
            notes.append(f"no repro script: backend {stage.label!r} is a Python object without an import path")
    return {
        "target": target.spec,
        "torch": torch.__version__,
        "device": str(device),
        "train": train,
        "tol": tol,
        "inputs": describe_inputs(inputs),
        "input_source": target.input_source,
        "reference": "fp64+eager" if fp64 is not None else "eager",
        "stages": results,
        "first_failure": first,
        "bisect": bisect_result,
        "repro": repro_path,
        "seed_expectations": compare_failure(target.expectations, first, [s.label for s in ladder]),
        "printed_chars": sum(len(p) for p in printed),
        "notes": notes,
    }
