"""The time budget of `kiln autotune`: what a candidate will cost, whether it still fits, and a
last-resort stop for a compile that runs past the end.

Costs are estimated from the rows already measured in this search: the wall time of a row (build,
compile, warm-up, interleaved timing, accuracy check) scaled by how much more a candidate
compiles than the rows seen so far. The factors are rough priors (max-autotune compiles one to
two orders of magnitude longer than the default mode, because it benchmarks kernel candidates;
regional compile cuts compile time by about the number of repeated blocks); they only decide what
is worth starting, the figures reported are always measured.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kiln.bench.compile.recipes import Recipe

# Compile cost of a recipe relative to inductor's default mode on the whole model, scope model.
MODE_FACTOR = {"default": 1.0, "reduce-overhead": 1.2, "max-autotune-no-cudagraphs": 15.0, "max-autotune": 16.0}
SCOPE_FACTOR = {"model": 1.0, "model+loss": 1.1, "step": 1.6}
REGIONAL_FACTOR = 0.3
# Before any compiled row was seen: a default compile of a mid-sized model.
PRIOR_COMPILE_S = {"cuda": 40.0, "cpu": 30.0}


def compile_factor(recipe: Recipe) -> float:
    if not recipe.compiled:
        return 0.0
    factor = MODE_FACTOR.get(recipe.mode, 2.0) * SCOPE_FACTOR.get(recipe.scope or "model", 1.0)
    if recipe.backend not in (None, "inductor"):
        factor *= 0.5
    return factor * (REGIONAL_FACTOR if recipe.regional else 1.0)


INTERRUPTED = "interrupted (Ctrl-C)"
BUDGET_SPENT = "time budget spent"


class BudgetExceeded(Exception):
    """Raised into a row that ran past the hard stop (it becomes a `skipped` row)."""


@dataclass
class Budget:
    seconds: float
    device_type: str = "cpu"
    start: float = field(default_factory=time.monotonic)
    _compile_per_factor: list[float] = field(default_factory=list)
    _overhead: list[float] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def left(self) -> float:
        return self.seconds - self.elapsed

    def observe(self, recipe: Recipe, row: dict, wall_s: float, *, recompiled: bool = False) -> None:
        """Learn from a measured row: its compile time per unit of compile factor, and the rest of
        its wall time (building, warm-up, timing, accuracy; `recompiled`: the accuracy check
        compiled a second copy, which is not overhead)."""
        compile_s = row.get("compile_s") or 0.0
        factor = compile_factor(recipe)
        if factor and row.get("status") == "ok" and compile_s > 0:
            self._compile_per_factor.append(compile_s / factor)
        self._overhead.append(max(0.0, wall_s - compile_s * (2 if recompiled else 1)))

    def compile_estimate(self, recipe: Recipe) -> float:
        """The largest compile time per unit seen so far (rows whose graphs were already in the
        cache compile fast and would make a median too hopeful) times the recipe's factor."""
        if not recipe.compiled:
            return 0.0
        per = max(self._compile_per_factor) if self._compile_per_factor else PRIOR_COMPILE_S.get(self.device_type, 30.0)
        return per * compile_factor(recipe)

    def estimate(self, recipe: Recipe, *, accuracy_recompile: bool = False) -> float:
        """Seconds the row will take: its compile (twice when the accuracy check compiles a second
        copy drawing eager's random numbers) plus the typical rest of a row."""
        overhead = max(self._overhead) if self._overhead else 5.0
        compile_s = self.compile_estimate(recipe)
        return compile_s * (2 if accuracy_recompile else 1) + overhead

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left

    def first_compile_affordable(self, seconds: float) -> bool:
        """Before any compile was seen the estimate is only a prior: the first compile starts when
        half of it fits (the hard stop still ends it in time), or nothing could ever be learned."""
        return not self._compile_per_factor and 0.5 * seconds <= self.left

    def within(self, work: Callable[[], Any], grace_s: float = 0.0) -> tuple[Any, str | None]:
        """(work(), None), or (None, why it stopped): the budget's end (`hard_stop`: the budget is a
        promise, kept to the second) or Ctrl-C. Both end a search; the rows measured before stay."""
        try:
            with self.hard_stop(grace_s):
                return work(), None
        except BudgetExceeded as exc:
            return None, str(exc)
        except KeyboardInterrupt:
            return None, f"{INTERRUPTED} during this row"

    @contextlib.contextmanager
    def hard_stop(self, grace_s: float) -> Iterator[None]:
        """Raise BudgetExceeded in this (main) thread once the budget plus `grace_s` is spent: a
        compile that blows far past its estimate must not hold the whole search hostage. No-op off
        the main thread or where SIGALRM does not exist."""
        usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        remaining = self.left + grace_s
        if not usable:
            yield
            return
        if remaining <= 0:
            raise BudgetExceeded("the time budget was spent before this row started")

        def stop(signum, frame):
            raise BudgetExceeded(f"the time budget ({self.seconds / 60:.1f} min) ran out during this row")

        # An alarm someone else set (a test runner's timeout, a job wrapper) fires first if it is
        # due first, and is set again afterwards with what is left of it.
        outer_due, _ = signal.getitimer(signal.ITIMER_REAL)
        armed_at = time.monotonic()
        previous = signal.signal(signal.SIGALRM, stop)
        if previous is None:  # a handler not installed from Python: restore the default action
            previous = signal.SIG_DFL
        signal.setitimer(signal.ITIMER_REAL, min(remaining, outer_due) if outer_due > 0 else remaining)
        if 0 < outer_due <= remaining:
            signal.signal(signal.SIGALRM, previous)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            outer_left = outer_due - (time.monotonic() - armed_at)
            if outer_due > 0 and outer_left > 0:  # (an outer alarm that already fired is not set again)
                signal.setitimer(signal.ITIMER_REAL, outer_left)
