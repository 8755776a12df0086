"""`kiln autotune` for an LLM: measure candidates knob by knob within a time budget, keep the one
with the most tokens per second that trains the same (kiln.tune.llm_space).

After the baseline (the config's own settings), the stages of STAGES in that order, each on the
best candidate so far (a change is kept only when it is MIN_GAIN faster):
- precision: the other allowed precision policies (bf16-master: bf16 weights, fp32 masters in a
  fused AdamW), accepted only if the loss after the measured steps stays within `loss_tol` of
  the same candidate under the previous policy;
- compile: the compile scopes (regional, whole model, model + loss);
- ce: the cross-entropy kernels (chunked, liger, plain);
- ac: activation checkpointing (none, selective, full);
- batch: larger batch sizes in ascending order until one does not fit or is not faster (a batch
  that runs out of memory without checkpointing is tried once more with selective
  checkpointing), then smaller ones;
- float8: tensorwise and rowwise (a GPU with float8 tensor cores), accepted likewise against the
  same candidate without float8.
Every candidate trains `warmup + steps + 1` steps from the config's initial weights on the same
tokens (a synthetic language of the model's vocabulary, kiln.bench.train_llm.llm_train_data), built by
kiln train's own path (kiln.bench.train_llm.llm_train_kiln.kiln_step); the figure is the median step after
the warm-up. What does not fit the remaining budget, or cannot run here, is listed as not tried.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from kiln.bench.train_llm import llm_train_data as data
from kiln.bench.train_llm import llm_train_rows as rows
from kiln.bench.train_llm.llm_train_kiln import kiln_step
from kiln.config.load import apply_override
from kiln.config.schema import Config
from kiln.config.validate import validate
from kiln.models.llama import DEFAULT_SEQ_LEN, llama_source
from kiln.runtime import resolve_device
from kiln.timing import Timing
from kiln.tune import llm_space as sp
from kiln.tune.budget import BUDGET_SPENT, INTERRUPTED, Budget

Stage = Literal["precision", "compile", "ce", "ac", "batch", "float8"]
# The large levers first (precision and compile), so a budget that runs out leaves the small
# ones untried, not them (docs/guide/llm.md; the CPU run that showed it: tests/tune/test_llm_search.py).
STAGES: tuple[Stage, ...] = ("precision", "compile", "ce", "ac", "batch", "float8")
StageRun = Callable[[Stage, "LlmTrial | None"], "LlmTrial | None"]
PRIOR_S = {"cuda": 90.0, "cpu": 30.0}
"""Cost of a first candidate before any was measured: a compile and a few steps."""


@dataclass
class LlmTuneOptions:
    cfg: Config
    space: sp.LlmSpace
    budget_s: float
    steps: int = 20
    """Timed steps per candidate (after `warmup` steps and the first, compiling one)."""
    warmup: int = 3
    loss_tol: float = 0.02
    """Relative difference of the last loss a precision or float8 candidate may have from its twin
    under the numerics it replaces."""


@dataclass
class LlmTrial:
    candidate: sp.LlmCandidate
    stage: str
    row: dict[str, Any]


@dataclass
class LlmTuneResult:
    trials: list[LlmTrial]
    default: sp.LlmCandidate
    winner: sp.LlmCandidate
    not_tried: list[dict[str, str]]
    notes: list[str]
    elapsed_s: float
    stopped_early: bool = False
    stop_reason: str | None = None
    """Why the search stopped early (the budget, or Ctrl-C), None when it ran through."""
    extra: dict[str, Any] = field(default_factory=dict)

    def trial(self, candidate: sp.LlmCandidate) -> LlmTrial | None:
        return next((t for t in self.trials if t.candidate == candidate and sp.tokens_per_s(t.row)), None)

    @property
    def speedup_vs_default(self) -> float | None:
        win, base = self.trial(self.winner), self.trial(self.default)
        if win is None or base is None:
            return None
        return win.row["tokens_per_s"] / base.row["tokens_per_s"]


def configure(cfg: Config, candidate: sp.LlmCandidate) -> Config:
    """The config with the candidate's keys (validated as `kiln train` would)."""
    out = copy.deepcopy(cfg)
    for item in candidate.overrides():
        apply_override(out, item)
    validate(out)
    return out


