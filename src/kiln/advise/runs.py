"""The checks of `kiln advise` that measure training steps: a data loader that starves the device and
launch-bound steps (from a short `kiln profile` run of the config), and the gains of bf16 and of
whole-step CUDA-graph capture (rows of `kiln bench compile`, kiln.bench.compile.session)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from kiln.advise.findings import Finding
from kiln.bench.compile.compile_bench import CompileBenchOptions
from kiln.bench.compile.recipe_accuracy import compare
from kiln.bench.compile.recipes import Recipe
from kiln.bench.compile.session import BenchSession
from kiln.bench.ratios import gain_text, on_common_reference
from kiln.config.schema import Config
from kiln.monitor.records import read_records
from kiln.precision import cpu_bf16_native
from kiln.profile.profile_run import profile_run
from kiln.tune.space import MIN_GAIN  # a change is advised on the rule autotune applies

# The device waits for data more than this share of the step: the loader is the bottleneck.
DATA_WAIT_LIMIT = 0.05
# GPU idle between kernels above this share of the GPU timeline: the step is launch-bound.
IDLE_LIMIT = 0.30


def short_profile(cfg: Config, *, steps: int = 10, warmup: int = 3) -> dict[str, Any]:
    """A short `kiln profile` of the config (the training step kiln train runs): its summary plus
    the data wait share of the window's metrics record (the profiler's own overhead counts in the
    step there, so the share errs low)."""
    rep = dataclasses.replace
    cfg = rep(cfg, metrics=rep(cfg.metrics, console=False))
    with tempfile.TemporaryDirectory(prefix="kiln-advise-") as tmp:
        out = Path(tmp) / "profile"
        summary = profile_run(cfg, out, steps=steps, warmup=warmup, memory_steps=0)
        records = read_records(out / "metrics.jsonl")
    last = next((r for r in reversed(records) if not r.get("first_step")), records[-1] if records else {})
    return {**(summary or {}), "data_wait_frac": last.get("data_wait_frac"), "run_step_ms": last.get("step_ms")}


def check_data_loader(cfg: Config, run: dict[str, Any]) -> Finding:
    title = "data loader keeps up"
    frac = run.get("data_wait_frac")
    if frac is None:
        return Finding("data_loader", title, "n/a", "the short run logged no data wait")
    measured = {"data_wait_frac": frac, "step_ms": run.get("run_step_ms")}
    if cfg.data.source == "synthetic":
        return Finding("data_loader", title, "ok", f"synthetic data is made on the device: waited {frac:.1%} of the "
                       "step for it", measured=measured)
    if frac <= DATA_WAIT_LIMIT:
        return Finding("data_loader", title, "ok", f"the step waited {frac:.1%} of its time for data", measured=measured)
    d = cfg.data
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fixes = [f"data.num_workers={min(max(2 * d.num_workers, d.num_workers + 2), max(1, cores - 1))} (now {d.num_workers})"]
    if d.prefetch_factor < 4:
        fixes.append(f"data.prefetch_factor=4 (now {d.prefetch_factor})")
    if not d.pin_memory and cfg.training.device != "cpu":
        fixes.append("data.pin_memory=true")
    fixes.append("or decode/augment once offline (files of ready tensors)")
    return Finding("data_loader", title, "advice", f"the device waited for data {frac:.0%} of each step "
                   f"({d.num_workers} workers)", ", ".join(fixes),
                   f"up to {frac:.0%} of the step (the measured wait)", frac, measured)


def measuring_session(cfg: Config, recipe: Recipe, has_blocks: bool) -> BenchSession:
    """The bench session the measured checks share (eager baselines and the fp64 reference built once)."""
    recipes = [recipe, *capture_candidates(recipe, has_blocks)]
    opts = CompileBenchOptions(cfg=cfg, recipes=recipes, steps=20, warmup=3, accuracy_steps=3, fresh_cache=False)
    return BenchSession(opts)


def capture_candidates(recipe: Recipe, has_blocks: bool) -> list[Recipe]:
    """The config's recipe with whole-step capture, and with regional compile too where it can be."""
    captured = dataclasses.replace(recipe, cudagraphs=True)
    out = [captured]
    if has_blocks and captured.compiled and captured.scope == "model" and not captured.regional:
        out.append(dataclasses.replace(captured, regional=True))
    return out


