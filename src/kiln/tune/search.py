"""`kiln autotune`: measure candidate recipes stage by stage within a time budget, keep the fastest
that passes the accuracy check.

Stages (each row measured by kiln's bench machinery, kiln.bench.compile.session):
1. baseline: eager at each allowed precision and the config's own recipe;
2. modes: each allowed precision x the cheap compile modes, scope model; precisions and modes
   clearly slower than the best are dropped;
3. capture/regional: whole-step CUDA-graph capture and regional compile on the surviving
   (precision, mode) pairs (capture first: regional compile only pays once the step is one graph);
4. scope: the best so far with the loss or the whole optimizer step compiled;
5. autotune modes: max-autotune(-no-cudagraphs) on the best, if its estimated compile fits;
6. confirm: the config's own recipe and the two best, measured again (warm compile) with twice
   the samples; the winner is decided on these rows, by their own medians (kiln.tune.space.speed).
Every candidate first has its cost estimated (kiln.tune.budget); what does not fit, or cannot
run here (capture on a CPU), is listed as not tried with the reason.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kiln.bench import ratios
from kiln.bench.compile.compile_bench import CompileBenchOptions
from kiln.bench.compile.recipes import Recipe
from kiln.bench.compile.session import BenchSession
from kiln.config.schema import Config
from kiln.runtime import resolve_device
from kiln.tune import space as sp
from kiln.tune.budget import BUDGET_SPENT, INTERRUPTED, Budget
from kiln.tune.space import versus_default


class Progress(Protocol):
    """What the search tells a progress display: candidates planned, one started, one done
    (`row` None when it was not measured: pruned, not affordable or not possible here)."""

    def planned(self, count: int) -> None: ...
    def started(self, stage: str, label: str) -> None: ...
    def finished(self, stage: str, label: str, row: dict[str, Any] | None, best: str | None) -> None: ...


class _Quiet:
    """The progress reporter when nobody watches (tests, library use): every event is dropped."""

    def planned(self, count: int) -> None:
        return None

    def started(self, stage: str, label: str) -> None:
        return None

    def finished(self, stage: str, label: str, row: dict[str, Any] | None, best: str | None) -> None:
        return None


@dataclass
class TuneOptions:
    cfg: Config
    space: sp.Space
    budget_s: float
    steps: int = 20
    """Timed samples per row in the search (the confirm stage takes twice as many)."""
    warmup: int = 3
    accuracy_steps: int = 3
    confirm: bool = True
    rank_noisy: bool = False
    """Let rows flagged too noisy to rank (kiln.bench.ratios) win; by default they keep the config's recipe."""


@dataclass
class Trial:
    recipe: Recipe
    stage: str
    row: dict[str, Any]
    wall_s: float

    @property
    def score(self) -> float | None:
        return sp.score(self.row)

    def faster_than(self, other: Trial) -> float | None:
        """How many times faster this row is than `other` (kiln.tune.space.relative)."""
        return sp.relative(self.row, self.stage, other.row, other.stage)


@dataclass
class TuneResult:
    trials: list[Trial]
    default: Recipe
    winner: Recipe
    winner_trial: Trial | None
    default_trial: Trial | None
    not_tried: list[dict[str, str]]
    notes: list[str]
    decided_on: str
    """`confirm` (the confirm stage's rows) or `search` (no time was left to confirm)."""
    elapsed_s: float
    stopped_early: bool = False
    stop_reason: str | None = None
    """Why the search stopped early (the budget, or Ctrl-C), None when it ran through."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup_vs_default(self) -> float | None:
        """The winner's `vs config` figure, exactly as its table row shows it."""
        if self.winner_trial is None or self.default_trial is None:
            return None
        return versus_default(self.trials, self.winner_trial, self.default, self.default_trial)


