"""Rows of `kiln bench compile`, measured one at a time on demand (what `kiln autotune` searches with).

A session builds the bench context once (device, batches, the fp64 accuracy reference) and keeps
the eager baselines alive, so that rows chosen one by one, after looking at the ones before, are
each measured exactly as `kiln bench compile` measures a row: built from the same weights,
compiled, warmed up, timed interleaved with eager at its precision and with eager fp32 (the same
runner for the whole session), and accuracy-checked. Rows measured at different times compare
through `speedup_vs_eager_fp32`, a ratio taken inside each row, so drift between rows cancels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kiln.bench.compile.compile_bench import CompileBenchOptions, MatrixRun, fresh_cache
from kiln.bench.compile.compile_rows import base_row, timing_figures
from kiln.bench.compile.recipes import Recipe
from kiln.bench.compile.runner import Started, build_context, release
from kiln.cpu.threads import cpu_settings
from kiln.precision import tf32_enabled
from kiln.runtime import deterministic_mode, resolve_device


class BenchSession:
    """`with BenchSession(opts) as s: row = s.measure(recipe)`. `opts.recipes` lists the recipes
    the session may be asked for (it sizes the accuracy check: capture needs longer trajectories).
    With `private_cache`, inductor compiles into one fresh cache for the whole session: a graph
    compiles cold the first time it is seen and warm when a later row repeats it."""

    def __init__(self, opts: CompileBenchOptions, log: Callable[[str], None] | None = None, *,
                 private_cache: bool = True):
        self.opts = opts
        self.device = resolve_device(opts.cfg.training.device)
        self._stack = contextlib.ExitStack()
        self._private_cache = private_cache
        self._log = log or (lambda message: None)
        self._eager: dict[tuple[str, str], tuple[dict[str, Any], Started | None]] = {}
        self.matrix: MatrixRun | None = None

    def __enter__(self) -> BenchSession:
        cfg = self.opts.cfg
        try:
            self._stack.enter_context(tf32_enabled(cfg.precision.tf32))
            self._stack.enter_context(deterministic_mode(cfg.training.deterministic))
            if self.device.type == "cpu":
                self.plan = self._stack.enter_context(cpu_settings(cfg.cpu))
            if self._private_cache:
                self._stack.enter_context(fresh_cache(True))
            ctx = build_context(cfg, self.device, train=self.opts.train, batches=max(2, self.opts.accuracy_steps))
            self._stack.callback(ctx.close)
            self.matrix = MatrixRun(ctx, self.opts, self._log)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._eager.clear()
        self.matrix = None
        try:
            self._stack.close()
        finally:
            release(self.device)

    @property
    def context(self):
        return self.matrix.ctx

    def has_eager(self, precision: str, loss: str = "task") -> bool:
        """Whether the eager baseline at `precision` was measured already (the next `eager` is free)."""
        return (loss, precision) in self._eager

    def eager(self, precision: str, loss: str = "task") -> tuple[dict[str, Any], Started | None]:
        """The eager baseline row at `precision` (measured once, interleaved with eager fp32)."""
        key = (loss, precision)
        if key not in self._eager:
            ref32 = None
            if precision != "fp32":
                ref32 = self.eager("fp32", loss)[1]
            self._eager[key] = self.matrix.eager_row(Recipe.eager(precision, loss), ref32)
        return self._eager[key]

    def measure(self, recipe: Recipe, *, retime: bool = False) -> dict[str, Any]:
        """One row, as `kiln bench compile` would report it. An eager baseline is measured once;
        `retime` times its runner again (interleaved with eager fp32, as at first) for a fresh median."""
        row, eager = self.eager(recipe.precision, recipe.loss)
        if recipe.is_baseline:
            if not retime or eager is None:
                return dict(row)
            sides = {"eager": eager.runner}
            if recipe.precision != "fp32":
                sides["eager_fp32"] = self.eager("fp32", recipe.loss)[1].runner
            fresh = dict(row)
            timing_figures(self.context, fresh, self.matrix.interleave(sides), "eager")
            return fresh
        if eager is None:
            return {**base_row(self.context, recipe), "status": "skipped",
                    "reason": f"eager baseline at {recipe.precision} failed: {row['reason']}"}
        ref32 = self.eager("fp32", recipe.loss)[1] if recipe.precision != "fp32" else None
        return self.matrix.compiled_row(recipe, eager, ref32)

