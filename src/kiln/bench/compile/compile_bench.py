"""`kiln bench compile`: eager and every selected compile recipe, side by side, in one process.

Rows are grouped by loss, then precision (fp32 first: its eager run is the reference of
`speedup_vs_eager_fp32`). For each group the eager baseline is built and kept; each compiled
recipe is then built (fresh model, same weights), its first step timed (compile), warmed up,
and timed *interleaved* with its eager baseline (and eager fp32) through the shared timing
helper, so drift hits all sides alike (PyTorch's harness: speedup = median eager / median
compiled). A failing recipe becomes a row (`oom`, `error`, `accuracy_fail`, `skipped`) with a
one-line reason and the matrix goes on; dynamo's caches are reset and memory freed between rows.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kiln.bench.compile.compile_rows import base_row, compare_with_plain, skip_reason, timing_figures
from kiln.bench.compile.recipe_accuracy import compare, eager_random
from kiln.bench.compile.recipes import Recipe
from kiln.bench.compile.runner import FP64, BenchContext, Started, build_context, release, start_runner
from kiln.bench.ratios import ratio_text
from kiln.bench.row_failure import failure
from kiln.compile import compile_counters, recompiles
from kiln.compile_cache import artifacts_blob, fresh_artifacts, load_blob
from kiln.config.schema import Config
from kiln.cpu.threads import cpu_settings
from kiln.precision import tf32_enabled
from kiln.runtime import deterministic_mode, resolve_device
from kiln.timing import Timing, measure, measure_interleaved
from kiln.train.capture import WARMUP_STEPS

Log = Callable[[str], None]

@dataclass
class CompileBenchOptions:
    cfg: Config
    """Base config (model, data, optimizer, ...); each row sets precision and compile from its recipe."""
    recipes: list[Recipe]
    train: bool = True
    steps: int = 20
    """Timed samples per side, taken interleaved."""
    warmup: int = 3
    """Steps after the first (compiling) one before timing; CUDA graphs are recorded here."""
    accuracy_steps: int = 3
    """Optimizer steps in the loss-trajectory check; 0 turns accuracy checks off."""
    fresh_cache: bool = True
    """Compile each row with empty inductor/triton caches, so compile_s is a cold compile."""
    warm_start: bool = False
    """Also time each compiled row's compile from its own saved cache artifacts (a warm restart)."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fresh_cache(enabled: bool) -> contextlib.AbstractContextManager:
    if not enabled:
        return contextlib.nullcontext()
    import torch._inductor.utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or getattr(inductor_utils, "fresh_inductor_cache", None)
    return fresh() if fresh is not None else contextlib.nullcontext()