class TokenMeasure:
    """Measures a candidate by training it on the synthetic language (one stream for all)."""

    def __init__(self, opts: LlmTuneOptions):
        self.opts = opts
        self.device = resolve_device(opts.cfg.training.device)
        config = llama_source(opts.cfg.model.name.split(":", 1)[1], dict(opts.cfg.model.kwargs)).config
        size = config.vocab_size
        # The run's sequence length: data.seq_len, else the model's default (as kiln train takes it).
        self.seq_len = opts.cfg.data.seq_len or min(DEFAULT_SEQ_LEN, config.max_positions)
        self.n_steps = opts.warmup + opts.steps + 1
        vocab = data.Vocab(size, size - 2, size - 1)
        need = data.stream_tokens_needed(self.n_steps, max(opts.space.batches), self.seq_len)
        self.stream = data.language_ids(need, vocab, seed=opts.cfg.training.seed).astype("uint32")

    def __call__(self, candidate: sp.LlmCandidate) -> dict[str, Any]:
        cfg = configure(self.opts.cfg, candidate)
        cfg.training.steps = max(cfg.training.steps, self.n_steps, cfg.optim.warmup_steps)
        batches = data.batches(self.stream, steps=self.n_steps, batch=candidate.batch, seq_len=self.seq_len,
                               device=self.device)
        result = rows.measure_row(lambda stack: kiln_step(cfg, stack), batches, self.device)
        row: dict[str, Any] = {"status": result["status"], "reason": result["reason"]}
        if result["reason"] and result["reason"].startswith("ConfigError"):
            row.update(status="skipped", reason=result["reason"].split(": ", 1)[1])  # cannot run here
        run = result["run"]
        if run is not None:
            timed = run.step_s[max(0, self.opts.warmup - 1):] or run.step_s
            median = Timing(tuple(timed)).median_s
            row.update(step_ms=median * 1e3, tokens_per_s=candidate.batch * self.seq_len / median,
                       peak_mem_bytes=run.peak_mem_bytes, first_step_s=run.first_step_s, loss_last=run.losses[-1])
        return row