def check_launch_bound(cfg: Config, run: dict[str, Any] | None, recipe: Recipe, device: torch.device, *,
                       has_blocks: bool, session: BenchSession | None) -> Finding:
    """GPU idle gaps between kernels from the short profile; the gain of whole-step capture measured
    as `kiln bench compile` rows (the config's recipe without and with capture)."""
    title = "launch-bound steps (CUDA graphs)"
    if device.type != "cuda":
        return Finding("launch_bound", title, "n/a", "CPU run: no kernel launches to hide (the GPU idle-gap check "
                       "needs a CUDA device)")
    if run is None:
        return Finding("launch_bound", title, "n/a", "needs a short profile run (--measure)")
    gpu = run.get("gpu") or {}
    if gpu.get("status") != "ok":
        return Finding("launch_bound", title, "n/a", f"no GPU timeline: {gpu.get('reason')}")
    idle = gpu["idle"]
    measured = {"idle_frac": idle["idle_frac"], "idle_ms_per_step": idle["idle_ms_per_step"],
                "busy_ms_per_step": idle["busy_ms_per_step"], "kernels_per_step": gpu.get("kernels_per_step")}
    finding = (f"the GPU sat idle {idle['idle_frac']:.0%} of the step between kernels ({idle['idle_ms_per_step']:.3g} "
               f"ms idle, {idle['busy_ms_per_step']:.3g} ms busy, {gpu.get('kernels_per_step', 0):.0f} kernels/step)")
    if cfg.compile.cudagraphs:
        return Finding("launch_bound", title, "ok", finding + "; whole-step capture is on", measured=measured)
    if idle["idle_frac"] <= IDLE_LIMIT:
        return Finding("launch_bound", title, "ok", finding, measured=measured)
    keys = "compile.cudagraphs=true" + ("" if cfg.compile.enabled else " compile.enabled=true") + (
        " compile.regional=true" if has_blocks and cfg.compile.scope == "model" else "")
    fix = f"{keys}: the whole step (forward, backward, optimizer) replays as one CUDA graph"
    if session is None:
        return Finding("launch_bound", title, "advice", finding, fix, measured=measured)
    candidates = capture_candidates(recipe, has_blocks)
    base = session.measure(recipe)
    rows = [(c, session.measure(c)) for c in candidates]
    ok = [(c, r) for c, r in rows if r.get("status") == "ok" and r.get("speedup_vs_eager_fp32")]
    if base.get("status") != "ok" or not ok:
        why = base.get("reason") if base.get("status") != "ok" else "; ".join(str(r.get("reason")) for _, r in rows)
        return Finding("launch_bound", title, "advice", finding, fix, measured=measured,
                       details=[{"note": f"capture not measured: {why}"}])
    best, row = max(ok, key=lambda cr: cr[1]["speedup_vs_eager_fp32"])
    pair = on_common_reference(base, row)
    ratio = pair["ratio"]
    measured.update(step_ms=pair["before_ms"], captured_step_ms=row["step_ms"], speedup=ratio,
                    captured_regional=best.regional, noisy=pair["noisy"], reference_drift=pair["drift"])
    gain = gain_text(pair, "uncaptured", "captured")
    status = "advice" if ratio > 1 + MIN_GAIN and not pair["noisy"] else "info"
    if best.regional and "regional" not in fix:
        fix += " compile.regional=true"
    return Finding("launch_bound", title, status, finding, fix if status == "advice" else
                   _not_faster("capture", pair) + ": leave it off", gain, 1 - 1 / ratio, measured)


def bf16_capable(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()

    return cpu_bf16_native()


def check_precision(cfg: Config, device: torch.device, *, session: BenchSession | None) -> Finding:
    """fp32 (or fp16 with its GradScaler) where bf16 autocast would do; measured as eager rows at
    both precisions, and the bf16 loss trajectory checked against fp32's with bf16's tolerance."""
    title = "bf16 where fp32 is used"
    policy = cfg.precision.policy
    if policy.startswith("bf16"):
        return Finding("precision", title, "ok", f"precision.policy={policy} already")
    if not bf16_capable(device):
        return Finding("precision", title, "ok", f"{policy}: this {device.type} has no native bf16, keep it")
    finding = (f"precision.policy={policy} on a {device.type} with native bf16"
               + (" (fp16 needs a GradScaler; bf16 has fp32's range and needs none)" if policy == "fp16-mixed" else ""))
    fix = "precision.policy=bf16-mixed (autocast: bf16 matmuls, fp32 weights and reductions)"
    if session is None:
        return Finding("precision", title, "advice", finding, fix)
    mine_row, mine = session.eager(policy)
    bf_row, bf = session.eager("bf16-mixed")
    verdict = None
    if mine is not None and bf is not None:
        verdict = compare(mine.values, bf.values, session.matrix.fp64_values("task"), precision="bf16-mixed",
                          train=True)
    if mine_row.get("status") != "ok" or bf_row.get("status") != "ok":
        return Finding("precision", title, "advice", finding, fix,
                       details=[{"note": f"not measured: {mine_row.get('reason') or bf_row.get('reason')}"}])
    pair = on_common_reference(mine_row, bf_row)
    ratio = pair["ratio"]
    measured = {"step_ms": pair["before_ms"], "bf16_step_ms": bf_row["step_ms"], "speedup": ratio,
                "accuracy_vs_fp32": verdict.get("accuracy") if verdict else None, "what": "eager steps, interleaved",
                "noisy": pair["noisy"], "reference_drift": pair["drift"]}
    gain = gain_text(pair, policy, "bf16-mixed") + ", eager steps"
    if verdict and verdict.get("accuracy") == "fail":
        return Finding("precision", title, "info", finding + "; but the bf16 loss trajectory left fp32's beyond "
                       "bf16's tolerance", "keep fp32 unless a longer run shows the same loss", gain, 1 - 1 / ratio,
                       measured, [{"accuracy": verdict}])
    status = "advice" if ratio > 1 + MIN_GAIN and not pair["noisy"] else "info"
    return Finding("precision", title, status, finding + ("; the first steps' losses match fp32 within bf16's "
                   "tolerance" if verdict else ""), fix if status == "advice" else
                   _not_faster("bf16 in eager steps", pair) + " (kiln autotune measures it compiled)", gain,
                   1 - 1 / ratio, measured)


def _not_faster(what: str, pair: dict[str, Any]) -> str:
    """Why a measured change is not advised: too noisy to tell, or under MIN_GAIN faster."""
    if pair["noisy"]:
        return f"{what} could not be ranked: the steps were too noisy (rerun on a quieter machine)"
    return f"{what} measured less than {MIN_GAIN:.0%} faster"