class MatrixRun:
    def __init__(self, ctx: BenchContext, opts: CompileBenchOptions, log: Log, phase: Log | None = None):
        """`log` gets one line per finished row; `phase` (kiln.activity) what is being done now."""
        self.ctx, self.opts, self.log = ctx, opts, log
        self.phase = phase or (lambda message: None)
        self._row_name = ""
        self.device = ctx.device
        self.values = max(1, opts.accuracy_steps) if ctx.train else 1
        if ctx.train and any(r.cudagraphs for r in opts.recipes):
            # A captured recipe runs its first steps uncaptured (warm-up): check the trajectory
            # far enough to cover replays of its graph too.
            self.values += WARMUP_STEPS + 1
        self._fp64: dict[str, Any] = {}
        self._blob: tuple[bytes, int] | None = None
        self.done = 0

    # -- the reference runs ------------------------------------------------------------------
    def fp64_values(self, loss: str) -> Any:
        """The float64 eager run's values for this loss (computed once; None if it cannot run)."""
        if loss not in self._fp64:
            self._phase(f"the float64 reference run (loss {loss}) for the accuracy checks")
            try:
                started = start_runner(self.ctx, Recipe.eager("fp32", loss), warmup=0, values=self.values,
                                       policy=FP64)
                self._fp64[loss] = started.values if self.ctx.train else started.values[0]
                del started
            except Exception as exc:  # e.g. an op without a float64 kernel: the harness falls back to cosine
                self.log(f"fp64 reference for loss {loss} failed ({failure(exc)[1]}); accuracy uses cosine similarity")
                self._fp64[loss] = None
            self.ctx.drop_teacher(torch.float64)
            release(self.device)
        return self._fp64[loss]

    def _phase(self, what: str) -> None:
        self.phase(f"{self._row_name}: {what}" if self._row_name else what)

    def interleave(self, sides: dict[str, Callable[[], object]]) -> dict[str, Timing]:
        others = " and ".join(s.replace("_", " ") for s in sides if s not in ("compiled", "eager"))
        self._phase(f"timing {self.opts.steps} samples interleaved"
                    + (f" with eager{' and ' + others if others else ''}" if "compiled" in sides else ""))
        return measure_interleaved(sides, warmup=1, repeats=self.opts.steps, device=self.device)

    def _report(self, recipe: Recipe, row: dict) -> None:
        self.done += 1
        total = len(self.opts.recipes)
        figures = ""
        if row.get("step_ms") is not None:
            figures = f" {row['step_ms']:.3f} ms"
            if row.get("speedup") is not None and not recipe.is_baseline:
                figures += (f" vs eager {row['eager_step_ms']:.3f} ms timed beside it: "
                            f"{ratio_text(row['speedup'], row.get('noisy'))}" + (" (noisy)" if row.get("noisy") else ""))
            elif row.get("noisy"):
                figures += f" (p10-p90 {row['step_ms_p10']:.3f}-{row['step_ms_p90']:.3f} ms: noisy)"
            if row.get("compile_s") is not None:
                figures += f", compile {row['compile_s']:.1f} s"
        why = f": {row['reason']}" if row.get("reason") else ""
        self.log(f"[{self.done}/{total}] {recipe.label}: {row['status']}{figures}{why}")

    def _starting(self, recipe: Recipe, what: str) -> None:
        self._row_name = f"[{self.done + 1}/{len(self.opts.recipes)}] {recipe.label}"
        self._phase(what)

    # -- rows --------------------------------------------------------------------------------
    # The measuring is done in helpers, so that when one raises, the runner it built is only
    # referenced by the traceback, and is gone by the time `release` frees memory.
    def _time_eager(self, row: dict, recipe: Recipe, ref32: Started | None) -> Started:
        started = start_runner(self.ctx, recipe, warmup=self.opts.warmup, values=self.values,
                               probe_rng=self.ctx.train)
        if self.ctx.flops_per_step is None:
            self.ctx.flops_per_step = started.runner.count_flops()
        sides: dict[str, Callable[[], object]] = {"eager": started.runner}
        if ref32 is not None:
            sides["eager_fp32"] = ref32.runner
        timing_figures(self.ctx, row, self.interleave(sides), "eager")
        row.update(first_step_s=started.first_step_s, warmup_s=started.warmup_s,
                   peak_mem_bytes=started.peak_mem_bytes,
                   memory_compression=1.0 if started.peak_mem_bytes else None,
                   graphs=0, graph_breaks=0, recompiles=0, uses_rng=started.uses_rng)
        return started

    def eager_row(self, recipe: Recipe, ref32: Started | None) -> tuple[dict, Started | None]:
        row = base_row(self.ctx, recipe)
        try:
            return row, self._time_eager(row, recipe, ref32)
        except Exception as exc:
            row["status"], row["reason"] = failure(exc)
        release(self.device)
        return row, None

    def _time_compiled(self, row: dict, recipe: Recipe, eager: Started, ref32: Started | None) -> list[Any]:
        """Build, compile, warm up and time the recipe against its eager baselines; fills `row`
        and returns the values of its first steps for the accuracy check."""
        before = compile_counters()
        self._phase(f"compiling{' (cold caches)' if self.opts.fresh_cache else ''} and warming up")
        started = start_runner(self.ctx, recipe, warmup=self.opts.warmup, values=self.values)
        sides: dict[str, Callable[[], object]] = {"eager": eager.runner, "compiled": started.runner}
        if ref32 is not None and recipe.precision != "fp32":
            sides["eager_fp32"] = ref32.runner
        timings = self.interleave(sides)
        after = compile_counters()
        timing_figures(self.ctx, row, timings, "compiled")
        alone = measure(started.runner, warmup=1, repeats=self.opts.steps, device=self.device).as_dict()
        row.update(step_ms_alone=alone["median_ms"], step_ms_alone_p10=alone["p10_ms"], step_ms_alone_p90=alone["p90_ms"])
        peak, eager_peak = started.peak_mem_bytes, eager.peak_mem_bytes
        row["capture"] = started.runner.capture_status
        if recipe.cudagraphs and row["capture"] and row["capture"].startswith("fallback"):
            row["reason"] = row["capture"]
        row.update(
            compile_s=max(0.0, started.first_step_s - timings["eager"].median_s),
            first_step_s=started.first_step_s,
            warmup_s=started.warmup_s,
            peak_mem_bytes=peak,
            eager_peak_mem_bytes=eager_peak,
            memory_compression=eager_peak / peak if eager_peak and peak else None,
            graphs=after["graphs"] - before["graphs"],
            graph_breaks=after["graph_breaks"] - before["graph_breaks"],
            recompiles=recompiles(),  # dynamo was reset before this row
        )
        self._blob = artifacts_blob() if self.opts.warm_start and recipe.compiled else None
        return started.values

    def _warm_compile(self, row: dict, recipe: Recipe) -> None:
        """Compile the recipe again in empty caches filled from the cold compile's artifacts only:
        the compile a restarted run pays (kiln saves the artifacts with each run)."""
        blob, self._blob = self._blob, None
        if blob is None:
            row["compile_warm_s"] = None
            return
        with fresh_cache(True), fresh_artifacts():
            load_blob(blob[0])
            started = start_runner(self.ctx, recipe, warmup=0, values=1)
        row["compile_warm_s"] = max(0.0, started.first_step_s - row["eager_step_ms"] / 1e3)
        if row.get("compile_s"):
            row["warm_cold_ratio"] = row["compile_warm_s"] / row["compile_s"]

    def _values_on_eager_rng(self, recipe: Recipe) -> list[Any]:
        """The timed copy draws its own random numbers (inductor's RNG), so the check runs a fresh
        copy compiled to draw them through eager's generator, as the harness does."""
        with eager_random():
            return start_runner(self.ctx, recipe, warmup=0, values=self.values).values

    def compiled_row(self, recipe: Recipe, eager: Started, ref32: Started | None) -> dict:
        row = base_row(self.ctx, recipe)
        reason = skip_reason(self.ctx, recipe)
        if reason:
            row.update(status="skipped", reason=reason)
            return row
        import torch._dynamo

        torch._dynamo.reset()
        try:
            # One cache per row (the check reuses its autotuning); only its own artifacts recorded.
            with fresh_cache(self.opts.fresh_cache), fresh_artifacts():
                values = self._time_compiled(row, recipe, eager, ref32)
                release(self.device)
                if recipe.runner == "plain":
                    row["accuracy"] = "n/a (baseline)"
                elif self.ctx.train and self.opts.accuracy_steps == 0:
                    row["accuracy"] = "skipped"
                else:
                    self._phase("checking accuracy against eager and the fp64 reference")
                    if eager.uses_rng:
                        values = self._values_on_eager_rng(recipe)
                        release(self.device)
                    reference = eager.values if self.ctx.train else eager.values[0]
                    result = values if self.ctx.train else values[0]
                    verdict = compare(reference, result, self.fp64_values(recipe.loss),
                                      precision=recipe.precision, train=self.ctx.train)
                    reason = verdict.pop("accuracy_reason", None)
                    row.update(verdict)
                    if reason:
                        row.update(status="accuracy_fail", reason=reason)
            if self.opts.warm_start and recipe.compiled:
                release(self.device)
                self._phase("compiling again from the saved cache artifacts (warm start)")
                self._warm_compile(row, recipe)
        except Exception as exc:
            row["status"], row["reason"] = failure(exc)
        finally:
            release(self.device)
        return row

    # -- the matrix --------------------------------------------------------------------------
    def run(self) -> list[dict]:
        plan = self.opts.recipes
        rows: dict[Recipe, dict] = {}
        for loss in dict.fromkeys(r.loss for r in plan):
            group = [r for r in plan if r.loss == loss]
            precisions = ["fp32", *(p for p in dict.fromkeys(r.precision for r in group) if p != "fp32")]
            ref32: Started | None = None
            for precision in precisions:
                eager_recipe = Recipe.eager(precision, loss)
                self._starting(eager_recipe, "building eager")
                row, eager = self.eager_row(eager_recipe, ref32 if precision != "fp32" else None)
                rows[eager_recipe] = row
                self._report(eager_recipe, row)
                for recipe in (r for r in group if r.precision == precision and not r.is_baseline):
                    if eager is None:
                        rows[recipe] = {**base_row(self.ctx, recipe), "status": "skipped",
                                        "reason": f"eager baseline at {precision} failed: {row['reason']}"}
                    else:
                        self._starting(recipe, "building")
                        rows[recipe] = self.compiled_row(recipe, eager, ref32)
                    self._report(recipe, rows[recipe])
                if precision == "fp32":
                    ref32 = eager
                else:
                    del eager
                    release(self.device)
            del ref32
            release(self.device)
        out = [rows[r] for r in plan if r in rows]
        compare_with_plain(out)
        return out


def run_compile_bench(opts: CompileBenchOptions, log: Log | None = None, phase: Log | None = None) -> list[dict]:
    """Run the planned rows; returns one row dict per recipe in plan order (all statuses). `log`
    gets a line per finished row, `phase` a line whenever the work moves on (building, compiling,
    timing, checking accuracy), so that minutes of compiling show on the console."""
    cfg = opts.cfg
    device = resolve_device(cfg.training.device)
    log = log or _stderr
    cpu = cpu_settings(cfg.cpu) if device.type == "cpu" else contextlib.nullcontext()
    with tf32_enabled(cfg.precision.tf32), deterministic_mode(cfg.training.deterministic), cpu:
        ctx = build_context(cfg, device, train=opts.train, batches=max(2, opts.accuracy_steps))
        try:
            return MatrixRun(ctx, opts, log, phase).run()
        finally:
            ctx.close()
            release(device)
