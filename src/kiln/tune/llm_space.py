"""What `kiln autotune` searches for an LLM (a `llama:` model): batch size, activation
checkpointing, the precision policy (bf16 autocast or bf16 weights with fp32 masters), float8,
the cross-entropy kernel and the compile scope, as config keys.

A candidate is a set of values of those knobs; `overrides` turns it into `KEY=VALUE` strings on
the config, so every row the search measures is a setting `kiln train` runs. Rows are ranked by
tokens per second (the batch size changes between candidates, so step time alone says nothing),
and a change of numerics (precision policy, float8) must keep the loss after the measured steps
within a tolerance of the same candidate without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args

from kiln.bench.formulas import within_relative
from kiln.config.schema import Config, Float8
from kiln.tune.space import MIN_GAIN

AC_MODES = ("none", "selective", "full")
FLOAT8 = get_args(Float8)
CE_KERNELS = ("chunked", "liger", "plain", "triton")
COMPILE_SCOPES = ("regional", "whole", "model+loss", "off")
"""regional: each block compiled (compile.regional); whole: the model in one graph; model+loss: the
model and its loss compiled together; off: eager."""
PRECISIONS = ("bf16-mixed", "bf16-master", "bf16-true")
"""precision.policy values an LLM search may try (kiln.precision)."""
KNOBS = ("batch", "ac", "ce", "precision", "float8", "compile")


@dataclass(frozen=True)
class LlmCandidate:
    batch: int
    ac: str
    ce: str
    float8: str
    compile: str
    precision: str | None = None
    """precision.policy; None: the config's own (one the search does not move, e.g. fp32)."""

    def overrides(self) -> list[str]:
        compiled = self.compile != "off"
        scope = "model+loss" if self.compile == "model+loss" else "model"
        return [f"data.batch_size={self.batch}", f"training.activation_checkpointing={self.ac}",
                f"training.ce_kernel={self.ce}", f"precision.float8={self.float8}",
                f"compile.enabled={str(compiled).lower()}", f"compile.regional={str(self.compile == 'regional').lower()}",
                f"compile.scope={scope}"] + ([f"precision.policy={self.precision}"] if self.precision else [])

    def describe(self) -> str:
        return (f"b{self.batch} ac={self.ac} ce={self.ce} fp8={self.float8} compile={self.compile}"
                + (f" {self.precision}" if self.precision else ""))

    def with_(self, **changes: Any) -> LlmCandidate:
        return dataclasses.replace(self, **changes)


def from_config(cfg: Config) -> LlmCandidate:
    """The candidate a config runs as it is (the one every other must beat). `auto` cross-entropy
    is chunked for kiln's decoder."""
    c = cfg.compile
    if not c.enabled:
        scope = "off"
    elif c.scope == "model+loss":
        scope = "model+loss"
    else:
        scope = "regional" if c.regional else "whole"
    ce = "chunked" if cfg.training.ce_kernel == "auto" else cfg.training.ce_kernel
    policy = cfg.precision.policy if cfg.precision.policy in PRECISIONS else None
    return LlmCandidate(cfg.data.batch_size, cfg.training.activation_checkpointing, ce, cfg.precision.float8, scope,
                        policy)


@dataclass
class LlmSpace:
    """The values the user allows (flags) on this device."""

    batches: list[int]
    ac: list[str] = field(default_factory=lambda: list(AC_MODES))
    ce: list[str] = field(default_factory=lambda: list(CE_KERNELS))
    float8: list[str] = field(default_factory=lambda: list(FLOAT8))
    compile: list[str] = field(default_factory=lambda: ["regional", "whole"])
    precision: list[str] = field(default_factory=list)
    """precision.policy values to try besides the config's (empty: the config's only)."""


def default_batches(batch: int) -> list[int]:
    """The config's batch, half of it and up to four times it."""
    return sorted({max(1, batch // 2), batch, batch * 2, batch * 4})


def stage_candidates(knob: str, best: LlmCandidate, space: LlmSpace) -> list[LlmCandidate]:
    """The best candidate so far with one knob moved to each other allowed value (batches: larger
    ones first in ascending order, then smaller; the search stops climbing at the first that does
    not fit or is slower)."""
    if knob == "batch":
        larger = sorted(b for b in space.batches if b > best.batch)
        smaller = sorted((b for b in space.batches if b < best.batch), reverse=True)
        return [best.with_(batch=b) for b in larger + smaller]
    values = {"ac": space.ac, "ce": space.ce, "float8": space.float8, "compile": space.compile,
              "precision": space.precision}[knob]
    return [best.with_(**{knob: v}) for v in values if v != getattr(best, knob)]


def tokens_per_s(row: dict[str, Any] | None) -> float | None:
    if not row or row.get("status") != "ok" or row.get("accuracy") == "fail":
        return None
    return row.get("tokens_per_s")


def better(row: dict[str, Any] | None, best: dict[str, Any] | None, margin: float = MIN_GAIN) -> bool:
    """`row` is faster than `best` by more than the margin (a row that did not run never is)."""
    mine, theirs = tokens_per_s(row), tokens_per_s(best)
    if mine is None:
        return False
    return theirs is None or mine > theirs * (1 + margin)


def loss_check(row: dict[str, Any], reference: dict[str, Any] | None, tol: float) -> str | None:
    """`pass`/`fail` for a row whose numerics differ from `reference` (the same candidate with the
    previous precision policy, or without float8): the last loss within `tol` (relative); None
    when there is nothing to compare."""
    if reference is None or reference.get("loss_last") is None or row.get("loss_last") is None:
        return None
    return "pass" if within_relative(row["loss_last"], reference["loss_last"], tol) else "fail"
