"""What the row kinds of `kiln bench train-llm` (kiln's recipes and the peers: the plain loop,
torchtitan) are given and give back: `TrainContext`, set up once per call (device, data, initial
weights, peaks); `RowRun`, one row's request in that context; `TrainRow`, one row's figures, whose
`to_json()` is the row of results.json (kiln.bench.typed_row)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kiln.bench.formulas import within_relative
from kiln.bench.train_llm.llm_train_bench import RowSpec, TrainLlmOptions, figures
from kiln.bench.train_llm.llm_train_data import Corpus, Vocab
from kiln.bench.train_llm.llm_train_request import LOSS_TAIL
from kiln.bench.typed_row import UNSET, JsonRow


@dataclass
class TrainRow(JsonRow):
    """One row of `kiln bench train-llm`, its fields in results.json's order."""

    row: str
    kind: str
    status: str = "ok"
    """ok, oom, error or skipped."""
    reason: str | None = None
    params: int | None = UNSET
    config: dict[str, Any] | None = UNSET
    """The row's exact config: kiln's resolved config, the plain loop's, torchtitan's job."""
    overrides: list[str] = UNSET
    """A kiln recipe's overrides on the bench's base config, or a --peer-recipe row's settings of its peer."""
    step_ms: float = UNSET
    step_ms_p10: float = UNSET
    step_ms_p90: float = UNSET
    timed_steps: int = UNSET
    tokens_per_s: float = UNSET
    """In all, over every rank."""
    tokens_per_s_per_gpu: float = UNSET
    tflops: float = UNSET
    """Per GPU."""
    mfu_spec: float | None = UNSET
    mfu_matmul: float | None = UNSET
    first_step_s: float = UNSET
    losses: list[float] = UNSET
    loss_first: float = UNSET
    loss_last: float = UNSET
    loss_tail: float = UNSET
    """The mean loss of the last LOSS_TAIL steps (all of them, if fewer): what `compare` checks."""
    peak_mem_bytes: int | None = UNSET
    peak_reserved_bytes: int = UNSET
    nproc: int = UNSET
    """Ranks the row ran on (set when more than one)."""
    memory_plan: dict[str, Any] | None = UNSET
    """A kiln row's memory plan as its summary.json keeps it (None: the run wrote none)."""
    plan_bytes: int | None = UNSET
    """The plan's peak per rank, read from memory_plan, beside the measured peak_mem_bytes."""
    applied_strategy: str | None = UNSET
    """The strategy a launched kiln row ran (its summary.json)."""
    peer: dict[str, Any] | None = UNSET
    """What a peer's process reported of itself (version, vocabulary, its model's size)."""
    wall_s: float | None = UNSET
    log: str | None = UNSET
    """A peer process's output file."""
    tokens_match: bool = UNSET
    """Whether a peer's own dataloader's first batch equals the bench's."""
    speedup_vs_ref: float = UNSET
    loss_diff_vs_ref: float = UNSET
    """loss_last minus the reference row's."""
    loss_tail_diff_vs_ref: float = UNSET
    """loss_tail minus the reference row's."""
    loss_check: str = UNSET
    """ok where loss_tail is within the call's relative tolerance of the reference row's, else off."""
    ref: str = UNSET


@dataclass
class TrainContext:
    """What every row of one call shares, set up before the first row."""

    device: torch.device
    data_dir: Path
    corpus: Corpus
    vocab: Vocab
    weights_dir: Path
    """The Hugging Face directory of the initial weights every row starts from."""
    tokens_per_step: int
    """The global batch's tokens: nproc x batch x seq_len."""
    flops_per_token: int
    spec: float | None
    """The GPU's datasheet peak at the rows' precision (None: none known)."""
    spec_source: str
    matmul: float
    """The best matmul FLOP/s measured before the rows."""
    base_overrides: list[str]
    """The config every kiln row starts from (kiln.bench.train_llm.llm_train_bench.base_overrides)."""
    nproc: int = 1
    rows_dir: Path | None = None
    """Where launched rows write (run dirs, job files); None at one rank."""
    rank_files: tuple[Path, Path] | None = None
    """inputs.npy and labels.npy that launched rows read (llm_train_data.write_rank_files)."""
    elapsed_s: float | None = None
    matmul_end: float | None = None
    """The best matmul FLOP/s measured after the rows (None until the call ends)."""


@dataclass(frozen=True)
class RowRun:
    """One row's request: its spec, the call's options and context, the batches every row trains on."""

    spec: RowSpec
    opts: TrainLlmOptions
    ctx: TrainContext
    batches: list[tuple[Tensor, Tensor]]
    deadline_left_s: float | None
    """Seconds left of --deadline-s when the row starts (None: no deadline)."""


def set_figures(row: TrainRow, step_s: list[float], ctx: TrainContext, warmup: int) -> None:
    """`row`'s step figures (kiln.bench.train_llm.llm_train_bench.figures) from its per-step seconds."""
    for key, value in figures(step_s, warmup, ctx.tokens_per_step, ctx.flops_per_token, ctx.spec, ctx.matmul,
                              ctx.nproc).items():
        setattr(row, key, value)

def tail_mean(losses: list[float], n: int = LOSS_TAIL) -> float:
    """The mean of the last `n` losses (all of them, if fewer)."""
    tail = losses[-n:]
    return sum(tail) / len(tail)


def compare(rows: list[TrainRow], baseline: str | None, tol: float) -> None:
    """Speed and final losses of every row against the reference row: `baseline` if named, else
    the plain loop, else the first row that ran. The loss check compares the mean of the last
    LOSS_TAIL steps (a row without per-step losses: its last loss)."""
    ok = [r for r in rows if r.status == "ok" and r.get("tokens_per_s")]
    if baseline is not None:
        ref = next((r for r in ok if r.row == baseline), None)
    else:
        ref = next((r for r in ok if r.kind == "plain"), None) or (ok[0] if ok else None)
    if ref is None:
        return
    for r in ok:
        if r.get("losses"):
            r.loss_tail = tail_mean(r.losses)
    for r in ok:
        r.speedup_vs_ref = r.tokens_per_s / ref.tokens_per_s
        if r.get("loss_last") is not None and ref.get("loss_last") is not None:
            r.loss_diff_vs_ref = r.loss_last - ref.loss_last
            mine, theirs = r.get("loss_tail") or r.loss_last, ref.get("loss_tail") or ref.loss_last
            r.loss_tail_diff_vs_ref = mine - theirs
            r.loss_check = "ok" if within_relative(mine, theirs, tol) else "off"
        r.ref = ref.row