class LlmSearch:
    def __init__(self, opts: LlmTuneOptions, *, measure: Callable[[sp.LlmCandidate], dict[str, Any]] | None = None,
                 log: Callable[[str], None] | None = None, device_type: str | None = None):
        """`measure(candidate) -> row` (default: TokenMeasure; tests pass a stand-in)."""
        self.opts = opts
        self.measure = measure
        self.log = log or (lambda message: None)
        self.device_type = device_type
        self.default = sp.from_config(opts.cfg)
        self.trials: list[LlmTrial] = []
        self.not_tried: list[dict[str, str]] = []
        self.notes: list[str] = []
        self.stopped = False
        self.stop_reason = BUDGET_SPENT
        self._walls: dict[str, float] = {}
        self.budget = Budget(opts.budget_s, device_type or "cpu")

    # -- bookkeeping -------------------------------------------------------------------------
    def _done(self, candidate: sp.LlmCandidate) -> LlmTrial | None:
        return next((t for t in self.trials if t.candidate == candidate), None)

    def _skip(self, candidate: sp.LlmCandidate, stage: str, reason: str) -> None:
        if self._done(candidate) is None and not any(n["candidate"] == candidate.describe() for n in self.not_tried):
            self.not_tried.append({"candidate": candidate.describe(), "stage": stage, "reason": reason})

    def _estimate(self, candidate: sp.LlmCandidate) -> float:
        """The longest measured row of the same compile scope (else of any, else the prior),
        scaled by the batch: rows compile once and then run their steps."""
        seen = self._walls.get(candidate.compile) or max(self._walls.values(), default=0.0)
        if not seen:
            return PRIOR_S.get(self.device_type or "cpu", 30.0)
        return seen * max(1.0, candidate.batch / max(1, self.default.batch)) ** 0.5

    def _measure(self, candidate: sp.LlmCandidate, stage: str, *, first: bool = False) -> LlmTrial | None:
        done = self._done(candidate)
        if done is not None:
            return done
        if self.stopped:
            self._skip(candidate, stage, f"the search stopped: {self.stop_reason}")
            return None
        estimate = self._estimate(candidate)
        if not first and not self.budget.fits(estimate):
            self._skip(candidate, stage, f"estimated {estimate:.0f} s, {max(0.0, self.budget.left):.0f} s of the "
                                         "budget left")
            return None
        start = time.monotonic()
        self.log(f"[{stage}] {candidate.describe()}: measuring ({self.budget.elapsed:.0f} s of "
                 f"{self.budget.seconds:.0f} s spent)")  # a row can take minutes: never silent, piped too
        row, stop = self.budget.within(lambda: self.measure(candidate))
        if stop is not None:  # the budget's end or Ctrl-C: the rows measured stay, the rest are not tried
            row = {"status": "skipped", "reason": stop}
            self.stopped = True
            self.stop_reason = INTERRUPTED if stop.startswith(INTERRUPTED) else BUDGET_SPENT
        wall = time.monotonic() - start
        row["wall_s"] = wall
        if row.get("status") == "ok":
            self._walls[candidate.compile] = max(wall, self._walls.get(candidate.compile, 0.0))
        trial = LlmTrial(candidate, stage, row)
        self.trials.append(trial)
        figures = f" {row['tokens_per_s']:,.0f} tok/s" if row.get("tokens_per_s") else ""
        self.log(f"[{stage}] {candidate.describe()}: {row['status']}{figures}"
                 + (f": {row['reason']}" if row.get("reason") else ""))
        return trial

    # -- the search ----------------------------------------------------------------------------
    def run(self) -> LlmTuneResult:
        if self.measure is None:
            measure = TokenMeasure(self.opts)
            self.measure, self.device_type = measure, measure.device.type
            self.budget.device_type = self.device_type
        best = self._measure(self.default, "baseline", first=True)
        if best is None or sp.tokens_per_s(best.row) is None:
            self.notes.append(f"the config's own settings did not run: {best.row.get('reason') if best else '?'}")
        runs = self._stage_runs()
        for stage in STAGES:
            best = runs[stage](stage, best)
        winner = best.candidate if best is not None and sp.tokens_per_s(best.row) else self.default
        return LlmTuneResult(self.trials, self.default, winner, self.not_tried, self.notes, self.budget.elapsed,
                             self.stopped, self.stop_reason if self.stopped else None)

    def _stage_runs(self) -> dict[Stage, StageRun]:
        """How each stage searches: one knob at a time, or with a loss check, or climbing batches."""
        return {"precision": self._stage_precision, "compile": self._stage, "ce": self._stage, "ac": self._stage,
                "batch": self._stage_batch, "float8": self._stage_float8}

    def _stage(self, stage: str, best: LlmTrial | None) -> LlmTrial | None:
        if best is None:
            return None
        for candidate in sp.stage_candidates(stage, best.candidate, self.opts.space):
            trial = self._measure(candidate, stage)
            if trial is not None and sp.better(trial.row, best.row):
                best = trial
        return best

    def _stage_precision(self, stage: str, best: LlmTrial | None) -> LlmTrial | None:
        return self._numerics(stage, best, best.candidate.precision if best is not None else "")

    def _stage_float8(self, stage: str, best: LlmTrial | None) -> LlmTrial | None:
        if best is None or best.candidate.float8 != "none":
            return best
        return self._numerics(stage, best, "bf16 without float8")

    def _numerics(self, stage: str, best: LlmTrial | None, what: str) -> LlmTrial | None:
        """A stage whose candidates change the numerics: each must keep the loss of `best`."""
        if best is None:
            return best
        reference = best
        for candidate in sp.stage_candidates(stage, best.candidate, self.opts.space):
            trial = self._measure(candidate, stage)
            if trial is None:
                continue
            check = sp.loss_check(trial.row, reference.row, self.opts.loss_tol)
            trial.row["accuracy"] = check
            if check == "fail":
                self.notes.append(f"{candidate.describe()}: loss {trial.row['loss_last']:.4f} after the measured "
                                  f"steps, {reference.row['loss_last']:.4f} with {what}: outside {self.opts.loss_tol:.0%}")
            if sp.better(trial.row, best.row):
                best = trial
        return best

    def _stage_batch(self, stage: str, best: LlmTrial | None) -> LlmTrial | None:
        if best is None:
            return None
        start = best.candidate
        climbing = True
        for candidate in sp.stage_candidates(stage, start, self.opts.space):
            if candidate.batch > start.batch and not climbing:
                self._skip(candidate, stage, "a smaller batch already did not fit or was not faster")
                continue
            if candidate.batch < start.batch and sp.tokens_per_s(best.row) and best.candidate.batch > start.batch:
                self._skip(candidate, stage, "a larger batch was faster")
                continue
            trial = self._measure(candidate, stage)
            if trial is not None and trial.row.get("status") == "oom" and candidate.ac == "none" \
                    and "selective" in self.opts.space.ac:
                trial = self._measure(candidate.with_(ac="selective"), stage)
            if trial is not None and sp.better(trial.row, best.row):
                best = trial
            elif candidate.batch > start.batch:
                climbing = False
        return best
