"""A `kiln bench compile` row: its schema, its figures from interleaved timings, why a recipe is
skipped, and how kiln's rows compare with the plain hand loop's.

Every row carries every key of FIGURES, CEILING_FIGURES, ALONE_FIGURES and the shared training
settings (None where a row has no such figure), so consumers see one schema whatever the status.
"""

from __future__ import annotations

from typing import Any

from kiln.bench.compile.recipes import Recipe, cuda_graph_reason
from kiln.bench.compile.runner import BenchContext
from kiln.bench.formulas import peak_fraction, speedup, tflops
from kiln.bench.ratios import annotate
from kiln.config.schema import Config
from kiln.timing import Timing

# Every row carries these keys (None where a row has no such figure), so consumers see one schema.
FIGURES = (
    "compile_s", "first_step_s", "warmup_s", "step_ms", "step_ms_p10", "step_ms_p90", "samples", "eager_step_ms",
    "eager_fp32_step_ms", "speedup", "speedup_vs_eager_fp32", "throughput", "peak_mem_bytes",
    "memory_compression", "graphs", "graph_breaks", "recompiles", "accuracy", "capture", "compile_warm_s",
    "warm_cold_ratio", "speedup_vs_plain", "speedup_vs_best_plain", "tflops", "matmul_peak_tflops", "peak_frac",
    "eager_step_ms_p10", "eager_step_ms_p90", "step_spread", "eager_spread", "noisy", "flags",
)
# Model FLOP/s against the datasheet's dense peak at the row's matrix-unit dtype (`peak_frac` is
# against the best matmul measured on the spot), and the settings a plain loop shares with kiln.
CEILING_FIGURES = ("spec_peak_tflops", "spec_peak_frac", "spec_source")
# A compiled row's steps timed back to back after the interleaved samples, as a user's own script
# times its loop: the cross-check of `step_ms` (benchmarks/plain_crosscheck.py does it without kiln).
ALONE_FIGURES = ("step_ms_alone", "step_ms_alone_p10", "step_ms_alone_p90")
SETTINGS = ("grad_clip", "schedule", "warmup_steps", "lr", "optimizer", "tf32")


def skip_reason(ctx: BenchContext, recipe: Recipe) -> str | None:
    """Why `recipe` cannot run in this bench (inference, or no CUDA for a captured recipe), or None."""
    if not ctx.train and recipe.runner == "plain":
        return "the plain baseline is a training loop; inference rows compile the model the plain way already"
    if not ctx.train and recipe.cudagraphs:
        return "whole-step capture records a training step; use mode reduce-overhead for inference"
    if not ctx.train and recipe.loss != "task":
        return "distillation is a training loss; inference rows use the model's outputs"
    if not ctx.train and recipe.compiled and recipe.scope != "model":
        return f"scope {recipe.scope} compiles a loss or optimizer step; inference has neither"
    cuda_graphs = cuda_graph_reason(recipe)
    if cuda_graphs and ctx.device.type != "cuda":
        return f"{cuda_graphs}; needs a CUDA device, this run is on {ctx.device.type}"
    return None


def base_row(ctx: BenchContext, recipe: Recipe) -> dict[str, Any]:
    """A row before measuring: what it is (model, recipe, settings) and every figure None."""
    return {
        "model": ctx.model_name,
        "task": ctx.task,
        "run": "train" if ctx.train else "infer",
        "batch_size": ctx.cfg.data.batch_size,
        "precision": recipe.precision,
        "loss": recipe.loss,
        "mode": recipe.mode,
        "backend": recipe.backend,
        "scope": recipe.scope,
        "runner": recipe.runner,
        "cudagraphs": recipe.cudagraphs,
        "regional": recipe.regional,
        "status": "ok",
        "reason": None,
        **dict.fromkeys(FIGURES),
        **dict.fromkeys(CEILING_FIGURES),
        **dict.fromkeys(ALONE_FIGURES),
        **settings(ctx.cfg),
    }


def settings(cfg: Config) -> dict[str, Any]:
    """The training settings every row of a bench shares (plain rows included): clipping and the
    LR schedule cost a hand loop real time, so a table names them."""
    o = cfg.optim
    return {"grad_clip": cfg.training.grad_clip, "schedule": o.schedule, "warmup_steps": o.warmup_steps,
            "lr": o.lr, "optimizer": o.name, "tf32": cfg.precision.tf32}


def timing_figures(ctx: BenchContext, row: dict, timings: dict[str, Timing], side: str) -> None:
    """Step time, throughput, FLOP/s and speedups of `side` from timings taken interleaved with
    its eager baseline (and eager fp32): speedup = median eager / median `side`."""
    mine = timings[side].as_dict()
    step_s = timings[side].median_s
    row.update(step_ms=mine["median_ms"], step_ms_p10=mine["p10_ms"], step_ms_p90=mine["p90_ms"],
               samples=mine["samples"])
    row["throughput"] = ctx.samples_per_step / step_s if step_s > 0 else None
    if ctx.flops_per_step and step_s > 0:
        row["tflops"] = tflops(ctx.flops_per_step, step_s)
        peak = ctx.matmul_peak(row["precision"])
        row["matmul_peak_tflops"] = peak / 1e12
        row["peak_frac"] = peak_fraction(ctx.flops_per_step, step_s, peak)
        spec, source = ctx.spec_peak(row["precision"])
        if spec is not None:
            row.update(spec_peak_tflops=spec / 1e12, spec_peak_frac=peak_fraction(ctx.flops_per_step, step_s, spec),
                       spec_source=source)
    if ctx.tokens_per_step:
        row["tokens_per_s"] = ctx.tokens_per_step / step_s if step_s > 0 else None
    eager_s = timings["eager"].median_s
    eager = timings["eager"].as_dict()
    row.update(eager_step_ms=eager_s * 1e3, eager_step_ms_p10=eager["p10_ms"], eager_step_ms_p90=eager["p90_ms"])
    row["speedup"] = speedup(eager_s, step_s)
    fp32 = timings.get("eager_fp32")
    if fp32 is not None:
        row["eager_fp32_step_ms"] = fp32.median_s * 1e3
        row["speedup_vs_eager_fp32"] = speedup(fp32.median_s, step_s)
    elif row["precision"] == "fp32":
        row["eager_fp32_step_ms"] = row["eager_step_ms"]
        row["speedup_vs_eager_fp32"] = row["speedup"]
    annotate(row)


def compare_with_plain(rows: list[dict]) -> None:
    """`speedup_vs_plain`: a kiln row's speedup over eager divided by that of the plain hand loop
    with the same precision, loss and mode; `speedup_vs_best_plain`: over the fastest plain row of
    its precision. Both sides were timed interleaved with the same eager runner, so the ratio of
    their speedups is their speed ratio with the drift between the two measurements taken out."""
    plain = [r for r in rows if r["runner"] == "plain" and r["status"] == "ok" and r.get("speedup")]
    for row in rows:
        if row["runner"] != "kiln" or row["status"] != "ok" or not row.get("speedup"):
            continue
        mine = [p for p in plain if p["precision"] == row["precision"] and p["loss"] == row["loss"]]
        same = [p for p in mine if p["mode"] == row["mode"]]
        if same:
            row["speedup_vs_plain"] = row["speedup"] / same[0]["speedup"]
        if mine:
            row["speedup_vs_best_plain"] = row["speedup"] / max(p["speedup"] for p in mine)