class Search:
    def __init__(self, opts: TuneOptions, *, has_blocks: bool, log: Callable[[str], None] | None = None,
                 progress: Progress | None = None, session_factory: Callable[..., Any] = BenchSession):
        """`session_factory(bench_options, log)` makes the measuring session (a BenchSession; tests
        pass a stand-in with the same `device`, `opts`, `eager` and `measure`)."""
        self.session_factory = session_factory
        self.opts = opts
        self.space = opts.space
        self.log = log or (lambda message: None)
        self.progress = progress or _Quiet()
        self.has_blocks = has_blocks
        self.default = sp.config_recipe(opts.cfg)
        self.trials: list[Trial] = []
        self.not_tried: list[dict[str, str]] = []
        self.notes: list[str] = []
        self.stopped = False
        self.stop_reason = BUDGET_SPENT
        self.session: BenchSession | None = None
        self.budget: Budget | None = None
        self.live_precisions: list[str] = list(self.space.precisions)

    # -- bookkeeping -------------------------------------------------------------------------
    def _tried(self, recipe: Recipe, stage: str | None = None) -> Trial | None:
        return next((t for t in self.trials if t.recipe == recipe and (stage is None or t.stage == stage)), None)

    def _skip(self, recipe: Recipe, reason: str, stage: str) -> None:
        """A planned candidate that is not measured, and why."""
        label = sp.describe(recipe)
        if not any(n["recipe"] == label for n in self.not_tried) and self._tried(recipe) is None:
            self.not_tried.append({"recipe": label, "stage": stage, "reason": reason, "fields": sp.recipe_fields(recipe)})
        best = self.best()
        self.progress.finished(stage, label, None, sp.describe(best.recipe) if best else None)

    def best(self, stage: str | None = None, where: Callable[[Trial], bool] = lambda t: True) -> Trial | None:
        """The fastest row (among `stage`'s), of an allowed precision or the config's own recipe:
        eager fp32 is every row's reference, not a candidate, unless fp32 is allowed. Confirm rows
        rank by their own medians, the others by their ratio to eager fp32 (kiln.tune.space.speed)."""
        allowed = set(self.space.precisions)
        scored = [t for t in self.trials if sp.speed(t.row, stage) is not None and (stage is None or t.stage == stage)
                  and where(t) and (t.recipe.precision in allowed or t.recipe == self.default)]
        return max(scored, key=lambda t: (sp.speed(t.row, stage), -(t.row.get("compile_s") or 0.0)), default=None)

    def _on_gpu(self) -> bool:
        return self.session.device.type == "cuda"

    # -- measuring ---------------------------------------------------------------------------
    def _measure(self, recipe: Recipe, stage: str, *, warm: bool = False) -> Trial | None:
        """Measure one row unless it cannot run here, was measured in this stage already, or does
        not fit the budget; returns its trial (None when it was not measured)."""
        if self.stopped:
            self._skip(recipe, f"the search stopped: {self.stop_reason}", stage)
            return None
        done = self._tried(recipe, stage) if warm else self._tried(recipe)
        if done is not None:
            self.progress.finished(stage, sp.describe(recipe), done.row, None)
            return done
        if sp.uses_cuda_graphs(recipe) and not self._on_gpu():
            self._skip(recipe, "CUDA graphs need a CUDA device", stage)
            return None
        label = sp.describe(recipe)
        if not self.session.has_eager(recipe.precision):  # every row's reference, measured once: say so
            self.progress.started(stage, f"eager {recipe.precision} reference of the rows")
        eager, stop = self._within_budget(lambda: self.session.eager(recipe.precision)[1])
        if stop is not None:
            self._end_row(recipe, stage, label, {"status": "skipped", "reason": stop}, 0.0)
            return None
        if warm:  # compiled before in this search: its graphs come from the session's cache
            estimate = self.budget.estimate(Recipe.eager(recipe.precision)) + 0.25 * self.budget.compile_estimate(recipe)
        else:
            estimate = self.budget.estimate(recipe, accuracy_recompile=bool(eager and eager.uses_rng))
        if not self.budget.fits(estimate) and not (recipe.compiled and self.budget.first_compile_affordable(estimate)):
            left = max(0.0, self.budget.left)
            self._skip(recipe, f"estimated {estimate:.0f} s, {left:.0f} s of the budget left", stage)
            return None
        self.progress.started(stage, label)
        start = time.monotonic()
        row, stop = self._within_budget(lambda: self.session.measure(recipe, retime=warm))
        if stop is not None:
            row = {"status": "skipped", "reason": stop}
        if "BudgetExceeded" in str(row.get("reason") or ""):
            row.update(status="skipped", reason=row["reason"].split("BudgetExceeded: ", 1)[-1])
        if row.get("status") == "skipped" and "budget" in str(row.get("reason")):
            self.stopped = True
        wall = time.monotonic() - start
        self.budget.observe(recipe, row, wall, recompiled=bool(eager and eager.uses_rng and recipe.compiled and not warm))
        return self._end_row(recipe, stage, label, row, wall)

    def _within_budget(self, work: Callable[[], Any]) -> tuple[Any, str | None]:
        """`Budget.within`, the search stopped (and why) when it stops the work."""
        result, stop = self.budget.within(work)
        if stop is not None:
            self.stopped = True
            self.stop_reason = INTERRUPTED if stop.startswith(INTERRUPTED) else BUDGET_SPENT
            if self.stop_reason == INTERRUPTED:
                self.notes.append("interrupted (Ctrl-C): the rows measured before it are kept; the rest were not tried")
        return result, stop

    def _end_row(self, recipe: Recipe, stage: str, label: str, row: dict[str, Any], wall: float) -> Trial:
        trial = Trial(recipe, stage, row, wall)
        self.trials.append(trial)
        best = self.best()
        self.progress.finished(stage, label, row, sp.describe(best.recipe) if best else None)
        figures = f" {row['step_ms']:.3f} ms ({row['speedup_vs_eager_fp32']:.2f}x eager fp32)" if (
            row.get("step_ms") and row.get("speedup_vs_eager_fp32")) else ""
        compile_s = f", compile {row['compile_s']:.1f} s" if row.get("compile_s") else ""
        why = f": {row['reason']}" if row.get("reason") else ""
        self.log(f"[{stage}] {label}: {row['status']}{figures}{compile_s}{why}")
        return trial

    def _stage(self, name: str, recipes: list[Recipe], **kwargs: Any) -> list[Trial]:
        todo = [r for r in dict.fromkeys(recipes) if self._tried(r, name) is None]
        self.progress.planned(len(todo))
        return [t for r in todo if (t := self._measure(r, name, **kwargs)) is not None]

    # -- stages ------------------------------------------------------------------------------
    def _baseline(self) -> None:
        recipes = [Recipe.eager("fp32"), *(Recipe.eager(p) for p in self.space.precisions), self.default]
        self._stage("baseline", recipes)
        base = self._tried(self.default, "baseline")
        if base is not None and base.score is None:
            self.notes.append(f"the config's own recipe ({sp.describe(self.default)}) did not run: {base.row.get('reason')}")

    def _kinds(self) -> list[bool | None]:
        """The kinds of compile mode compared among themselves: with capture to come (GPU), modes
        without CUDA graphs only with each other (capture is what will give them graphs, so
        reduce-overhead beating them now says nothing yet) and modes with graphs likewise."""
        return [False, True] if self.space.cudagraphs and self._on_gpu() else [None]

    def _best_of_kind(self, kind: bool | None, precision: str | None = None) -> Trial | None:
        """The best of the mode candidates (whatever stage measured them: the config's own recipe
        may be one) of a kind, and of a precision."""
        modes = set(sp.mode_candidates(self.space, self.space.precisions))
        return self.best(where=lambda t: t.recipe in modes and (kind is None or (t.recipe.mode in sp.GRAPH_MODES) == kind)
                         and (precision is None or t.recipe.precision == precision))

    def _modes(self) -> list[Recipe]:
        """Measure the cheap modes at every allowed precision; drop the precisions, then the
        modes, that are clearly slower than the best of their kind; return the survivors."""
        self._stage("modes", sp.mode_candidates(self.space, self.space.precisions))
        kinds = self._kinds()
        live = []
        for precision in self.space.precisions:
            verdicts = []
            for kind in kinds:
                mine, best = self._best_of_kind(kind, precision), self._best_of_kind(kind)
                if mine is not None:
                    verdicts.append((sp.clearly_slower(mine.score, best.score), mine, best))
            if verdicts and all(slower for slower, _, _ in verdicts):
                _, mine, best = max(verdicts, key=lambda v: v[1].score)
                self.notes.append(f"precision {precision} dropped: its best ({sp.describe(mine.recipe)}, {mine.score:.2f}x "
                                  f"eager fp32) is clearly slower than {sp.describe(best.recipe)} ({best.score:.2f}x)")
            else:
                live.append(precision)
        survivors = []
        for precision in live:
            for mode in self.space.cheap_modes:
                trial = self._tried(Recipe(precision, mode, "inductor", "model"))
                if trial is None or trial.score is None:
                    continue
                kind = (mode in sp.GRAPH_MODES) if kinds != [None] else None
                best = self._best_of_kind(kind)
                if sp.clearly_slower(trial.score, best.score if best else None):
                    self.notes.append(f"{sp.describe(trial.recipe)} dropped from later stages: {trial.score:.2f}x "
                                      f"eager fp32, clearly slower than {sp.describe(best.recipe)} ({best.score:.2f}x)")
                    continue
                survivors.append(trial.recipe)
        self.live_precisions = live or list(self.space.precisions)
        return survivors

    def _variants(self, survivors: list[Recipe]) -> None:
        if not self._on_gpu() and self.space.cudagraphs:
            self.notes.append("whole-step capture and modes that record CUDA graphs were not searched: CPU run")
        if self.space.regional and not self.has_blocks:
            self.notes.append("regional compile was not searched: the model has no repeated blocks")
        for recipe in sp.variant_candidates(survivors, self.space, self.has_blocks, self._on_gpu(),
                                             self.live_precisions):
            self.progress.planned(1)
            reason = self._pruned(recipe)
            if reason:
                self._skip(recipe, reason, "capture/regional")
                continue
            self._measure(recipe, "capture/regional")

    def _pruned(self, recipe: Recipe) -> str | None:
        """Why a capture/regional variant cannot win, judged from its measured neighbours."""
        plain = self._tried(dataclasses.replace(recipe, cudagraphs=False, regional=False))
        captured = self._tried(dataclasses.replace(recipe, regional=False, cudagraphs=True))
        if recipe.regional and recipe.cudagraphs and captured is not None and plain is not None \
                and sp.clearly_slower(captured.score, plain.score):
            return (f"capture was clearly slower for {sp.describe(plain.recipe)} ({captured.score or 0:.2f}x vs "
                    f"{plain.score or 0:.2f}x eager fp32)")
        both = self._tried(dataclasses.replace(recipe, cudagraphs=True, regional=True))
        if recipe.regional and not recipe.cudagraphs and both is not None and captured is not None \
                and sp.clearly_slower(both.score, captured.score):
            return "regional compile was clearly slower than whole-model compile under capture"
        return None

    def _scopes(self) -> None:
        best = self.best()
        if best is None:
            return
        self._stage("scope", sp.scope_candidates(best.recipe, self.space))

    def _expensive(self) -> None:
        best = self.best()
        if best is None:
            return
        candidates = sp.expensive_candidates(best.recipe, self.space)
        if not candidates and self.space.expensive_modes and not best.recipe.compiled:
            self.notes.append("the autotuning modes were not tried: the best recipe is not compiled")
        self._stage("autotune-modes", candidates)

    def _confirm(self) -> str:
        finalists: list[Recipe] = []
        allowed = set(self.space.precisions)
        candidates = (t for t in self.trials if t.score is not None and t.recipe.precision in allowed)
        for trial in sorted(candidates, key=lambda t: -t.score):
            if trial.recipe not in finalists:
                finalists.append(trial.recipe)
            if len(finalists) == 2:
                break
        if self.default not in finalists:
            finalists.insert(0, self.default)
        if not self.opts.confirm or len(finalists) < 2:
            return "search"
        session_steps = self.session.opts.steps
        self.session.opts.steps = session_steps * 2
        try:
            trials = self._stage("confirm", finalists, warm=True)
        finally:
            self.session.opts.steps = session_steps
        return "confirm" if len(trials) == len(finalists) and all(t.score is not None for t in trials) else "search"

    # -- the search ----------------------------------------------------------------------------
    def run(self) -> TuneResult:
        o = self.opts
        recipes = [self.default, Recipe("fp32", cudagraphs=self.space.cudagraphs and self._device().type == "cuda")]
        bench = CompileBenchOptions(cfg=o.cfg, recipes=recipes, steps=o.steps, warmup=o.warmup,
                                    accuracy_steps=o.accuracy_steps, fresh_cache=False)
        with self.session_factory(bench, self.log) as session:
            self.session = session
            self.budget = Budget(o.budget_s, session.device.type)
            self._baseline()
            survivors = self._modes()
            self._variants(survivors)
            self._scopes()
            self._expensive()
            decided_on = self._confirm()
        return self._result(decided_on)

    def _device(self):
        return resolve_device(self.opts.cfg.training.device)

    def _round_to_round(self) -> None:
        """Flag a confirm row whose median moved more than DRIFT_LIMIT from the same recipe's
        search-stage median: the machine changed under the measurements, so they cannot rank."""
        for trial in (t for t in self.trials if t.stage == "confirm"):
            first = next((t for t in self.trials if t.recipe == trial.recipe and t.stage != "confirm"), None)
            if first is None:
                continue
            moved = ratios.drift(first.row.get("step_ms"), trial.row.get("step_ms"))
            if moved is not None and moved > ratios.DRIFT_LIMIT:
                flag = (f"round to round: {first.row['step_ms']:.4g} ms in stage {first.stage}, "
                        f"{trial.row['step_ms']:.4g} ms in confirm ({moved:.0%} apart, limit {ratios.DRIFT_LIMIT:.0%})")
                trial.row["flags"] = "; ".join(f for f in (trial.row.get("flags"), flag) if f)
                trial.row["noisy"] = True

    def _result(self, decided_on: str) -> TuneResult:
        """The winner: the best row of the deciding stage, if it beats the config's own recipe by
        MIN_GAIN on the same comparison the table shows (`versus_default`) and neither row is too
        noisy to rank; else the config's own recipe."""
        self._round_to_round()
        stage = "confirm" if decided_on == "confirm" else None
        default = self._tried(self.default, stage) or self._tried(self.default)
        # Decided on the search rows: confirm rows (if some ran) are not compared with search rows.
        best = self.best(stage, where=lambda t: stage == "confirm" or t.stage != "confirm")
        winner = default.recipe if default is not None else self.default
        winner_trial = default
        gain = versus_default(self.trials, best, self.default, default) if best is not None else None
        noisy = best is not None and default is not None and not self.opts.rank_noisy \
            and bool(best.row.get("noisy") or default.row.get("noisy"))
        if best is not None and best.recipe != self.default and gain is not None and gain >= 1 + sp.MIN_GAIN \
                and noisy:
            self.notes.append(f"{sp.describe(best.recipe)} measured {gain:.2f}x the config's own recipe, but the rows "
                              "are too noisy to rank (see their flags); keeping the config's own recipe: rerun on a "
                              "quieter machine, or pass --rank-noisy")
        elif best is not None and (gain is None or gain >= 1 + sp.MIN_GAIN):
            winner, winner_trial = best.recipe, best
        elif best is not None and best.recipe != self.default:
            self.notes.append(f"no recipe measured {sp.MIN_GAIN:.0%} faster than the config's own (the best, "
                              f"{sp.describe(best.recipe)}, {gain:.3f}x); keeping it")
        if winner.precision != self.default.precision:
            self.notes.append(f"the winner runs in {winner.precision} where the config used {self.default.precision}: "
                              "it passed the accuracy check over the first steps; compare a real run's loss curve too")
        return TuneResult(self.trials, self.default, winner, winner_trial, default, self.not_tried, self.notes,
                          decided_on, self.budget.elapsed, self.stopped, self.stop_reason if self.stopped else None)
